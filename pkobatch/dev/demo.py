"""``pkobatch dev demo``: the whole chain on the local environment, step by step.

Build what is missing → start the environment (control plane, node agent, controller) → a
git repository holding a real Python Pulumi program (the ``files`` test program: dynamic
providers managing local files, one secret output) → RBAC, passphrase Secret and a Stack with
a ``file://`` repository and backend → wait for the controller's Job to bring it up → change
a file behind Pulumi's back and request a refresh, then a destroy, through the
operation-request annotation. Each step is a function of ``Demo``; a step that cannot
complete stops the demo and says which part of the chain failed and where its logs are.

A demo Stack left by an earlier ``--keep`` run in a still running environment is deleted
first (its finalizer destroys what it created), so every run starts from nothing.
"""

from __future__ import annotations

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
    RESULT_KEY,
)
from pkobatch.api.objects import JSON, condition_of, true_condition
from pkobatch.api.operation_request import request_value
from pkobatch.api.status import current_update, last_update
from pkobatch.cli.requests import new_token, operation_progress, set_annotation
from pkobatch.dev import supervisor
from pkobatch.dev.controlplane import repo_root
from pkobatch.dev.processes import wait_until
from pkobatch.dev.tools import Component, missing_components, tools_script
from pkobatch.kube.client import CONFIGMAPS, NAMESPACES, STACKS, Kube, resource_for

