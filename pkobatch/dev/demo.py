"""``pkobatch dev demo``: the whole chain on the local environment, step by step.

Build what is missing → start the environment → a git repository holding a real Python
Pulumi program (the ``files`` test program: dynamic providers managing local files, one
secret output) → RBAC, passphrase Secret and a Stack with a ``file://`` backend → wait for the
controller's Job to bring it up → request a refresh, then a destroy, through the
operation-request annotation. Each step is a function of ``Demo``; a step that cannot
complete stops the demo and says which part of the chain is missing.
"""

from __future__ import annotations

import datetime
import json
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pkobatch.api.constants import (
    CONDITION_READY,
    CONDITION_STALLED,
    OPERATION_REQUEST_ANNOTATION,
)
from pkobatch.dev import supervisor
from pkobatch.dev.controlplane import repo_root
from pkobatch.dev.tools import missing_components, tools_script
from pkobatch.kube.client import STACKS, Kube, resource_for

NAMESPACE: Final = "pkobatch-demo"
STACK: Final = "demo"
FIELD_MANAGER: Final = "pkobatch-dev-demo"
JSON = dict[str, Any]


class DemoFailed(Exception):
    """A step could not complete; the message names the missing link."""


def _git(*args: str, cwd: Path) -> str:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "pkobatch demo",
        "GIT_AUTHOR_EMAIL": "demo@pkobatch.invalid",
        "GIT_COMMITTER_NAME": "pkobatch demo",
        "GIT_COMMITTER_EMAIL": "demo@pkobatch.invalid",
        "HOME": str(cwd),
    }
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise DemoFailed(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _condition(stack: JSON, kind: str) -> JSON:
    for condition in (stack.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return {}


@dataclass
class Demo:
    root: Path
    console: Console
    timeout: float = 900.0
    started_environment: bool = False
    kube: Kube | None = None
    work: Path = field(init=False)

    def __post_init__(self) -> None:
        self.work = self.root / "demo"

    # -- steps ----------------------------------------------------------------------------

    def build_tools(self) -> None:
        missing = missing_components()
        if not missing:
            self.console.print("[green]✓[/] real components are built")
            return
        script = tools_script()
        if script is None:
            raise DemoFailed(f"{', '.join(missing)} missing and no scripts/tools.sh found")
        self.console.print(f"building {', '.join(missing)} with {script} (takes a while) …")
        if subprocess.run(["bash", str(script), *missing]).returncode != 0:
            raise DemoFailed(f"{script} failed; see its output above")

    def start_environment(self) -> None:
        status = supervisor.read_status(self.root)
        if status.get("state") != "running":
            self.console.print("starting the dev environment …")
            status = supervisor.up(self.root)
            self.started_environment = True
        self.kube = Kube.connect(status["kubeconfig"])
        self.console.print(f"[green]✓[/] control plane at {status['server']}")

    def create_repository(self) -> None:
        root = repo_root()
        program = root / "tests" / "fixtures" / "programs" / "files" if root else None
        if program is None or not program.is_dir():
            raise DemoFailed("the demo program ships with the source checkout; run it there")
        shutil.rmtree(self.work, ignore_errors=True)
        worktree = self.work / "program"
        shutil.copytree(program, worktree, ignore=shutil.ignore_patterns("__pycache__"))
        bare = self.work / "repo.git"
        _git("init", "-q", "--bare", "-b", "main", str(bare), cwd=self.work)
        _git("init", "-q", "-b", "main", cwd=worktree)
        _git("add", "-A", cwd=worktree)
        _git("commit", "-q", "-m", "demo program", cwd=worktree)
        _git("push", "-q", str(bare), "HEAD:main", cwd=worktree)
        commit = _git("rev-parse", "HEAD", cwd=worktree)
        self.console.print(f"[green]✓[/] git repository {bare.as_uri()} at {commit[:12]}")

    def apply_objects(self) -> None:
        kube = self._kube()
        root = repo_root()
        assert root is not None
        runner = root / "deploy" / "kustomize"
        objects: list[JSON] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            yaml.safe_load((runner / "base" / "runner-clusterrole.yaml").read_text()),
        ]
        for name in ("serviceaccount.yaml", "rolebinding.yaml"):
            obj = yaml.safe_load((runner / "runner" / name).read_text())
            obj["metadata"]["namespace"] = NAMESPACE
            for subject in obj.get("subjects") or []:
                subject["namespace"] = NAMESPACE
            objects.append(obj)
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "demo-secrets", "namespace": NAMESPACE},
                "stringData": {
                    "passphrase": secrets.token_urlsafe(16),
                    "token": f"demo-token-{secrets.token_hex(4)}",
                },
            }
        )
        objects.append(self._stack())
        for obj in objects:
            resource = resource_for(obj["apiVersion"], obj["kind"])
            namespace = obj["metadata"].get("namespace") if resource.namespaced else None
            kube.apply(resource, obj, field_manager=FIELD_MANAGER, namespace=namespace)
        self.console.print(f"[green]✓[/] applied Stack {NAMESPACE}/{STACK} and its RBAC")

    def _stack(self) -> JSON:
        (self.work / "backend").mkdir(parents=True, exist_ok=True)
        secret = {"type": "Secret", "secret": {"name": "demo-secrets", "key": "passphrase"}}
        return {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": STACK, "namespace": NAMESPACE},
            "spec": {
                "stack": "dev",
                "projectRepo": (self.work / "repo.git").as_uri(),
                "branch": "main",
                "backend": (self.work / "backend").as_uri(),
                "envRefs": {"PULUMI_CONFIG_PASSPHRASE": secret},
                "config": {"directory": str(self.work / "files")},
                "secretsRef": {
                    "token": {
                        "type": "Secret",
                        "secret": {"name": "demo-secrets", "key": "token"},
                    }
                },
                "destroyOnFinalize": True,
            },
        }

    def wait_for_up(self) -> None:
        def done(stack: JSON) -> bool:
            status = stack.get("status") or {}
            last = status.get("lastUpdate") or {}
            generation = stack["metadata"].get("generation")
            if _condition(stack, CONDITION_STALLED).get("status") == "True":
                return True
            return last.get("generation") == generation and last.get("state") in (
                "succeeded",
                "failed",
            )

        stack = self._watch("up", done)
        last = (stack.get("status") or {}).get("lastUpdate") or {}
        if last.get("state") != "succeeded":
            raise DemoFailed(
                f"the up did not succeed: {last.get('message') or stack.get('status')}"
            )
        self._print_outputs(stack)

    def refresh(self) -> None:
        changed = self.work / "files" / "file-0.txt"
        if changed.is_file():
            changed.write_text("changed behind Pulumi's back")
            self.console.print(f"changed {changed} behind Pulumi's back; refreshing …")
        self._request("refresh")

    def destroy(self) -> None:
        self._request("destroy")
        files = sorted(p.name for p in (self.work / "files").glob("*"))
        if files:
            raise DemoFailed(f"destroy left files behind: {files}")
        self.console.print("[green]✓[/] the managed files are gone")

    # -- helpers --------------------------------------------------------------------------

    def _kube(self) -> Kube:
        if self.kube is None:
            raise DemoFailed("the environment is not running")
        return self.kube

    def _request(self, operation: str) -> None:
        token = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        value = f"{operation}:{token}"
        self._kube().merge_patch(
            STACKS,
            STACK,
            {"metadata": {"annotations": {OPERATION_REQUEST_ANNOTATION: value}}},
            NAMESPACE,
        )

        def done(stack: JSON) -> bool:
            request = (stack.get("status") or {}).get("operationRequest") or {}
            return request.get("request") == value and request.get("state") in (
                "Succeeded",
                "Failed",
                "Rejected",
            )

        stack = self._watch(operation, done)
        request = stack["status"]["operationRequest"]
        if request["state"] != "Succeeded":
            raise DemoFailed(f"{operation} {request['state']}: {request.get('message', '')}")
        self._print_outputs(stack)

    def _watch(self, what: str, done: Callable[[JSON], bool]) -> JSON:
        kube = self._kube()
        deadline = time.monotonic() + self.timeout
        with Live(console=self.console, refresh_per_second=4, transient=True) as live:
            while True:
                stack = kube.get(STACKS, STACK, NAMESPACE)
                environment = supervisor.read_status(self.root)
                live.update(self._progress(what, stack, environment))
                if done(stack):
                    self.console.print(f"[green]✓[/] {what} finished")
                    return stack
                controller = environment.get("controller") or {}
                if controller.get("state") == "exited":
                    raise DemoFailed(
                        f"the controller exited with code {controller.get('exitCode')}; "
                        f"see {controller.get('log')}"
                    )
                if time.monotonic() > deadline:
                    raise DemoFailed(f"{what} did not finish within {self.timeout:.0f}s")
                time.sleep(0.5)

    @staticmethod
    def _progress(what: str, stack: JSON, environment: JSON) -> Group:
        status = stack.get("status") or {}
        table = Table.grid(padding=(0, 2))
        table.add_row("waiting for", Text(what, style="bold"))
        for kind in (CONDITION_READY, "Reconciling", CONDITION_STALLED):
            condition = _condition(stack, kind)
            if condition:
                table.add_row(
                    kind, f"{condition.get('status')} {condition.get('reason', '')}".strip()
                )
        current = status.get("currentUpdate") or {}
        if current:
            table.add_row("current run", f"{current.get('type', '')} {current.get('name', '')}")
        table.add_row("running pods", ", ".join(environment.get("runningPods") or []) or "-")
        return Group(table)

    def _print_outputs(self, stack: JSON) -> None:
        status = stack.get("status") or {}
        self.console.print_json(
            json.dumps({"lastUpdate": status.get("lastUpdate"), "outputs": status.get("outputs")})
        )

    def run(self) -> None:
        steps = (
            self.build_tools,
            self.start_environment,
            self.create_repository,
            self.apply_objects,
            self.wait_for_up,
            self.refresh,
            self.destroy,
        )
        try:
            for step in steps:
                step()
        finally:
            if self.kube is not None:
                self.kube.close()
