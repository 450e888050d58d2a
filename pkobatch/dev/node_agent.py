"""A stand-in for the kubelet, and nothing more, for the local control plane (docs/development.md).

It watches unscheduled pods (``spec.nodeName`` empty) — there is no scheduler — binds each
one it is about to run to its node name (``pods/binding``; no Node object is needed) and runs
the pod's containers as local processes: init containers one after another, then the single
main container. Pods created already bound to its node name run too. The real Job
controller, garbage collector and TTL controller do the rest.

Binding is what makes deletion behave as on a real node. The API server deletes an unbound
pod at once (and with it the pod-bound ServiceAccount token), but gives a bound pod a
``deletionTimestamp`` of now + grace period and keeps it until its kubelet confirms with a
delete of grace 0. So a process that gets SIGTERM (Job deletion, ``activeDeadlineSeconds``,
namespace deletion) can still use its token — e.g. the runner writes its ``Cancelled``
result — and the Job controller sees the pod as terminating until it has really ended.

What it does like a kubelet:

- the environment is the pod's, resolved (``podenv``); container images are ignored, the
  process runs with the current interpreter's environment: ``path_prefix`` (the Pulumi bin
  dir) first on ``PATH``, then the interpreter's bin dir; HOME and TMPDIR are per pod. An
  image listed in ``image_paths`` stands for an image that does not carry pkobatch (e.g. a
  stock ``pulumi/pulumi``): its containers get exactly the listed directories and the
  system ones on ``PATH``, without the interpreter's bin dir;
- init containers run one after another before the main container; one that fails fails
  the pod (phase Failed, its status under ``initContainerStatuses``), as with a kubelet;
- ``emptyDir`` volumes are real directories, one per pod and volume, under the pod's
  directory, seen at their ``mountPath`` by **path translation**: a command or argument,
  an ``env`` value or the ``workingDir`` that is a ``mountPath`` or starts with
  ``<mountPath>/`` is rewritten to the volume's directory (honouring ``subPath``). Chosen
  over a private mount namespace with bind mounts because it needs no privileges (the agent
  also runs under ``pkobatch dev`` as an ordinary user), no ``unshare``/``mount`` binaries,
  no mount point created on the host for each ``mountPath``, and no work between ``fork``
  and ``exec`` in a multi-threaded process. Its limit: a path the process builds itself (not
  from its command line or environment) is not translated, and a host path that happens
  to start with a ``mountPath`` is translated too. Volumes of other kinds are not
  provided;
- ``KUBECONFIG`` points at a private file holding a real token for the pod's
  ServiceAccount (TokenRequest, bound to the pod), so RBAC is enforced on the process;
- a container's ``resources.limits.memory`` is enforced with a memory cgroup of its own
  where the host lets the agent write one (``pkobatch.dev.memory_limit``; as root); a
  container that goes over it ends with exit code 137 and reason ``OOMKilled``;
- status goes through ``pods/status``: Running with a running container status, then
  Succeeded/Failed with the exit code, reason ``Completed``/``Error`` and the termination
  message: each container gets a file of its own (``<pod dir>/termination/<container>``)
  standing for its ``terminationMessagePath`` — path translation as for ``emptyDir``, so a
  variable or argument naming that path names the file — and at most its first 4096 bytes
  become the message, as with a kubelet; with ``terminationMessagePolicy:
  FallbackToLogsOnError``, an empty file and a non-zero exit code, the last lines of output;
- a pod that gets a deletionTimestamp (Job deadline, Job deletion, the GC) has its process
  sent SIGTERM — only the container's first process, as a container runtime does: a
  launcher that forwards signals to a child process would otherwise pass on a signal the
  child already got from a signal to the whole group — then its process group SIGKILL after the
  deletion's grace period; it is reported Failed
  (so the Job controller can account for it and drop its tracking finalizer) and then
  deleted with grace 0, which removes the object;
- when a container ends, every process left of it is SIGKILLed: its process tree (under its
  reaper, ``pkobatch.dev.reaper``) and whatever left that tree — found by the pod's UID in
  the environment (``POD_MARKER_VARIABLE``), which every process of the pod inherits;
- ``stop()`` is a graceful node shutdown: processes get SIGTERM (at most ``shutdown_grace``
  seconds), their pods are reported Failed with a ``DisruptionTarget`` condition (reason
  ``TerminationByKubelet``) and pods being deleted are released, so nothing waits for a
  node that is gone (namespaces can terminate). A pod of the node that an earlier agent
  started (``status.startTime``) and left unfinished is reported and released the same way;
- at most ``max_running`` pods run at once; the others wait in Pending, first come first
  served;
- output goes to ``<state>/logs/<namespace>/<pod>.log``, which it serves to the API server
  as a kubelet does (``pods/log``; ``pkobatch.dev.container_logs``) when given its TLS
  material: it registers its Node with its address and kubelet port for that;
- ``launches()`` tells what the recent containers were started as (argv and ``PATH``, no
  other variable: values may be secrets), for tests that check what really ran.

Pods waiting for a slot stay unbound, like pods no scheduler has placed yet.
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
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pkobatch.api.objects import JSON
from pkobatch.api.quantity import parse_quantity
from pkobatch.api.timestamps import format_time
from pkobatch.dev import processes
from pkobatch.dev.container_logs import ContainerLog, ContainerLogServer, KubeletTls
from pkobatch.dev.kubeconfig import kubeconfig, request_token, write_kubeconfig
from pkobatch.dev.memory_limit import MemoryCgroup
from pkobatch.dev.podenv import CreateContainerConfigError, expand, resolve_env
from pkobatch.kube.client import (
    DEFAULT_TIMEOUT,
    NODES,
    PODS,
    Conflict,
    Gone,
    Invalid,
    Kube,
    KubeError,
    NotFound,
    Unreachable,
)

log = logging.getLogger(__name__)

STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
# The kubelet's bounds for a termination message taken from the logs, and from the file.
_MESSAGE_LINES: Final = 80
_MESSAGE_BYTES: Final = 2048
_MESSAGE_FILE_BYTES: Final = 4096
# The API server's default terminationMessagePath.
_TERMINATION_MESSAGE_PATH: Final = "/dev/termination-log"
# Every process of a pod has it in its environment (the pod's UID): what ends with the pod
# is found by it even after it left the container's process tree.
POD_MARKER_VARIABLE: Final = "PKOBATCH_NODE_AGENT_POD_UID"
_RETRY_CONFIG_SECONDS: Final = 2.0
_TERMINAL: Final = ("Succeeded", "Failed")
DEFAULT_NODE_NAME: Final = "pkobatch-dev"
# What the kubelet's graceful node shutdown writes on the pods it kills.
_SHUTDOWN_MESSAGE: Final = "The node agent stopped; the pod's processes were stopped."
_LAUNCHES_KEPT: Final = 1000
_SHUTDOWN_API_TIMEOUT: Final = (3.0, 5.0)


def _now() -> str:
    return format_time(datetime.datetime.now(datetime.UTC))


def _exit_code(returncode: int) -> int:
    # A process killed by signal N exits 128+N in a container.
    return 128 - returncode if returncode < 0 else returncode


def translate(value: str, mounts: list[tuple[str, Path]]) -> str:
    """``value`` with a leading ``mountPath`` replaced by its host directory; ``mounts`` is
    longest ``mountPath`` first, so nested mounts win."""
    for mount_path, host in mounts:
        if value == mount_path:
            return str(host)
        if value.startswith(mount_path.rstrip("/") + "/"):
            return str(host / value[len(mount_path.rstrip("/")) + 1 :])
    return value


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


@dataclass(frozen=True)
class Launch:
    """One container process the agent started, as started: host paths, resolved."""

    namespace: str
    pod: str
    container: str
    argv: tuple[str, ...]
    path: str


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
        self.shutdown = threading.Event()  # the agent stops (a node shutdown)
        self.cancelled = threading.Event()  # either of the two
        self.process: subprocess.Popen[bytes] | None = None
        self.thread = threading.Thread(
            target=self._run, name=f"pod-{self.namespace}/{self.name}", daemon=True
        )
        spec = pod.get("spec") or {}
        # The pod is this node's: bound by this agent, an earlier one or its creator.
        self.bound = spec.get("nodeName") == agent.node_name
        self.done = False  # the thread has ended or will never run (under the agent's lock)
        self.released = False
        self.grace = float(spec.get("terminationGracePeriodSeconds", 30))
        self.pod_dir = agent.state_dir / "pods" / self.namespace / self.name
        self.log_path = agent.state_dir / "logs" / self.namespace / f"{self.name}.log"

    def delete(self, pod: JSON | None = None) -> None:
        """The pod got a deletionTimestamp (``pod``) or is gone (None)."""
        grace = ((pod or {}).get("metadata") or {}).get("deletionGracePeriodSeconds")
        if grace is not None:
            # A delete may shorten the spec's grace period (``--grace-period``), as with a kubelet.
            self.grace = min(self.grace, float(grace))
        self.deleted.set()
        self.cancelled.set()

    def stop(self) -> None:
        self.shutdown.set()
        self.cancelled.set()

    # -- the pod's life -------------------------------------------------------------------

    def forget(self) -> None:
        """The pod object is gone: its scratch directories go too (the log stays)."""
        self.delete()
        self.released = True
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
            with self.agent.lock:
                self.done = True
            # A deletion seen after this check is released by the watch (NodeAgent._handle).
            if self.deleted.is_set() or (self.shutdown.is_set() and self._being_deleted()):
                self.release()
            if self.deleted.is_set() and not self.shutdown.is_set():
                shutil.rmtree(self.pod_dir, ignore_errors=True)

    def release(self) -> None:
        """Confirm the deletion of a pod bound to this node whose processes have ended (the
        kubelet's final delete, grace 0): only then does the API server remove it."""
        if not self.bound or self.released:
            return
        self.released = True
        try:
            self.agent.kube.delete(
                PODS,
                self.name,
                self.namespace,
                uid=self.uid,
                grace_period_seconds=0,
                timeout=self._api_timeout(),
            )
        except (NotFound, Conflict):
            pass  # gone, or a new pod of the same name (the uid precondition failed)
        except KubeError as exc:
            self.released = False
            log.warning("node agent: deleting %s/%s: %s", self.namespace, self.name, exc)

    def _api_timeout(self) -> tuple[float, float]:
        """During a node shutdown an API server that does not answer must not hold up the
        teardown; otherwise the client's usual timeouts."""
        return _SHUTDOWN_API_TIMEOUT if self.shutdown.is_set() else DEFAULT_TIMEOUT

    def recover(self, phase: str) -> None:
        """A pod of this node that an earlier agent started (``status.startTime``): its
        processes ended with that agent, as on a node that went away."""
        if phase not in _TERMINAL:
            self.shutdown.set()  # reported like a node shutdown: DisruptionTarget
            self._report_terminal(
                None, 137, "the node agent restarted while the pod ran", started=None
            )
        if self.deleted.is_set():
            self.release()

    def _being_deleted(self) -> bool:
        if not self.bound:
            return False
        try:
            pod = self.agent.kube.get(PODS, self.name, self.namespace)
        except KubeError:
            return False
        meta = pod["metadata"]
        return meta.get("uid") == self.uid and bool(meta.get("deletionTimestamp"))

    def _bind(self) -> bool:
        """Bind the pod to this node before it runs; False when it is being deleted or gone."""
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": self.name, "uid": self.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.agent.node_name},
        }
        try:
            self._while_unreachable(
                lambda: self.agent.kube.request(
                    "POST", PODS.path(self.namespace, self.name, "binding"), body=binding
                )
            )
        except (NotFound, Conflict) as exc:
            log.debug("node agent: not binding %s/%s: %s", self.namespace, self.name, exc)
            return False
        self.bound = True
        self.pod["spec"]["nodeName"] = self.agent.node_name
        return True

    def _run_pod(self) -> None:
        if not self.agent.slots.acquire(self.uid, self.cancelled):
            self._report_never_started()
            return
        try:
            if self.cancelled.is_set() or not (self.bound or self._bind()):
                self._report_never_started()
                return
            self._report_accepted()
            self._prepare_dirs()
            for container in self.pod["spec"].get("initContainers") or []:
                started = _now()
                code = self._run_container(container, main=False)
                if code is None:
                    self._report_never_started()
                    return
                if code != 0:
                    message = self._termination_message(container, code)
                    self._report_terminal(container, code, message, started=started, init=True)
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
        for sub in ("home", "tmp", "work", "termination"):
            (self.pod_dir / sub).mkdir(parents=True, mode=0o700)
        for volume in self._empty_dirs():
            (self.pod_dir / "volumes" / volume).mkdir(parents=True, mode=0o700)
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
            except Unreachable as exc:  # the API server is down: wait for it, as a kubelet does
                log.warning("node agent: preparing %s/%s: %s", self.namespace, self.name, exc)
            self.cancelled.wait(_RETRY_CONFIG_SECONDS)
        return None

    def _empty_dirs(self) -> list[str]:
        volumes = self.pod["spec"].get("volumes") or []
        return [v["name"] for v in volumes if "emptyDir" in v]

    def _termination_file(self, container: JSON) -> Path:
        """The host file standing for the container's ``terminationMessagePath``."""
        directory: Path = self.pod_dir / "termination"
        return directory / str(container["name"])

    def _termination_message(self, container: JSON, code: int) -> str:
        """What a kubelet reports as the ended container's message: the first 4096 bytes of
        its termination message file; with ``FallbackToLogsOnError``, an empty file and a
        non-zero exit code, the end of its output."""
        try:
            with self._termination_file(container).open("rb") as handle:
                message = handle.read(_MESSAGE_FILE_BYTES).decode("utf-8", "replace")
        except OSError:
            message = ""
        policy = container.get("terminationMessagePolicy", "File")
        if not message and policy == "FallbackToLogsOnError" and code:
            return log_tail(self.log_path)
        return message

    def _mounts(self, container: JSON) -> list[tuple[str, Path]]:
        """The container's ``emptyDir`` mounts and its termination message file as
        (path in the container, host path), longest path first."""
        empty_dirs = set(self._empty_dirs())
        message_path = container.get("terminationMessagePath") or _TERMINATION_MESSAGE_PATH
        mounts: list[tuple[str, Path]] = [(message_path, self._termination_file(container))]
        for mount in container.get("volumeMounts") or []:
            if mount.get("name") not in empty_dirs:
                continue
            host = self.pod_dir / "volumes" / mount["name"]
            if mount.get("subPath"):
                host = host / mount["subPath"]
                host.mkdir(parents=True, exist_ok=True)
            mounts.append((mount["mountPath"], host))
        return sorted(mounts, key=lambda item: len(item[0]), reverse=True)

    def _container_config(self, container: JSON) -> tuple[list[str], dict[str, str], str]:
        mounts = self._mounts(container)
        pod_env = {
            name: translate(value, mounts)
            for name, value in resolve_env(self.agent.kube, self.pod, container).items()
        }
        env = self.agent.base_env(self.pod_dir, self.name, container.get("image", ""))
        env[POD_MARKER_VARIABLE] = self.uid
        token_file = self._write_service_account_kubeconfig()
        if token_file is not None:
            env["KUBECONFIG"] = str(token_file)
        env.update(pod_env)
        command = [translate(expand(part, env), mounts) for part in container.get("command") or []]
        args = [translate(expand(part, env), mounts) for part in container.get("args") or []]
        if not command:
            raise CreateContainerConfigError(
                "container has no command: the node agent runs processes, not images"
            )
        working_dir = translate(container.get("workingDir") or "", mounts) or str(
            self.pod_dir / "work"
        )
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
        self._termination_file(container).write_bytes(b"")
        started = _now()
        if processes.find_program(argv[0], env.get("PATH"), working_dir) is None:
            message = f"cannot start {argv[0]}: no such executable on the pod's PATH"
            self._report_terminal(container, 128, message, started=None)
            return 128
        cgroup = self._memory_cgroup(container)
        try:
            with self.log_path.open("ab") as log_file:
                self.process = processes.spawn(
                    self._in_reaper(argv, cgroup), log=log_file, env=env, cwd=working_dir
                )
            self.agent.record(
                Launch(self.namespace, self.name, container["name"], tuple(argv), env["PATH"])
            )
        except OSError as exc:
            if cgroup is not None:
                cgroup.remove()
            self._report_terminal(container, 128, f"cannot start {argv[0]}: {exc}", started=None)
            return 128
        if main:
            self._report_running(container, started)
        code = _exit_code(self._wait(self.process, cgroup))
        out_of_memory = cgroup is not None and cgroup.oom_killed()
        if cgroup is not None:
            cgroup.remove()
        if out_of_memory:
            # As a kubelet reports a container its memory cgroup's OOM killer ended.
            code = 137
        if main:
            message = self._termination_message(container, code)
            reason = "OOMKilled" if out_of_memory else None
            self._report_terminal(container, code, message, started=started, reason=reason)
        return code

    def _memory_cgroup(self, container: JSON) -> MemoryCgroup | None:
        """The container's memory cgroup when it has a memory limit (None: no limit, or
        cgroups cannot be written here, which is logged)."""
        limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        if not limit:
            return None
        try:
            limit_bytes = parse_quantity(str(limit))
        except ValueError:
            log.warning(
                "node agent: %s/%s: memory limit %r unreadable", self.namespace, self.name, limit
            )
            return None
        cgroup = MemoryCgroup.create(f"{self.uid}-{container['name']}", limit_bytes)
        if cgroup is None:
            log.warning(
                "node agent: %s/%s: no writable memory cgroup; its memory limit %s is not enforced",
                self.namespace,
                self.name,
                limit,
            )
        return cgroup

    def _wait(self, process: subprocess.Popen[bytes], cgroup: MemoryCgroup | None = None) -> int:
        """Wait for the process to end; once the pod is deleted (or the agent stops) SIGTERM
        it and SIGKILL its group after the grace period, which a later, shorter deletion or
        the agent's stop can cut short; once its memory cgroup had an OOM kill, end it at
        once, as the whole container ends. The return code."""
        terminated_at: float | None = None
        while process.poll() is None:
            if cgroup is not None and cgroup.oom_killed():
                break
            if self.cancelled.is_set():
                if terminated_at is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.send_signal(signal.SIGTERM)
                    terminated_at = time.monotonic()
                grace = self.grace
                if self.shutdown.is_set():
                    grace = min(grace, self.agent.shutdown_grace)
                if time.monotonic() - terminated_at >= grace:
                    break
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.2)
        # SIGKILL what is left, all descendants included, as when a container ends; and what
        # left the tree when its reaper was killed (a setsid()'d provider, reparented to init).
        code = processes.kill_tree(process)
        processes.kill_marked(POD_MARKER_VARIABLE, self.uid)
        return code

    def _in_reaper(self, argv: list[str], cgroup: MemoryCgroup | None = None) -> list[str]:
        """``argv`` under ``pkobatch.dev.reaper``: the container's whole process tree ends
        with it, its hostname is the pod's and it runs in the container's memory cgroup
        (``-E``: the pod's PYTHON* variables are for the container, not for the reaper)."""
        spec = self.pod.get("spec") or {}
        hostname = str(spec.get("hostname") or self.name)[:63]
        reaper = [sys.executable, "-E", "-m", "pkobatch.dev.reaper", "--hostname", hostname]
        if cgroup is not None:
            reaper += ["--cgroup", str(cgroup.procs)]
        return [*reaper, "--", *argv]

    # -- status ---------------------------------------------------------------------------

    def _patch_status(self, status: JSON) -> None:
        if self.shutdown.is_set() and not self.bound:
            return  # not this node's pod yet: another agent may still run it
        body = {"metadata": {"uid": self.uid}, "status": status}
        try:
            # A status lost to an outage would leave the pod running forever for the Job
            # controller: like the kubelet's status manager, try until the API server answers.
            self._while_unreachable(
                lambda: self.agent.kube.request(
                    "PATCH",
                    PODS.path(self.namespace, self.name, "status"),
                    body=body,
                    content_type=STRATEGIC_MERGE_PATCH,
                    timeout=self._api_timeout(),
                )
            )
        except (NotFound, Conflict, Invalid) as exc:
            # Gone, or replaced by a pod of the same name (the uid precondition failed).
            log.debug("node agent: pod %s/%s is gone: %s", self.namespace, self.name, exc)
        except KubeError as exc:
            log.warning("node agent: status of %s/%s: %s", self.namespace, self.name, exc)

    def _while_unreachable(self, call: Callable[[], JSON]) -> JSON:
        """``call()``, again every few seconds while the API server cannot be reached, until
        the agent stops (then ``Unreachable`` is raised)."""
        while True:
            try:
                return call()
            except Unreachable as exc:
                if self.agent.stopping:
                    raise
                log.warning("node agent: %s/%s: %s; retrying", self.namespace, self.name, exc)
                self.shutdown.wait(_RETRY_CONFIG_SECONDS)

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

    def _terminal_status(self, phase: str, statuses_key: str, statuses: list[JSON]) -> JSON:
        status: JSON = {
            "phase": phase,
            "conditions": self._conditions(
                False, "PodCompleted" if phase == "Succeeded" else "PodFailed"
            ),
            statuses_key: statuses,
        }
        if self.shutdown.is_set() and phase == "Failed":
            # As the kubelet's graceful node shutdown: the run was interrupted, not wrong.
            status["reason"] = "Terminated"
            status["message"] = _SHUTDOWN_MESSAGE
            status["conditions"].append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "TerminationByKubelet",
                    "message": _SHUTDOWN_MESSAGE,
                    "lastTransitionTime": _now(),
                }
            )
        return status

    def _report_accepted(self) -> None:
        """The pod is this node's now; ``startTime`` tells a later agent it was taken."""
        self.pod.setdefault("status", {})["startTime"] = _now()
        self._patch_status(
            {
                "startTime": self.pod["status"]["startTime"],
                "hostIP": "127.0.0.1",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}
                ],
            }
        )

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
        reason: str | None = None,
    ) -> None:
        container = container or self.pod["spec"]["containers"][0]
        terminated: JSON = {
            "exitCode": code,
            "reason": reason or ("Completed" if code == 0 else "Error"),
            "finishedAt": _now(),
        }
        if started:
            terminated["startedAt"] = started
        if message:
            terminated["message"] = message
        phase = "Succeeded" if code == 0 else "Failed"
        statuses = [self._container_status(container, {"terminated": terminated}, ready=False)]
        key = "initContainerStatuses" if init else "containerStatuses"
        self._patch_status(self._terminal_status(phase, key, statuses))

    def _report_never_started(self) -> None:
        """A pod deleted before its container ran still needs a terminal phase, which the
        Job controller waits for before it releases the pod (as with a kubelet)."""
        container = self.pod["spec"]["containers"][0]
        terminated = {
            "exitCode": 137,
            "reason": "ContainerStatusUnknown",
            "message": "The container could not be located when the pod was deleted.",
            "finishedAt": _now(),
        }
        statuses = [self._container_status(container, {"terminated": terminated}, ready=False)]
        self._patch_status(self._terminal_status("Failed", "containerStatuses", statuses))