NAMESPACE: Final = "pkobatch-demo"
STACK: Final = "demo"
FIELD_MANAGER: Final = "pkobatch-dev-demo"
DEMO_COMPONENTS: Final[tuple[Component, ...]] = ("etcd", "kubernetes", "pulumi")
"""What the demo runs: the control plane and the CLI (its program is Python, no provider)."""


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

    @property
    def files_dir(self) -> Path:
        """Where the program's resources (files) are created."""
        return self.work / "files"

    # -- steps ----------------------------------------------------------------------------

    def build_tools(self, components: tuple[Component, ...] = DEMO_COMPONENTS) -> None:
        missing = missing_components(components)
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
        if status.get("state") == "running":
            controller = status.get("controller") or {}
            if controller.get("state") != "running":
                raise DemoFailed(
                    f"the dev environment in {self.root} runs without a controller "
                    f"(controller: {controller.get('state', 'unknown')}); stop it with "
                    f"`pkobatch dev down --state-dir {self.root}` or use another --state-dir"
                )
            self.console.print(f"using the dev environment already running in {self.root}")
        else:
            self.console.print(f"starting the dev environment in {self.root} …")
            status = supervisor.up(self.root)
            self.started_environment = True
        self.kube = Kube.connect(status["kubeconfig"])
        self.console.print(f"[green]✓[/] control plane at {status['server']}, controller running")

    def remove_previous_run(self) -> None:
        """Delete the Stack and namespace an earlier ``--keep`` run left (the Stack's
        finalizer destroys its files, with the old repository and backend still in place)."""
        kube = self._kube()
        if kube.get_or_none(NAMESPACES, NAMESPACE) is None:
            return
        self.console.print(f"deleting namespace {NAMESPACE} left by an earlier demo …")
        if kube.get_or_none(STACKS, STACK, NAMESPACE) is not None:
            kube.delete(STACKS, STACK, NAMESPACE)
            self._wait_gone(STACKS, STACK, NAMESPACE)
        kube.delete(NAMESPACES, NAMESPACE)
        self._wait_gone(NAMESPACES, NAMESPACE, None)

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
        applied = []
        for obj in self._objects():
            resource = resource_for(obj["apiVersion"], obj["kind"])
            namespace = obj["metadata"].get("namespace") if resource.namespaced else None
            kube.apply(resource, obj, field_manager=FIELD_MANAGER, namespace=namespace)
            applied.append(f"{obj['kind']} {obj['metadata']['name']}")
        self.console.print(f"[green]✓[/] applied {', '.join(applied)}")

    def _objects(self) -> list[JSON]:
        """What the demo applies: the runner's ClusterRole, then its namespace's objects."""
        root = repo_root()
        assert root is not None
        clusterrole = root / "deploy" / "kustomize" / "base" / "runner-clusterrole.yaml"
        return [yaml.safe_load(clusterrole.read_text()), *self._namespace_objects(), self._stack()]

    def _namespace_objects(self) -> list[JSON]:
        """The demo's namespace, its runner ServiceAccount bound to the runner's ClusterRole,
        and the Secret holding the passphrase and the secret config value ``token``."""
        root = repo_root()
        assert root is not None
        runner = root / "deploy" / "kustomize" / "runner"
        objects: list[JSON] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        ]
        for name in ("serviceaccount.yaml", "rolebinding.yaml"):
            obj = yaml.safe_load((runner / name).read_text())
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
        return objects

    def _stack(self) -> JSON:
        secret = {"type": "Secret", "secret": {"name": "demo-secrets", "key": "passphrase"}}
        return {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": STACK, "namespace": NAMESPACE},
            "spec": {
                "stack": "dev",
                **self._source(),
                "envRefs": {"PULUMI_CONFIG_PASSPHRASE": secret},
                "secretsRef": {
                    "token": {
                        "type": "Secret",
                        "secret": {"name": "demo-secrets", "key": "token"},
                    }
                },
                "destroyOnFinalize": True,
            },
        }

    def _source(self) -> JSON:
        """The Stack's program, backend and config: the git repository, the ``file://``
        backend and the files' directory, all on this host (the node agent runs the run here)."""
        (self.work / "backend").mkdir(parents=True, exist_ok=True)
        return {
            "projectRepo": (self.work / "repo.git").as_uri(),
            "branch": "main",
            "backend": (self.work / "backend").as_uri(),
            "config": {"directory": str(self.files_dir)},
        }

    def wait_for_up(self) -> None:
        def done(stack: JSON) -> bool:
            last = last_update(stack.get("status"))
            if true_condition(stack, CONDITION_STALLED) is not None:
                return True
            return (
                last.get("type") == "up"
                and last.get("generation") == stack["metadata"].get("generation")
                and last.get("state") in ("succeeded", "failed")
            )

        stack = self._watch("the up", done)
        last = last_update(stack.get("status"))
        if last.get("type") != "up" or last.get("state") != "succeeded":
            stalled = condition_of(stack, CONDITION_STALLED) or {}
            why = last.get("message") or stalled.get("message") or "no message"
            where = self._where_to_look(last.get("name"))
            raise DemoFailed(f"the up did not succeed: {why}{where}")
        if true_condition(stack, CONDITION_READY) is None:
            raise DemoFailed(f"the up succeeded but the Stack is not Ready: {stack.get('status')}")
        self._print_stack(stack, "up")

    def refresh(self) -> None:
        changed = self.files_dir / "file-0.txt"
        if not changed.is_file():
            raise DemoFailed(f"the up reported success but did not create {changed}")
        changed.write_text("changed behind Pulumi's back")
        self.console.print(f"changed {changed} behind Pulumi's back; requesting a refresh …")
        self._request("refresh")

    def destroy(self) -> None:
        self.console.print("requesting a destroy …")
        self._request("destroy")
        files = sorted(p.name for p in self.files_dir.glob("*"))
        if files:
            raise DemoFailed(f"the destroy left files behind in {self.files_dir}: {files}")
        self.console.print(f"[green]✓[/] the managed files are gone from {self.files_dir}")

    # -- helpers --------------------------------------------------------------------------

    def _kube(self) -> Kube:
        if self.kube is None:
            raise DemoFailed("the environment is not running")
        return self.kube

    def _wait_gone(self, resource: Any, name: str, namespace: str | None) -> None:
        kube = self._kube()
        try:
            wait_until(
                lambda: kube.get_or_none(resource, name, namespace) is None,
                timeout=self.timeout,
                what=f"{resource.kind} {name} to be deleted",
            )
        except TimeoutError as exc:
            raise DemoFailed(f"{exc}; see {self.root / 'controller.log'}") from exc

    def _where_to_look(self, job: str | None) -> str:
        logs = self.root / "logs" / NAMESPACE
        pod_logs = f"{logs}/{job}-*.log" if job else str(logs)
        return f"\n  run logs: {pod_logs}\n  controller log: {self.root / 'controller.log'}"

    def _request(self, operation: str) -> None:
        """Ask for ``operation`` and wait for its answer, as ``pkobatch <operation>`` does."""
        kube = self._kube()
        value = request_value(operation, new_token())
        stack = kube.get(STACKS, STACK, NAMESPACE)
        set_annotation(kube, stack, OPERATION_REQUEST_ANNOTATION, value)
        stack = self._watch(f"the {operation}", lambda s: operation_progress(s, value).done)
        progress = operation_progress(stack, value)
        if progress.phase != "Succeeded":
            raise DemoFailed(
                f"the {operation} {progress.phase.lower()}: {progress.message}"
                f"{self._where_to_look(progress.job_name)}"
            )
        self._print_stack(stack, operation, self._result(progress.job_name))

    def _result(self, job_name: str) -> JSON:
        """The run's result (``RunResult``) from its ConfigMap; empty if it is gone."""
        config_map = self._kube().get_or_none(CONFIGMAPS, job_name, NAMESPACE) if job_name else None
        raw = ((config_map or {}).get("data") or {}).get(RESULT_KEY)
        return dict(json.loads(raw)) if raw else {}

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
                if environment.get("state") != "running":
                    raise DemoFailed(
                        f"the dev environment stopped ({environment.get('state')}); see "
                        f"{self.root / 'supervisor.log'}"
                    )
                self._check_controller(environment)
                if time.monotonic() > deadline:
                    current = current_update(stack.get("status"))
                    raise DemoFailed(
                        f"{what} did not finish within {self.timeout:.0f}s"
                        f"{self._where_to_look(current.get('name'))}"
                    )
                time.sleep(0.5)

    def _check_controller(self, environment: JSON) -> None:
        """Raise ``DemoFailed`` when the controller the supervisor runs has exited."""
        controller = environment.get("controller") or {}
        if controller.get("state") == "exited":
            raise DemoFailed(
                f"the controller exited with code {controller.get('exitCode')}; "
                f"see {controller.get('log')}"
            )

    @staticmethod
    def _progress(what: str, stack: JSON, environment: JSON) -> Group:
        status = stack.get("status") or {}
        table = Table.grid(padding=(0, 2))
        table.add_row("waiting for", Text(what, style="bold"))
        for kind in (CONDITION_READY, "Reconciling", CONDITION_STALLED):
            condition = condition_of(stack, kind)
            if condition:
                table.add_row(
                    kind, f"{condition.get('status')} {condition.get('reason', '')}".strip()
                )
        # currentUpdate names the run's Job (its name says the operation).
        current = current_update(status)
        if current:
            table.add_row("current run", current.get("name", ""))
        table.add_row("running pods", ", ".join(environment.get("runningPods") or []) or "-")
        return Group(table)

    def _print_stack(self, stack: JSON, operation: str, result: JSON | None = None) -> None:
        status = stack.get("status") or {}
        last = last_update(status)
        summary = Table(title=f"Stack {NAMESPACE}/{STACK} after the {operation}", show_header=False)
        summary.add_column(style="bold")
        summary.add_column()
        for kind in (CONDITION_READY, CONDITION_STALLED):
            condition = condition_of(stack, kind)
            if condition:
                summary.add_row(kind, f"{condition.get('status')} ({condition.get('reason', '')})")
        summary.add_row(
            "last update",
            f"{last.get('type', '-')} {last.get('state', '-')} (Job {last.get('name', '-')})",
        )
        summary.add_row("commit", str(last.get("lastSuccessfulCommit") or "-")[:12])
        if result:
            changes = ", ".join(
                f"{k} {v}" for k, v in sorted((result.get("changes") or {}).items())
            )
            summary.add_row(f"{operation} result", f"{result.get('reason')}: {changes or 'none'}")
            if result.get("driftedResources") is not None:
                summary.add_row("drifted resources", str(result["driftedResources"]))
        self.console.print(summary)
        outputs = status.get("outputs") or {}
        table = Table(title="outputs (status.outputs)")
        table.add_column("name", style="bold")
        table.add_column("value")
        for name, value in sorted(outputs.items()):
            # Text, not markup: the secret output's value is the literal "[secret]".
            table.add_row(name, Text(value if isinstance(value, str) else json.dumps(value)))
        if not outputs:
            table.add_row("-", "(none)")
        self.console.print(table)

    def steps(self) -> tuple[Callable[[], None], ...]:
        return (
            self.build_tools,
            self.start_environment,
            self.remove_previous_run,
            self.create_repository,
            self.apply_objects,
            self.wait_for_up,
            self.refresh,
            self.destroy,
        )

    def run(self) -> None:
        try:
            for step in self.steps():
                step()
        finally:
            if self.kube is not None:
                self.kube.close()
