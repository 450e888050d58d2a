"""Fixtures shared by the integration and end-to-end tests: everything here is real
(docs/development.md).

Session scope
-------------
``cluster`` -> ``Cluster``: one local control plane (etcd, kube-apiserver,
kube-controller-manager built by ``scripts/tools.sh``) plus the node agent that runs the Job
controller's pods as local processes, with ``crds/`` installed.

    cluster.kubeconfig      Path   admin kubeconfig (client certificate in system:masters)
    cluster.server          str    https://127.0.0.1:<port>
    cluster.kube            Kube   admin client (pkobatch.kube.client)
    cluster.state_dir       Path   control-plane state (pki/, control-plane/*.log, pods/)
    cluster.log_dir         Path   pod output: <log_dir>/<namespace>/<pod>.log
    cluster.pod_logs        ApiPodLogs: pods/log through the API server, which the node
                                   agent serves as a kubelet does (pkobatch.kube.logs)
    cluster.tools           Tools  bin dirs: tools.bin_dir("etcd"|"kubernetes"|"pulumi");
                                   ``tools.pulumi`` (``.yaml``, ``.kubernetes_provider``) is
                                   None when not built; the node agent's pods get
                                   ``tools.pulumi_path()`` first on PATH
    cluster.agent           NodeAgent
    cluster.pulumi_image    str    a stock Pulumi image (the CLI, no pkobatch): its pods get
                                   the Pulumi bin dir on PATH but not this interpreter's
    cluster.service_account_kubeconfig(namespace, name, path) -> Path
                                   kubeconfig with a real TokenRequest token for that SA
    cluster.service_account_kube(namespace, name) -> Kube   (closed at session end)
    cluster.env(**extra) -> dict   os.environ + KUBECONFIG=admin,
                                   for subprocesses (e.g. `python -m pkobatch.main controller`)

``git_server`` -> ``GitServer``: a loopback HTTP git server (``git http-backend``) checking
HTTP basic auth. It accepts two kinds of credentials:

    git_server.username / git_server.password   user name and password (user "pkobatch")
    git_server.token                            a token: accepted as the password of any user
                                                name, e.g. "git" as PKO's ``gitAuth.accessToken``
                                                (and the runner) send it
    git_server.requests                         every request received: ``GitRequest(path,
                                                authorization)`` (whether credentials came)

It is plain http on loopback, so pkobatch sends it credentials only with the opt-in
``PKOBATCH_INSECURE_HTTP_GIT_HOSTS=127.0.0.1`` (tests/controller_harness.py sets it).

``pulumi_bin`` -> Path: the bin dir of the built Pulumi CLI. ``yaml_host`` and
``kubernetes_provider`` -> Path: the bin dirs of ``pulumi-language-yaml`` and
``pulumi-resource-kubernetes`` (requiring them; both are on ``pulumi_env``'s PATH when built).

``all_tools`` -> ``Tools``: etcd, Kubernetes and Pulumi, all built (for tests that start their
own environment with ``pkobatch dev``).

``helm_bin`` -> Path: the built ``helm``; ``promtool_bin`` -> Path: the built ``promtool``;
``prometheus_operator_crds`` -> Path: the directory of the Prometheus Operator's CRD files
(``scripts/tools.sh helm promtool prometheus_operator``).

Module scope
------------
``fresh_cluster`` -> ``Cluster``: another control plane and node agent like ``cluster``, but
without pkobatch's CRDs (for tests of installers such as ``helm install``).

Function scope
--------------
``kube``       the admin ``Kube`` (same object as ``cluster.kube``).
``namespace``  a fresh namespace (str) holding ServiceAccount ``pkobatch-runner`` (no
               rights granted); deleted after the test (unless the test deleted it).
``git_repo``   factory ``git_repo(program="files", *, name=None) -> GitRepo``: a real git
               repository holding ``tests/fixtures/programs/<program>`` (variants are overlaid
               on ``files``), with ``.file_url``, ``.http_url`` (needs the git server's
               credentials or token), ``.commit``, ``.branch`` and
               ``.update(files, message) -> sha``.
``program_dir`` factory ``program_dir(name) -> Path``: a writable copy of a test program.
``pulumi_env`` ``PulumiEnv``: per-test PULUMI_HOME and ``file://`` backend, the offline
               environment of docs/development.md (``.env`` dict, ``.backend_url``,
               ``.passphrase``, ``.home``, ``.files_dir`` = where the programs write files).

Test programs (``tests/fixtures/programs``)
-------------------------------------------
``files``: Python program with a ``pulumi.dynamic`` provider managing local files.
Config ``directory`` (required; where the files go), ``files`` (count, default 2),
``content`` (default "hello"), ``sleepSeconds`` (create/update sleep, default 0),
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

Missing binaries: with ``CI=true`` a test needing them fails; locally it is skipped with
the command that builds them.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from sentinels import Leak, planted, register, report, scan_objects
from sentinels import sentinel_session as sentinel_session

from pkobatch.dev import processes
from pkobatch.dev.controlplane import ControlPlane, default_crds_dir, install_crds
from pkobatch.dev.environment import dev_environment
from pkobatch.dev.node_agent import NodeAgent
from pkobatch.dev.tools import (
    PULUMI_PLUGINS,
    Component,
    Tools,
    ToolsMissing,
    available_tools,
    find_tools,
)
from pkobatch.kube.client import NAMESPACES, SERVICEACCOUNTS, Kube, NotFound
from pkobatch.kube.logs import ApiPodLogs

PROGRAMS = Path(__file__).parent / "fixtures" / "programs"
BASE_PROGRAM = "files"
RUNNER_SERVICE_ACCOUNT = "pkobatch-runner"
# The image PKO's examples run: the Pulumi CLI and language hosts, no pkobatch.
PULUMI_IMAGE = "pulumi/pulumi:3.134.1-nonroot"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_tools(components: tuple[Component, ...]) -> Tools:
    """The built components, or fail (CI) / skip (locally) saying how to build them."""
    try:
        return find_tools(components)
    except ToolsMissing as exc:
        if in_ci():
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


# -- control plane ---------------------------------------------------------------------------


@dataclass
class Cluster:
    control_plane: ControlPlane
    agent: NodeAgent
    kube: Kube
    tools: Tools
    _clients: list[Kube] = field(default_factory=list)
    pulumi_image: str = PULUMI_IMAGE

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def server(self) -> str:
        return self.control_plane.server

    @property
    def state_dir(self) -> Path:
        return self.control_plane.state_dir

    @property
    def log_dir(self) -> Path:
        return self.agent.log_dir

    @property
    def pod_logs(self) -> ApiPodLogs:
        return ApiPodLogs(self.kube)

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path) -> Path:
        # Valid for longer than any test session.
        return self.control_plane.service_account_kubeconfig(
            namespace, name, path, expiration_seconds=12 * 3600
        )

    def service_account_kube(self, namespace: str, name: str) -> Kube:
        path = self.state_dir / "sa-kubeconfigs" / f"{namespace}.{name}.{uuid.uuid4().hex}"
        client = Kube.connect(str(self.service_account_kubeconfig(namespace, name, path)))
        self._clients.append(client)
        return client

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env.update(extra)
        return env

    def close(self) -> None:
        for client in self._clients:
            client.close()


@contextlib.contextmanager
def in_process_log(path: Path) -> Iterator[None]:
    """The log of pkobatch code running in this process (the node agent), in a file, so
    the sentinel scan reads it too."""
    logger = logging.getLogger("pkobatch")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()


@pytest.fixture(scope="session")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, sentinel_session: list[Leak]
) -> Iterator[Cluster]:
    require_tools(("etcd", "kubernetes"))
    tools = available_tools()
    processes.exit_on_termination_signals()
    state = tmp_path_factory.mktemp("cluster")
    with in_process_log(state / "in-process.log"):
        yield from _cluster(state, tools, sentinel_session, crds_dir=default_crds_dir())


@pytest.fixture(scope="module")
def fresh_cluster(
    tmp_path_factory: pytest.TempPathFactory, sentinel_session: list[Leak]
) -> Iterator[Cluster]:
    """A second control plane of its own, without pkobatch's CRDs: for installers (helm)
    that must start from an empty cluster. Stopped after the test module."""
    require_tools(("etcd", "kubernetes"))
    state = tmp_path_factory.mktemp("fresh-cluster")
    yield from _cluster(state, available_tools(), sentinel_session, crds_dir=None)


def _cluster(
    state: Path, tools: Tools, leaks: list[Leak], *, crds_dir: Path | None = None
) -> Iterator[Cluster]:
    pulumi_path = tools.pulumi_path()
    with dev_environment(
        state, tools, crds_dir=crds_dir, max_pods=8, image_paths={PULUMI_IMAGE: pulumi_path}
    ) as environment:
        result = Cluster(environment.control_plane, environment.agent, environment.kube, tools)
        yield result
        leaks.extend(scan_objects(environment.kube, planted()))
        result.close()


@pytest.fixture
def kube(cluster: Cluster) -> Kube:
    return cluster.kube


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{slug}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = _namespace_name(request.node.name)
    kube = cluster.kube
    kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    kube.create(
        SERVICEACCOUNTS,
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": RUNNER_SERVICE_ACCOUNT},
        },
        name,
    )
    # Pods naming no ServiceAccount need "default", which a controller creates shortly.
    processes.wait_until(
        lambda: kube.get_or_none(SERVICEACCOUNTS, "default", name) is not None,
        timeout=60,
        what=f"ServiceAccount {name}/default",
    )
    yield name
    try:
        leaks = scan_objects(kube, planted(), name)
    finally:
        with contextlib.suppress(NotFound):  # a test may delete it itself
            kube.delete(NAMESPACES, name)
    if leaks:
        pytest.fail(report(leaks, f"objects of namespace {name}"), pytrace=False)


# -- git ---------------------------------------------------------------------------------------


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


class _GitHandler(BaseHTTPRequestHandler):
    """Smart-HTTP git through the ``git http-backend`` CGI, after a basic-auth check."""

    server: _GitHttpServer

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _authenticated_user(self) -> str | None:
        scheme, _, encoded = (self.headers.get("Authorization") or "").partition(" ")
        if scheme != "Basic":
            return None
        try:
            username, _, password = base64.b64decode(encoded).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
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


class _GitHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, username: str, password: str, token: str | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _GitHandler)
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
    server = _GitHttpServer(root, "pkobatch", password, token)
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


# -- pulumi -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pulumi_bin() -> Path:
    return require_tools(("pulumi",)).bin_dir("pulumi")


@pytest.fixture(scope="session")
def yaml_host(pulumi_bin: Path) -> Path:
    """The bin dir of ``pulumi-language-yaml`` (``pulumi_env`` puts it on PATH)."""
    return require_tools(("yaml",)).bin_dir("yaml")


@pytest.fixture(scope="session")
def kubernetes_provider(yaml_host: Path) -> Path:
    """The bin dir of ``pulumi-resource-kubernetes`` (an ambient plugin on ``pulumi_env``'s
    and the node agent's PATH); the test programs using it are YAML and Python."""
    return require_tools(("kubernetes_provider",)).bin_dir("kubernetes_provider")


@pytest.fixture(scope="session")
def health_tools() -> Tools:
    """Argo CD's health check for Stacks and the kstatus program (tests/health_checks.py)."""
    return require_tools(("argocd_health", "kstatus"))


@pytest.fixture(scope="session")
def all_tools() -> Tools:
    """Every built component, for tests that start their own environment (``pkobatch dev``)."""
    return require_tools(("etcd", "kubernetes", "pulumi"))


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    return Path(require_tools(("helm",)).binary("helm", "helm"))


@pytest.fixture(scope="session")
def promtool_bin() -> Path:
    return Path(require_tools(("promtool",)).binary("promtool", "promtool"))


@pytest.fixture(scope="session")
def prometheus_operator_crds() -> Path:
    return require_tools(("prometheus_operator",)).bin_dir("prometheus_operator") / "crds"


@dataclass
class PulumiEnv:
    env: dict[str, str]
    home: Path
    backend_url: str
    passphrase: str
    files_dir: Path


@pytest.fixture
def pulumi_env(pulumi_bin: Path, tmp_path: Path) -> PulumiEnv:
    home = tmp_path / "pulumi-home"
    backend = tmp_path / "pulumi-backend"
    files = tmp_path / "managed-files"
    for directory in (home, backend, files):
        directory.mkdir()
    passphrase = register(secrets.token_urlsafe(16), "pulumi-passphrase")
    # The CLI first, then the plugins that are built (a test needing one requires it).
    plugins = available_tools(PULUMI_PLUGINS).pulumi_path()
    path = os.pathsep.join(
        [str(pulumi_bin), *plugins, str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    )
    env = {
        "PATH": path,
        "PULUMI_HOME": str(home),
        "PULUMI_BACKEND_URL": backend.as_uri(),
        "PULUMI_CONFIG_PASSPHRASE": passphrase,
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_PYTHON_CMD": sys.executable,
    }
    return PulumiEnv(env, home, backend.as_uri(), passphrase, files)


@pytest.fixture(scope="session")
def github_app(git_server: GitServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``GitHubAppServer`` (tests/github_app_server.py): GitHub's installation-token endpoint
    over HTTPS on loopback, in front of the repositories ``git_repo`` makes; git needs a
    token it issued. Clients trust its CA through ``SSL_CERT_FILE``/``GIT_SSL_CAINFO``."""
    from github_app_server import github_app_server

    state = tmp_path_factory.mktemp("github-app")
    with github_app_server(git_server.root, state, _GitHandler, _GitHttpServer) as server:
        yield server


@pytest.fixture(scope="session")
def flux_crds(cluster: Cluster) -> Path:
    """Flux's source CRDs (GitRepository, OCIRepository, Bucket, ...) from the built
    source-controller's module, installed; their directory."""
    directory = require_tools(("source_controller",)).bin_dir("source_controller") / "crd"
    install_crds(cluster.kube, directory, timeout=120)
    return directory


@pytest.fixture(scope="session")
def flux_source_controller(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """``SourceController`` (tests/flux_source_controller.py): Flux's real source-controller
    running against the local control plane, its CRDs installed, artifacts on loopback."""
    from flux_source_controller import source_controller

    directory = require_tools(("source_controller",)).bin_dir("source_controller")
    state = tmp_path_factory.mktemp("source-controller")
    with source_controller(cluster, directory, state) as running:
        yield running
