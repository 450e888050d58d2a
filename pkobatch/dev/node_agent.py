"""A stand-in for the kubelet, and nothing more, for the local control plane (DESIGN §5).

It watches unscheduled pods (``spec.nodeName`` empty) — there is no scheduler — and runs each
pod's containers as local processes: init containers one after another, then the single
main container. The real Job controller, garbage collector and TTL controller do the rest.

What it does like a kubelet:

- the environment is the pod's, resolved (``podenv``); container images are ignored, the
  process runs with the current interpreter's environment: ``path_prefix`` (the Pulumi bin
  dir) first on ``PATH``, then the interpreter's bin dir; HOME and TMPDIR are per pod;
- ``KUBECONFIG`` points at a private file holding a real token for the pod's
  ServiceAccount (TokenRequest, bound to the pod), so RBAC is enforced on the process;
- status goes through ``pods/status``: Running with a running container status, then
  Succeeded/Failed with the exit code, reason ``Completed``/``Error`` and, for
  ``terminationMessagePolicy: FallbackToLogsOnError``, the last lines of output as message;
- a pod that gets a deletionTimestamp (Job deadline, Job deletion, the GC) has its process
  group sent SIGTERM, then SIGKILL after ``terminationGracePeriodSeconds``, and is reported
  Failed so the Job controller can account for it and drop its tracking finalizer;
- at most ``max_running`` pods run at once; the others wait in Pending, first come first
  served;
- output goes to ``<state>/logs/<namespace>/<pod>.log`` (``pods/log`` needs a kubelet).

Pods are never bound to a node: an unbound pod is deleted at once by the API server, a bound
one would wait forever for a kubelet to confirm (go-deps.md §4.4).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pkobatch.dev import processes
from pkobatch.dev.kubeconfig import kubeconfig, request_token, write_kubeconfig
from pkobatch.dev.podenv import CreateContainerConfigError, expand, resolve_env
from pkobatch.kube.client import PODS, Conflict, Gone, Kube, KubeError, NotFound, Unreachable

log = logging.getLogger(__name__)

JSON = dict[str, Any]
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
# The kubelet's bounds for a termination message taken from the logs.
_MESSAGE_LINES: Final = 80
_MESSAGE_BYTES: Final = 2048
_RETRY_CONFIG_SECONDS: Final = 2.0
_TERMINAL: Final = ("Succeeded", "Failed")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _exit_code(returncode: int) -> int:
    # A process killed by signal N exits 128+N in a container.
    return 128 - returncode if returncode < 0 else returncode


def log_tail(path: Path) -> str:
    """The last lines of a log within the kubelet's termination-message bounds."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 16 * _MESSAGE_BYTES))
            data = handle.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", "replace").splitlines()[-_MESSAGE_LINES:]
    text = "\n".join(lines)
    return text[-_MESSAGE_BYTES:]


@dataclass
class _Slots:
    """First-come-first-served admission of at most ``limit`` running pods."""

    limit: int
    running: int = 0
    queue: deque[str] = field(default_factory=deque)
    condition: threading.Condition = field(default_factory=threading.Condition)

    def acquire(self, uid: str, cancelled: threading.Event) -> bool:
        with self.condition:
            self.queue.append(uid)
            try:
                while not cancelled.is_set():
                    if self.queue[0] == uid and self.running < self.limit:
                        self.running += 1
                        return True
                    self.condition.wait(0.5)
                return False
            finally:
                self.queue.remove(uid)
                self.condition.notify_all()

    def release(self) -> None:
        with self.condition:
            self.running -= 1
            self.condition.notify_all()


