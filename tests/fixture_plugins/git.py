"""Git on loopback: the test git server, repositories of the test programs, and GitHub's
app-token endpoint in front of them.

Session scope
-------------

``git_server`` -> ``GitServer``: a loopback HTTP git server (``git http-backend``) checking
HTTP basic auth. It accepts two kinds of credentials:

    git_server.username / git_server.password   user name and password (user "pkobatch")
    git_server.token                            a token: accepted as the password of any user
                                                name, e.g. "git" as PKO's ``gitAuth.accessToken``
                                                (and the runner) send it
    git_server.requests                         every request received: ``GitRequest(path,
                                                authorization)`` (whether credentials came)

It is plain http on loopback, so pkobatch sends it credentials only with the opt-in
``PKOBATCH_INSECURE_HTTP_GIT_HOSTS=127.0.0.1`` (tests/helpers/controller_harness.py sets it).

``github_app`` -> ``GitHubAppServer`` (tests/helpers/github_app_server.py).

Function scope
--------------
``git_repo``   factory ``git_repo(program="files", *, name=None) -> GitRepo``: a real git
               repository holding ``tests/fixtures/programs/<program>`` (variants are overlaid
               on ``files``), with ``.file_url``, ``.http_url`` (needs the git server's
               credentials or token), ``.commit``, ``.branch`` and
               ``.update(files, message) -> sha``.
``program_dir`` factory ``program_dir(name) -> Path``: a writable copy of a test program.

-------------------------------------------
``files``: Python program with a ``pulumi.dynamic`` provider managing local files.
Config ``directory`` (required; where the files go), ``files`` (count, default 2),
``content`` (default "hello"), ``sleepSeconds`` (create/update sleep, default 0),
``holdUntil`` (a path: create/update wait until it exists, at most 10 minutes),
``outputCount`` (extra outputs ``out0``..; default 0), secret ``token`` (default
"default-secret-token"). Outputs ``directory``, ``paths``, ``contents`` and the secret output
``token``. ``sleep`` (sleepSeconds defaults to 600), ``many-outputs`` (outputCount defaults to
300) and ``syntax-error`` are variants.

``yaml``: a YAML program, no provider. Config ``greeting`` (default "hello"), ``count``
(default 2), ``token`` (default "default-secret-token"). Outputs ``message`` ("<greeting> from
YAML"), ``count``, ``greetings`` (["<greeting> 1", "<greeting> 2"]) and the secret ``token``.

``k8s-yaml`` and ``k8s-python``: the same Kubernetes objects through the Kubernetes provider
(YAML; Python with ``pulumi_kubernetes`` from its requirements.txt). Config ``namespace``
(required), ``app`` (default "guestbook"), ``message`` (default "hello"). They create
ConfigMap ``<app>-settings`` (data ``message``) and Deployment ``<app>`` (skipAwait: no
Deployment controller runs here), both labelled ``app.kubernetes.io/name: <app>`` and
``pkobatch.io/test-program: <program>``. Outputs ``configMap``, ``deployment``, ``message``.

``nodejs``: a Node.js program (``runtime: nodejs``), for machines without its language host.

``forge-result``: a Python program that, with its run's ServiceAccount, writes a forged
result for another Stack's run: config ``configMap`` (the ConfigMap's JSON) and
``namespace``; output ``forged`` (the ConfigMap's name).
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.sentinels import register

from fixture_plugins.tools import in_ci

PROGRAMS = Path(__file__).parents[1] / "fixtures" / "programs"
BASE_PROGRAM = "files"


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {
        **os.environ,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "pkobatch tests",
        "GIT_AUTHOR_EMAIL": "tests@pkobatch.invalid",
        "GIT_COMMITTER_NAME": "pkobatch tests",
        "GIT_COMMITTER_EMAIL": "tests@pkobatch.invalid",
    }
    result = subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    )
    return result.stdout.strip()


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                handler.rfile.readline()
                return body
            body += handler.rfile.read(size)
            handler.rfile.readline()
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


class GitHandler(BaseHTTPRequestHandler):
    """Smart-HTTP git through the ``git http-backend`` CGI, after a basic-auth check."""

    server: GitHttpServer

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _basic_credentials(self) -> tuple[str, str] | None:
        """The username and password of the request's Basic Authorization header."""
        scheme, _, encoded = (self.headers.get("Authorization") or "").partition(" ")
        if scheme != "Basic":
            return None
        try:
            username, _, password = base64.b64decode(encoded).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return username, password

    def _authenticated_user(self) -> str | None:
        credentials = self._basic_credentials()
        if credentials is None:
            return None
        username, password = credentials
        server = self.server
        if server.token is not None and secrets.compare_digest(password, server.token):
            return username
        if username == server.username and secrets.compare_digest(password, server.password):
            return username
        return None

    def _serve(self) -> None:
        self.server.requests.append(
            GitRequest(self.path.partition("?")[0], "Authorization" in self.headers)
        )
        user = self._authenticated_user()
        if user is None:
            self.send_response(HTTPStatus.UNAUTHORIZED)
            self.send_header("WWW-Authenticate", 'Basic realm="pkobatch-tests"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, _, query = self.path.partition("?")
        body = _read_body(self) if self.command == "POST" else b""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.server.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GATEWAY_INTERFACE": "CGI/1.1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": user,
            "REMOTE_ADDR": self.client_address[0],
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
        }
        result = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
        )
        head, separator, payload = result.stdout.partition(b"\r\n\r\n")
        if not separator:
            head, _, payload = result.stdout.partition(b"\n\n")
        status = 200
        headers: list[tuple[str, str]] = []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class GitHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, username: str, password: str, token: str | None = None) -> None:
        super().__init__(("127.0.0.1", 0), GitHandler)
        self.root = root
        self.username = username
        self.password = password
        self.token = token
        self.requests: list[GitRequest] = []