class NodeAgent:
    """Runs the cluster's unscheduled pods as local processes (see the module docstring).

    ``start()`` launches the watch thread and, given ``kubelet_tls``, the container-log
    endpoint and the Node ``node_name`` that tells the API server where it is; ``stop()`` is
    a graceful node shutdown: every process gets at most ``shutdown_grace`` seconds, its pod
    is reported Failed with a ``DisruptionTarget`` condition and, when being deleted,
    released. Pods are bound to ``node_name``.
    """

    def __init__(
        self,
        kube: Kube,
        *,
        server: str,
        ca_pem: bytes,
        state_dir: Path,
        path_prefix: list[str] | None = None,
        image_paths: Mapping[str, Sequence[str]] | None = None,
        max_running: int = 4,
        shutdown_grace: float = 5.0,
        node_name: str = DEFAULT_NODE_NAME,
        kubelet_tls: KubeletTls | None = None,
    ) -> None:
        self.kube = kube
        self.node_name = node_name
        self.server = server
        self.ca_pem = ca_pem
        self.state_dir = state_dir.resolve()
        self.path_prefix = list(path_prefix or [])
        self.image_paths = {image: list(dirs) for image, dirs in (image_paths or {}).items()}
        self.slots = _Slots(max_running)
        self.shutdown_grace = shutdown_grace
        self._workers: dict[str, _PodWorker] = {}
        self.lock = threading.Lock()
        self._stopping = threading.Event()
        self._stream: Any = None
        self._thread = threading.Thread(target=self._watch_loop, name="node-agent", daemon=True)
        self._synced = threading.Event()
        self._launches: deque[Launch] = deque(maxlen=_LAUNCHES_KEPT)
        self._log_server = (
            ContainerLogServer(
                self._container_log,
                cert=kubelet_tls.cert,
                key=kubelet_tls.key,
                client_ca=kubelet_tls.client_ca,
            )
            if kubelet_tls is not None
            else None
        )

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    def base_env(self, pod_dir: Path, pod_name: str, image: str = "") -> dict[str, str]:
        """What the image would provide: PATH, locale, HOME; nothing of the agent's own
        environment leaks into a pod. An image of ``image_paths`` brings only its listed
        directories, not this interpreter (pkobatch)."""
        system_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        image_dirs = self.image_paths.get(image)
        if image_dirs is not None:
            path = [*image_dirs, system_path]
        else:
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
        if self._log_server is not None:
            self._log_server.start()
            self.register_node(self._log_server.port)
        self._thread.start()
        if not self._synced.wait(timeout):
            raise TimeoutError(f"node agent: no pod list from {self.server} in {timeout:.0f}s")

    def register_node(self, kubelet_port: int) -> None:
        """Create (or update) this node's Node: its address and kubelet port are where the
        API server sends ``pods/log`` requests."""
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {"kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux"},
            },
        }
        with contextlib.suppress(Conflict):
            self.kube.create(NODES, node)
        now = _now()
        status = {
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "the pkobatch node agent runs this node's pods",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        }
        self.kube.request(
            "PATCH",
            NODES.path(None, self.node_name, "status"),
            body={"status": status},
            content_type=STRATEGIC_MERGE_PATCH,
        )

    def _container_log(self, namespace: str, pod: str) -> ContainerLog | None:
        """The output of a pod of this node, for the container-log endpoint."""
        with self.lock:
            workers = [
                w for w in self._workers.values() if (w.namespace, w.name) == (namespace, pod)
            ]
        current = next((w for w in workers if not w.released), None)
        if current is not None:
            return ContainerLog(current.log_path, lambda: current.done)
        path = self.log_dir / namespace / f"{pod}.log"
        return ContainerLog(path, lambda: True) if path.is_file() else None

    def stop(self) -> None:
        self._stopping.set()
        stream = self._stream
        if stream is not None:
            stream.stop()
        with self.lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.stop()
        for worker in workers:
            if worker.thread.is_alive():
                worker.thread.join(timeout=self.shutdown_grace + 10)
        self._thread.join(timeout=10)
        if self._log_server is not None:
            self._log_server.stop()

    def record(self, launch: Launch) -> None:
        with self.lock:
            self._launches.append(launch)

    def launches(self, namespace: str) -> list[Launch]:
        """The recent container starts in ``namespace``, oldest first."""
        with self.lock:
            return [launch for launch in self._launches if launch.namespace == namespace]

    def running(self) -> list[str]:
        """``namespace/name`` of the pods whose process runs now."""
        with self.lock:
            return sorted(
                f"{w.namespace}/{w.name}"
                for w in self._workers.values()
                if w.process is not None and w.process.poll() is None
            )

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def process_id(self, namespace: str, name: str) -> int | None:
        """The pid of the first process of pod ``namespace/name`` (its reaper, leader of the
        pod's process group) while it runs."""
        with self.lock:
            for worker in self._workers.values():
                process = worker.process
                if (worker.namespace, worker.name) == (namespace, name) and process is not None:
                    return process.pid if process.poll() is None else None
        return None

    # -- watch ----------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        resource_version = ""
        while not self._stopping.is_set():
            try:
                # All pods: the unscheduled ones and this node's (a field selector cannot
                # say "either"); the others are ignored.
                if not resource_version:
                    pods, resource_version = self.kube.list_objects(PODS)
                    self._sync(pods)
                    self._synced.set()
                self._stream = self.kube.watch(
                    PODS, resource_version=resource_version, timeout_seconds=300
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
        with self.lock:
            gone = [w for uid, w in self._workers.items() if uid not in present]
        for worker in gone:
            self._handle("DELETED", worker.pod)
        for pod in pods:
            self._handle("ADDED", pod)

    def _handle(self, event_type: str, pod: JSON) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        phase = (pod.get("status") or {}).get("phase", "Pending")
        deleting = bool(meta.get("deletionTimestamp"))
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if node not in ("", None, self.node_name):
            return
        if not node and spec.get("schedulingGates"):
            return  # not ready to be scheduled (gates are only ever removed)
        with self.lock:
            worker = self._workers.get(uid)
            if event_type == "DELETED":
                self._workers.pop(uid, None)
                if worker is not None:
                    worker.forget()
                return
            if worker is None:
                worker = _PodWorker(self, pod)
                self._workers[uid] = worker
                new = True
            else:
                new = False
        if deleting:
            worker.delete(pod)
        if not new:
            with self.lock:
                done = worker.done
            if deleting and done:
                worker.release()  # deleted after its worker ended (released at most once)
            return
        taken = bool((pod.get("status") or {}).get("startTime"))
        if phase in _TERMINAL or (worker.bound and taken):
            with self.lock:
                worker.done = True
            if worker.bound:
                worker.recover(phase)
            return
        # Unscheduled, or bound to this node by its creator and not yet started.
        worker.thread.start()