class _PodWorker:
    """Runs one pod from Pending to a terminal phase on its own thread. The thread outlives
    every process it starts (``processes`` ties a child's life to its starting thread)."""

    def __init__(self, agent: NodeAgent, pod: JSON) -> None:
        self.agent = agent
        self.pod = pod
        meta = pod["metadata"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]
        self.deleted = threading.Event()  # the pod got a deletionTimestamp or is gone
        self.shutdown = threading.Event()  # the agent stops: kill, report nothing
        self.cancelled = threading.Event()  # either of the two
        self.process: subprocess.Popen[bytes] | None = None
        self.thread = threading.Thread(
            target=self._run, name=f"pod-{self.namespace}/{self.name}", daemon=True
        )
        spec = pod.get("spec") or {}
        self.grace = float(spec.get("terminationGracePeriodSeconds", 30))
        self.pod_dir = agent.state_dir / "pods" / self.namespace / self.name
        self.log_path = agent.state_dir / "logs" / self.namespace / f"{self.name}.log"

    def delete(self) -> None:
        self.deleted.set()
        self.cancelled.set()

    def stop(self) -> None:
        self.shutdown.set()
        self.cancelled.set()

    # -- the pod's life -------------------------------------------------------------------

    def forget(self) -> None:
        """The pod object is gone: its scratch directories go too (the log stays)."""
        self.delete()
        if not self.thread.is_alive():
            shutil.rmtree(self.pod_dir, ignore_errors=True)

    def _run(self) -> None:
        try:
            self._run_pod()
        except Exception:
            log.exception("node agent: pod %s/%s failed unexpectedly", self.namespace, self.name)
            with contextlib.suppress(KubeError):
                self._report_terminal(None, 1, "node agent error; see its log", started=None)
        finally:
            if self.deleted.is_set() and not self.shutdown.is_set():
                shutil.rmtree(self.pod_dir, ignore_errors=True)

    def _run_pod(self) -> None:
        if not self.agent.slots.acquire(self.uid, self.cancelled):
            self._report_never_started()
            return
        try:
            self._prepare_dirs()
            for container in self.pod["spec"].get("initContainers") or []:
                started = _now()
                code = self._run_container(container, main=False)
                if code is None:
                    self._report_never_started()
                    return
                if code != 0:
                    self._report_terminal(container, code, "", started=started, init=True)
                    return
            containers = self.pod["spec"]["containers"]
            if len(containers) != 1:
                self._report_terminal(
                    containers[0],
                    1,
                    "the node agent runs pods with exactly one container",
                    started=None,
                )
                return
            self._run_container(containers[0], main=True)
        finally:
            self.agent.slots.release()

    def _prepare_dirs(self) -> None:
        shutil.rmtree(self.pod_dir, ignore_errors=True)
        for sub in ("home", "tmp", "work"):
            (self.pod_dir / sub).mkdir(parents=True, mode=0o700)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_bytes(b"")

    def _resolve(self, container: JSON) -> tuple[list[str], dict[str, str], str] | None:
        """argv, environment and working directory, retrying like the kubelet while a
        referenced object is missing; None when the pod goes away meanwhile."""
        while not self.cancelled.is_set():
            try:
                return self._container_config(container)
            except CreateContainerConfigError as exc:
                self._report_waiting(container, "CreateContainerConfigError", str(exc))
            self.cancelled.wait(_RETRY_CONFIG_SECONDS)
        return None

    def _container_config(self, container: JSON) -> tuple[list[str], dict[str, str], str]:
        pod_env = resolve_env(self.agent.kube, self.pod, container)
        env = self.agent.base_env(self.pod_dir, self.name)
        token_file = self._write_service_account_kubeconfig()
        if token_file is not None:
            env["KUBECONFIG"] = str(token_file)
        env.update(pod_env)
        command = [expand(part, env) for part in container.get("command") or []]
        args = [expand(part, env) for part in container.get("args") or []]
        if not command:
            raise CreateContainerConfigError(
                "container has no command: the node agent runs processes, not images"
            )
        working_dir = container.get("workingDir") or str(self.pod_dir / "work")
        if not Path(working_dir).is_dir():
            raise CreateContainerConfigError(
                f"workingDir {working_dir!r} does not exist on this host (the node agent runs "
                "containers as local processes)"
            )
        return command + args, env, working_dir

    def _write_service_account_kubeconfig(self) -> Path | None:
        spec = self.pod["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return None
        service_account = spec.get("serviceAccountName") or "default"
        deadline = int(spec.get("activeDeadlineSeconds") or 0)
        expiration = max(3600, deadline + int(self.grace) + 600)
        try:
            token = request_token(
                self.agent.kube,
                self.namespace,
                service_account,
                expiration_seconds=expiration,
                bound_pod=self.pod,
            )
        except NotFound as exc:
            raise CreateContainerConfigError(
                f"serviceaccount {service_account!r} not found"
            ) from exc
        return write_kubeconfig(
            self.pod_dir / "kubeconfig",
            kubeconfig(
                self.agent.server,
                self.agent.ca_pem,
                f"system:serviceaccount:{self.namespace}:{service_account}",
                {"token": token},
            ),
        )

    def _run_container(self, container: JSON, *, main: bool) -> int | None:
        """Run one container to its end; its exit code, or None if it never started."""
        resolved = self._resolve(container)
        if resolved is None:
            return None
        argv, env, working_dir = resolved
        started = _now()
        try:
            with self.log_path.open("ab") as log_file:
                self.process = processes.spawn(argv, log=log_file, env=env, cwd=working_dir)
        except OSError as exc:
            self._report_terminal(container, 128, f"cannot start {argv[0]}: {exc}", started=None)
            return 128
        if main:
            self._report_running(container, started)
        process = self.process
        while process.poll() is None and not self.cancelled.is_set():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.2)
        if process.poll() is None:
            grace = (
                min(self.grace, self.agent.shutdown_grace) if self.shutdown.is_set() else self.grace
            )
            returncode = processes.stop(process, grace=grace)
        else:
            returncode = process.returncode
            # Grandchildren the container left behind die with it, as in a container.
            processes.signal_group(process, signal.SIGKILL)
            processes.forget(process)
        code = _exit_code(returncode)
        if main:
            policy = container.get("terminationMessagePolicy", "File")
            message = log_tail(self.log_path) if policy == "FallbackToLogsOnError" and code else ""
            self._report_terminal(container, code, message, started=started)
        return code

    # -- status ---------------------------------------------------------------------------

    def _patch_status(self, status: JSON) -> None:
        if self.shutdown.is_set():
            return
        body = {"metadata": {"uid": self.uid}, "status": status}
        try:
            self.agent.kube.request(
                "PATCH",
                PODS.path(self.namespace, self.name, "status"),
                body=body,
                content_type=STRATEGIC_MERGE_PATCH,
            )
        except (NotFound, Conflict) as exc:
            # Gone, or replaced by a pod of the same name (the uid precondition failed).
            log.debug("node agent: pod %s/%s is gone: %s", self.namespace, self.name, exc)
        except KubeError as exc:
            log.warning("node agent: status of %s/%s: %s", self.namespace, self.name, exc)

    def _container_status(self, container: JSON, state: JSON, *, ready: bool) -> JSON:
        return {
            "name": container["name"],
            "image": container.get("image", ""),
            "imageID": "",
            "containerID": f"pkobatch-dev://{self.uid}/{container['name']}",
            "ready": ready,
            "started": ready,
            "restartCount": 0,
            "state": state,
        }

    def _conditions(self, ready: bool, reason: str | None = None) -> list[JSON]:
        now = _now()
        conditions = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
        ]
        for kind in ("ContainersReady", "Ready"):
            condition: JSON = {
                "type": kind,
                "status": "True" if ready else "False",
                "lastTransitionTime": now,
            }
            if reason:
                condition["reason"] = reason
            conditions.append(condition)
        return conditions

    def _report_waiting(self, container: JSON, reason: str, message: str) -> None:
        state = {"waiting": {"reason": reason, "message": message}}
        self._patch_status(
            {
                "phase": "Pending",
                "containerStatuses": [self._container_status(container, state, ready=False)],
            }
        )

    def _report_running(self, container: JSON, started: str) -> None:
        state = {"running": {"startedAt": started}}
        self._patch_status(
            {
                "phase": "Running",
                "startTime": self.pod.get("status", {}).get("startTime") or started,
                "hostIP": "127.0.0.1",
                "conditions": self._conditions(True),
                "containerStatuses": [self._container_status(container, state, ready=True)],
            }
        )

    def _report_terminal(
        self,
        container: JSON | None,
        code: int,
        message: str,
        *,
        started: str | None,
        init: bool = False,
    ) -> None:
        container = container or self.pod["spec"]["containers"][0]
        terminated: JSON = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "finishedAt": _now(),
        }
        if started:
            terminated["startedAt"] = started
        if message:
            terminated["message"] = message
        phase = "Succeeded" if code == 0 else "Failed"
        statuses = [self._container_status(container, {"terminated": terminated}, ready=False)]
        status: JSON = {
            "phase": phase,
            "conditions": self._conditions(False, "PodCompleted" if code == 0 else "PodFailed"),
            "initContainerStatuses" if init else "containerStatuses": statuses,
        }
        self._patch_status(status)

    def _report_never_started(self) -> None:
        """A pod deleted before its container ran still needs a terminal phase, which the
        Job controller waits for before it releases the pod (as with a kubelet)."""
        if self.shutdown.is_set():
            return
        container = self.pod["spec"]["containers"][0]
        terminated = {
            "exitCode": 137,
            "reason": "ContainerStatusUnknown",
            "message": "The container could not be located when the pod was deleted.",
            "finishedAt": _now(),
        }
        self._patch_status(
            {
                "phase": "Failed",
                "conditions": self._conditions(False, "PodFailed"),
                "containerStatuses": [
                    self._container_status(container, {"terminated": terminated}, ready=False)
                ],
            }
        )