@dataclass(frozen=True)
class GitRequest:
    """One request the test git server received: its path, and whether it carried
    credentials (an ``Authorization`` header)."""

    path: str
    authorization: bool


@dataclass
class GitServer:
    root: Path
    username: str
    password: str
    token: str
    port: int
    # Every request received, in order (shared by all tests: filter by repository path).
    requests: list[GitRequest]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="session")
def git_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitServer]:
    if shutil.which("git") is None:
        message = "git is not installed"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    root = tmp_path_factory.mktemp("git")
    token = register(f"tok-{secrets.token_urlsafe(16)}", "git-token")
    password = register(secrets.token_urlsafe(12), "git-password")
    server = GitHttpServer(root, "pkobatch", password, token)
    thread = threading.Thread(target=server.serve_forever, name="git-http", daemon=True)
    thread.start()
    yield GitServer(
        root,
        server.username,
        server.password,
        token,
        int(server.server_address[1]),
        server.requests,
    )
    server.shutdown()
    server.server_close()


@dataclass
class GitRepo:
    name: str
    bare: Path
    worktree: Path
    server: GitServer
    branch: str = "main"
    commit: str = ""

    @property
    def file_url(self) -> str:
        return self.bare.as_uri()

    @property
    def http_url(self) -> str:
        return f"{self.server.url}/{self.bare.name}"

    def update(self, files: dict[str, str], message: str = "update") -> str:
        """Write ``files`` (path -> content), commit, push; the new commit."""
        for relative, content in files.items():
            target = self.worktree / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        _git("add", "-A", cwd=self.worktree)
        _git("commit", "-q", "-m", message, cwd=self.worktree)
        _git("push", "-q", str(self.bare), f"HEAD:{self.branch}", cwd=self.worktree)
        self.commit = _git("rev-parse", "HEAD", cwd=self.worktree)
        return self.commit


def _is_variant(name: str) -> bool:
    """A Python program without a ``__main__.py`` of its own shares the base program's."""
    project = yaml.safe_load((PROGRAMS / name / "Pulumi.yaml").read_text())
    runtime = project.get("runtime")
    runtime_name = runtime.get("name") if isinstance(runtime, dict) else runtime
    return runtime_name == "python" and not (PROGRAMS / name / "__main__.py").is_file()


def copy_program(name: str, destination: Path) -> Path:
    """A test program: variants (see ``_is_variant``) are their own files overlaid on the base
    program; every other program is copied as it is."""
    if not (PROGRAMS / name).is_dir():
        raise ValueError(f"no test program {name!r} in {PROGRAMS}")
    if name == BASE_PROGRAM or _is_variant(name):
        shutil.copytree(PROGRAMS / BASE_PROGRAM, destination, dirs_exist_ok=True)
    shutil.copytree(PROGRAMS / name, destination, dirs_exist_ok=True)
    for cache in destination.rglob("__pycache__"):
        shutil.rmtree(cache)
    return destination


@pytest.fixture
def program_dir(tmp_path: Path) -> Callable[[str], Path]:
    def make(name: str = BASE_PROGRAM) -> Path:
        return copy_program(name, tmp_path / "programs" / f"{name}-{secrets.token_hex(3)}")

    return make


@pytest.fixture
def git_repo(git_server: GitServer, tmp_path: Path) -> Callable[..., GitRepo]:
    def make(program: str = BASE_PROGRAM, *, name: str | None = None) -> GitRepo:
        repo_name = name or f"{program}-{secrets.token_hex(4)}"
        bare = git_server.root / f"{repo_name}.git"
        _git("init", "-q", "--bare", "-b", "main", str(bare))
        worktree = copy_program(program, tmp_path / "git-work" / repo_name)
        _git("init", "-q", "-b", "main", cwd=worktree)
        repo = GitRepo(repo_name, bare, worktree, git_server)
        repo.update({}, f"program {program}")
        return repo

    return make


@pytest.fixture(scope="session")
def github_app(git_server: GitServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``GitHubAppServer`` (tests/helpers/github_app_server.py): GitHub's installation-token
    endpoint over HTTPS on loopback, in front of the repositories ``git_repo`` makes; git
    needs a token it issued. Clients trust its CA through ``SSL_CERT_FILE``/``GIT_SSL_CAINFO``."""
    from helpers.github_app_server import github_app_server

    state = tmp_path_factory.mktemp("github-app")
    with github_app_server(git_server.root, state) as server:
        yield server