class NodeAgent:
    """Runs the cluster's unscheduled pods as local processes (see the module docstring).

    ``start()`` launches the watch thread; ``stop()`` kills every running process (with at
    most ``shutdown_grace`` seconds of grace) without reporting anything, as a node that
    goes away would.
    """

    def __init__(
        self,
        kube: Kube,
        *,
        server: str,
        ca_pem: bytes,
        state_dir: Path,
        path_prefix: list[str] | None = None,
        max_running: int = 4,
        shutdown_grace: float = 5.0,
    ) -> None:
        self.kube = kube
        self.server = server
        self.ca_pem = ca_pem
        self.state_dir = state_dir.resolve()
        self.path_prefix = list(path_prefix or [])
        self.slots = _Slots(max_running)
        self.shutdown_grace = shutdown_grace
        self._workers: dict[str, _PodWorker] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._stream: Any = None
        self._thread = threading.Thread(target=self._watch_loop, name="node-agent", daemon=True)
        self._synced = threading.Event()

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    def base_env(self, pod_dir: Path, pod_name: str) -> dict[str, str]:
        """What the image would provide: PATH, locale, HOME; nothing of the agent's own
        environment leaks into a pod."""
        system_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        path = [*self.path_prefix, str(Path(sys.executable).parent), system_path]
        return {
            "PATH": os.pathsep.join(path),
            "HOME": str(pod_dir / "home"),
            "TMPDIR": str(pod_dir / "tmp"),
            "HOSTNAME": pod_name,
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
        }

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        if not self._synced.wait(timeout):
            raise TimeoutError(f"node agent: no pod list from {self.server} in {timeout:.0f}s")

    def stop(self) -> None:
        self._stopping.set()
        stream = self._stream
        if stream is not None:
            stream.stop()
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.stop()
        for worker in workers:
            if worker.thread.is_alive():
                worker.thread.join(timeout=self.shutdown_grace + 10)
        self._thread.join(timeout=10)

    def running(self) -> list[str]:
        """``namespace/name`` of the pods whose process runs now."""
        with self._lock:
            return sorted(
                f"{w.namespace}/{w.name}"
                for w in self._workers.values()
                if w.process is not None and w.process.poll() is None
            )

    # -- watch ----------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        resource_version = ""
        while not self._stopping.is_set():
            try:
                if not resource_version:
                    pods, resource_version = self.kube.list_objects(
                        PODS, field_selector="spec.nodeName="
                    )
                    self._sync(pods)
                    self._synced.set()
                self._stream = self.kube.watch(
                    PODS,
                    field_selector="spec.nodeName=",
                    resource_version=resource_version,
                    timeout_seconds=300,
                )
                for event in self._stream:
                    if self._stopping.is_set():
                        break
                    version = (event.object.get("metadata") or {}).get("resourceVersion")
                    if version:
                        resource_version = version
                    if event.type != "BOOKMARK":
                        self._handle(event.type, event.object)
            except Gone:
                resource_version = ""
            except (Unreachable, KubeError) as exc:
                if not self._stopping.is_set():
                    log.warning("node agent: watch failed (%s); relisting", exc)
                    resource_version = ""
                    self._stopping.wait(1.0)

    def _sync(self, pods: list[JSON]) -> None:
        present = {p["metadata"]["uid"] for p in pods}
        with self._lock:
            gone = [w for uid, w in self._workers.items() if uid not in present]
        for worker in gone:
            self._handle("DELETED", worker.pod)
        for pod in pods:
            self._handle("ADDED", pod)

    def _handle(self, event_type: str, pod: JSON) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        phase = (pod.get("status") or {}).get("phase", "Pending")
        with self._lock:
            worker = self._workers.get(uid)
            if event_type == "DELETED":
                self._workers.pop(uid, None)
                if worker is not None:
                    worker.forget()
                return
            if worker is not None:
                if meta.get("deletionTimestamp"):
                    worker.delete()
                return
            worker = _PodWorker(self, pod)
            self._workers[uid] = worker
        if phase in _TERMINAL:
            return
        if meta.get("deletionTimestamp"):
            worker.delete()
        elif phase == "Running":
            # Started by an earlier agent whose process is gone.
            worker.delete()
            worker._report_terminal(
                None, 137, "the node agent restarted while the pod ran", started=None
            )
            return
        worker.thread.start()
