"""Running the real controller in tests: ``pkobatch controller`` as a process, under its own
ServiceAccount with exactly the RBAC of ``deploy/kustomize/base`` (a real token).

Used by tests/integration/test_controller_*.py and tests/e2e/test_controller_*.py (the
``tests`` directory is on ``sys.path`` through the root conftest).

``grant_role(kube, namespace, name, rules, service_account)``: a Role bound to a ServiceAccount.

``controller_rbac(cluster)`` (session): installs the controller and runner ClusterRoles and
the admission policy on the controller's Secrets from the kustomize base, a
``pkobatch-system/pkobatch-controller`` ServiceAccount bound to the controller role, and
returns a factory writing that SA's kubeconfig.

``ControllerProcess``: start/kill/restart the controller for one namespace (``env`` overrides
its settings, e.g. ``PKOBATCH_JOB__COMMAND``; by default it may send git credentials over
plain http and notifications to 127.0.0.1, where the tests' servers are); ``pid`` and
``threads()`` of its process; ``metric(name, **labels)`` reads its Prometheus
endpoint; ``log_text()`` its output; ``caught_up()`` waits until it has reconciled every
change made so far (to check that a change led to nothing). ``metric(port, ...)`` and
``caught_up(kube, namespace, port)`` do the same for any controller process.

Stacks: ``apply_stack``, ``stack_spec(repo, pulumi_env)`` (the test program from ``repo`` over
authenticated HTTP, on the test's file:// backend, credentials and passphrase from the
Secrets of the e2e ``secrets`` fixture), ``set_passphrase`` (a wrong one fails the next
operation), ``request_reconcile``, ``wait_stack(..., predicate)``, ``ready``,
``settled`` (Ready, or a failed last run that says why, and not reconciling any more),
``condition``, ``last_update``, ``stack_jobs``.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from pkobatch.api.constants import FIELD_MANAGER_CLI, RECONCILE_REQUEST_ANNOTATION, STACK_LABEL
from pkobatch.api.timestamps import parse_time
from pkobatch.dev.environment import LOCAL_JOB_COMMAND, controller_argv
from pkobatch.dev.processes import free_port, wait_until
from pkobatch.kube.client import (
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    EVENTS,
    JOBS,
    NAMESPACES,
    PERSISTENTVOLUMECLAIMS,
    ROLEBINDINGS,
    ROLES,
    SECRETS,
    SERVICEACCOUNTS,
    STACKS,
    Forbidden,
    Invalid,
    Kube,
    NotFound,
    Resource,
)

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "deploy" / "kustomize" / "base"
CONTROLLER_NAMESPACE = "pkobatch-system"
CONTROLLER_SA = "pkobatch-controller"
JSON = dict[str, Any]
INSECURE_HTTP_GIT_HOSTS = "PKOBATCH_INSECURE_HTTP_GIT_HOSTS"
LOOPBACK_GIT_HOST = "127.0.0.1"
NOTIFICATIONS_ALLOWED_CIDRS = "PKOBATCH_NOTIFICATIONS__ALLOWED_CIDRS"
RESOURCE_QUOTAS = Resource("", "v1", "resourcequotas", "ResourceQuota")
VALIDATING_ADMISSION_POLICIES = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicies",
    "ValidatingAdmissionPolicy",
    namespaced=False,
)
VALIDATING_ADMISSION_POLICY_BINDINGS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicybindings",
    "ValidatingAdmissionPolicyBinding",
    namespaced=False,
)


def _apply(kube: Kube, resource: Any, body: JSON, namespace: str | None = None) -> None:
    kube.apply(resource, body, field_manager="pkobatch-tests", namespace=namespace)


def install_controller_rbac(kube: Kube) -> None:
    """The kustomize base's ClusterRoles and Secret policy, and the controller's
    ServiceAccount bound to its ClusterRole."""
    for name in ("controller-clusterrole.yaml", "runner-clusterrole.yaml"):
        _apply(kube, CLUSTERROLES, yaml.safe_load((BASE / name).read_text()))
    policy, policy_binding = yaml.safe_load_all(
        (BASE / "controller-secret-policy.yaml").read_text()
    )
    _apply(kube, VALIDATING_ADMISSION_POLICIES, policy)
    _apply(kube, VALIDATING_ADMISSION_POLICY_BINDINGS, policy_binding)
    if kube.get_or_none(NAMESPACES, CONTROLLER_NAMESPACE) is None:
        kube.create(
            NAMESPACES,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CONTROLLER_NAMESPACE}},
        )
    _apply(
        kube,
        SERVICEACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": CONTROLLER_SA}},
        CONTROLLER_NAMESPACE,
    )
    binding = yaml.safe_load((BASE / "controller-clusterrolebinding.yaml").read_text())
    binding["subjects"] = [
        {"kind": "ServiceAccount", "name": CONTROLLER_SA, "namespace": CONTROLLER_NAMESPACE}
    ]
    _apply(kube, CLUSTERROLEBINDINGS, binding)


def grant_role(
    kube: Kube, namespace: str, name: str, rules: list[JSON], service_account: str
) -> None:
    """A Role ``name`` with ``rules``, bound to ``service_account`` of ``namespace``."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name},
        "rules": rules,
    }
    _apply(kube, ROLES, role, namespace)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }
    _apply(kube, ROLEBINDINGS, binding, namespace)


def bind_runner(kube: Kube, namespace: str) -> None:
    """What deploy/kustomize/runner does in a tenant namespace (the SA already exists)."""
    binding = yaml.safe_load((REPO / "deploy/kustomize/runner/rolebinding.yaml").read_text())
    _apply(kube, ROLEBINDINGS, binding, namespace)


def refuse_pods(kube: Kube, namespace: str) -> None:
    """A ResourceQuota of zero pods that quota admission enforces: every pod the job
    controller tries to create in ``namespace`` is refused.

    Admission ignores a quota whose status has no ``hard`` (not yet counted), and the test
    control plane runs no resourcequota controller, so the usage it would record is written
    here; without it the pods are created and the node agent runs them."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods"},
        "spec": {"hard": {"pods": "0"}},
    }
    kube.create(RESOURCE_QUOTAS, quota, namespace)
    usage = {"status": {"hard": {"pods": "0"}, "used": {"pods": "0"}}}
    kube.merge_patch(RESOURCE_QUOTAS, "no-pods", usage, namespace, subresource="status")


def delete_namespace(kube: Kube, namespace: str) -> None:
    """Delete a test's namespace (unless the test did), then drop the finalizers no running
    controller will remove, so that it really goes: pkobatch's on Stacks (the test's
    controller has stopped, and may never have reconciled them) and
    ``kubernetes.io/pvc-protection`` on claims (the test control plane runs no pvc-protection
    controller).

    A namespace left Terminating is not harmless: kube-controller-manager's namespace
    controller retries its deletion, a LIST and DELETE of every resource type each time, for
    the rest of the session."""
    with contextlib.suppress(NotFound):
        kube.delete(NAMESPACES, namespace)
    for resource in (STACKS, PERSISTENTVOLUMECLAIMS):
        with contextlib.suppress(NotFound):  # a control plane without the Stack CRD
            items, _ = kube.list_objects(resource, namespace)
            for item in items:
                if not item["metadata"].get("finalizers"):
                    continue
                # A policy a test installed may refuse the edit: that namespace stays.
                with contextlib.suppress(NotFound, Forbidden, Invalid):
                    name = item["metadata"]["name"]
                    kube.merge_patch(resource, name, {"metadata": {"finalizers": None}}, namespace)


def scrape(port: int) -> str:
    """The Prometheus endpoint of a controller on 127.0.0.1:``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def metric(port: int, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in scrape(port).splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric_name, _, label_text = series.partition("{")
        if metric_name != name:
            continue
        if all(f'{key}="{val}"' in label_text for key, val in labels.items()):
            total += float(value)
    return total


def caught_up(kube: Kube, namespace: str, port: int, timeout: float = 180.0) -> None:
    """Wait until the controller watching ``namespace`` (metrics on ``port``) has reconciled
    every Stack change made so far, also those that lead to no write: a new suspended Stack
    shows in its status that the controller reached it (one watch stream, a first-in
    first-out queue: every earlier change was taken first), then no reconcile is queued or
    running. The barrier Stack costs the same writes every time."""
    name = f"barrier-{secrets.token_hex(4)}"
    apply_stack(kube, namespace, name, {"stack": "dev", "suspend": True})
    wait_stack(
        kube,
        namespace,
        name,
        lambda s: condition(s, "Ready").get("reason") == "Suspended",
        timeout=timeout,
        what=f"the controller to reach barrier Stack {name}",
    )
    wait_until(
        lambda: (
            metric(port, "workqueue_depth") == 0
            and metric(port, "controller_runtime_active_workers") == 0
        ),
        timeout=timeout,
        what="the controller's queue to drain",
    )


class ControllerProcess:
    """``python -m pkobatch.main controller`` for one namespace, as the controller SA."""

    def __init__(
        self,
        cluster: Any,
        namespace: str,
        work_dir: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.work_dir = work_dir
        self.extra_env = dict(env or {})
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_paths: list[Path] = []
        work_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        kubeconfig = self.cluster.service_account_kubeconfig(
            CONTROLLER_NAMESPACE,
            CONTROLLER_SA,
            self.work_dir / f"controller-{len(self.log_paths)}.kubeconfig",
        )
        settings = {
            "PKOBATCH_JOB__COMMAND": LOCAL_JOB_COMMAND,
            "PKOBATCH_RETRY__BASE": "1s",
            "PKOBATCH_POLL_INTERVAL": "2s",
            "PKOBATCH_JOB__TERMINATION_GRACE_PERIOD": "20s",
            "PKOBATCH_LOG_FORMAT": "text",
            # The tests' git server (tests/fixture_plugins/git.py) serves plain http on
            # loopback; the controller sends credentials there only because of this opt-in.
            INSECURE_HTTP_GIT_HOSTS: LOOPBACK_GIT_HOST,
            # The tests' webhook receivers (tests/fixture_plugins/receivers.py) listen on
            # loopback, where notifications go only because of this opt-in.
            NOTIFICATIONS_ALLOWED_CIDRS: "127.0.0.1/32",
        }
        env = self.cluster.env(**{**settings, **self.extra_env})
        env.pop("KUBECONFIG", None)
        log_path = self.work_dir / f"controller-{len(self.log_paths)}.log"
        self.log_paths.append(log_path)
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                controller_argv(
                    kubeconfig=kubeconfig,
                    namespaces=self.namespace,
                    metrics_addr=f"127.0.0.1:{self.port}",
                    health_addr="0",
                    workers=4,
                ),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(self._serving, timeout=60, what="the controller's metrics endpoint")

    def _serving(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the controller exited:\n{self.log_text()[-3000:]}")
        with contextlib.suppress(OSError):
            self.scrape()
            return True
        return False

    def scrape(self) -> str:
        return scrape(self.port)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def threads(self) -> int:
        """The threads of the controller's process now."""
        return len(os.listdir(f"/proc/{self.pid}/task"))

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``."""
        return metric(self.port, name, **labels)

    def caught_up(self, timeout: float = 180.0) -> None:
        """See ``caught_up``."""
        caught_up(self.cluster.kube, self.namespace, self.port, timeout)

    def kill(self) -> None:
        """SIGKILL: no shutdown of any kind, as when a node dies."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.log_paths if p.exists())


def apply_stack(kube: Kube, namespace: str, name: str, spec: JSON, **metadata: Any) -> JSON:
    body = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name, "namespace": namespace, **metadata},
        "spec": spec,
    }
    return kube.apply(STACKS, body, field_manager=FIELD_MANAGER_CLI, namespace=namespace)


def condition(stack: JSON, condition_type: str) -> JSON:
    for item in (stack.get("status") or {}).get("conditions") or ():
        if item.get("type") == condition_type:
            return dict(item)
    return {}


def wait_stack(
    kube: Kube,
    namespace: str,
    name: str,
    predicate: Callable[[JSON], bool],
    *,
    timeout: float = 300.0,
    what: str = "",
) -> JSON:
    """Poll the Stack until ``predicate`` holds; the error shows its last status."""
    seen: list[JSON] = []

    def check() -> bool:
        stack = kube.get(STACKS, name, namespace)
        seen[:] = [stack]
        return predicate(stack)

    try:
        wait_until(check, timeout=timeout, what=what or f"stack {namespace}/{name}")
    except Exception as exc:
        status = (seen[0].get("status") if seen else None) or {}
        raise AssertionError(f"{exc}\nlast status: {status}") from exc
    return seen[0]


def wait_events(
    kube: Kube,
    namespace: str,
    matching: Callable[[JSON], bool],
    *,
    count: int = 1,
    timeout: float = 60.0,
    what: str = "",
) -> list[JSON]:
    """Poll until at least ``count`` of the namespace's Events match; returns those that do.
    The controller posts Events from a queue after the status write that decided them
    (pkobatch.controller.events), so a test that has seen the status must still wait."""
    found: list[JSON] = []

    def check() -> bool:
        found[:] = [e for e in kube.list_objects(EVENTS, namespace)[0] if matching(e)]
        return len(found) >= count

    wait_until(check, timeout=timeout, what=what or f"{count} matching Event(s) in {namespace}")
    return found


def ready(stack: JSON) -> bool:
    meta = stack.get("metadata") or {}
    status = stack.get("status") or {}
    return (
        status.get("observedGeneration") == meta.get("generation")
        and condition(stack, "Ready").get("status") == "True"
    )


def wait_version_too_low(kube: Kube, namespace: str, name: str, cli_version: str) -> JSON:
    """The Stack once stalled as PKO stalls a run whose Pulumi CLI (``cli_version``, without
    "v") is older than structured config needs, checking PKO's reason and message."""
    stalled = wait_stack(
        kube,
        namespace,
        name,
        lambda s: condition(s, "Stalled").get("status") == "True",
        timeout=600,
    )
    assert condition(stalled, "Stalled")["reason"] == "PulumiVersionTooLow"
    message = condition(stalled, "Stalled")["message"]
    expected = (
        f"Pulumi CLI version v{cli_version} does not support JSON configuration, "
        "require >= v3.202.0"
    )
    assert expected in message, message
    assert last_update(stalled)["reason"] == "PulumiVersionTooLow"
    return stalled


def literal(value: str) -> JSON:
    return {"type": "Literal", "literal": {"value": value}}


def secret(name: str, key: str) -> JSON:
    return {"type": "Secret", "secret": {"name": name, "key": key}}


def stack_spec(repo: Any, pulumi_env: Any, **extra: Any) -> JSON:
    """A Stack of the test program in ``repo``, on the test's file:// backend."""
    env = pulumi_env.env
    return {
        "stack": "dev",
        "projectRepo": repo.http_url,
        "branch": "main",
        "gitAuth": {
            "basicAuth": {
                "userName": secret("git", "username"),
                "password": secret("git", "password"),
            }
        },
        "config": {"directory": str(pulumi_env.files_dir)},
        "secretsRef": {"token": secret("pulumi", "token")},
        "envRefs": {
            "PULUMI_BACKEND_URL": literal(env["PULUMI_BACKEND_URL"]),
            "PULUMI_CONFIG_PASSPHRASE": secret("pulumi", "passphrase"),
            "PULUMI_HOME": literal(env["PULUMI_HOME"]),
            "PULUMI_SKIP_UPDATE_CHECK": literal("true"),
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": literal("true"),
            "PULUMI_PYTHON_CMD": literal(sys.executable),
        },
        **extra,
    }


def pulumi_env_writer(image: str, secret_name: str, **extra: Any) -> JSON:
    """PKO's init container of its dynamic-environment test manifest: it appends
    ``PULUMI_CONFIG_PASSPHRASE`` (key ``passphrase`` of Secret ``secret_name``) to
    ``$PULUMI_ENV`` on the ``share`` volume; ``extra`` adds container fields."""
    from_secret = {"secretKeyRef": {"name": secret_name, "key": "passphrase"}}
    return {
        "name": "extra",
        "image": image,
        "command": [
            "sh",
            "-c",
            'echo "PULUMI_CONFIG_PASSPHRASE=$FROM_VAULT" >> $PULUMI_ENV\n'
            "echo 'Wrote dynamic environment variables'",
        ],
        "env": [{"name": "FROM_VAULT", "valueFrom": from_secret}],
        "volumeMounts": [{"name": "share", "mountPath": "/share"}],
        **extra,
    }


def create_secret(kube: Kube, namespace: str, name: str, data: Mapping[str, str]) -> None:
    """An Opaque Secret with ``data`` (plain strings, encoded here)."""
    kube.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        },
        namespace,
    )


def set_passphrase(kube: Kube, namespace: str, passphrase: str) -> None:
    """The backend passphrase ``stack_spec``'s Stacks read (Secret ``pulumi``): a wrong one
    fails their next Pulumi operation."""
    encoded = base64.b64encode(passphrase.encode()).decode()
    kube.merge_patch(SECRETS, "pulumi", {"data": {"passphrase": encoded}}, namespace)


def request_reconcile(kube: Kube, namespace: str, name: str, request: str) -> None:
    """Set the Stack's reconcile-request annotation: a new run, or a failed one again."""
    kube.merge_patch(
        STACKS,
        name,
        {"metadata": {"annotations": {RECONCILE_REQUEST_ANNOTATION: request}}},
        namespace,
    )


def seconds(timestamp: str) -> float:
    """An API timestamp as seconds since the epoch."""
    parsed = parse_time(timestamp)
    assert parsed is not None, timestamp
    return parsed.timestamp()


def applied_at(stack: JSON) -> float:
    """When ``apply_stack`` last applied ``stack``'s spec (the API server's record)."""
    [entry] = [
        m
        for m in stack["metadata"]["managedFields"]
        if m["manager"] == FIELD_MANAGER_CLI and not m.get("subresource")
    ]
    return seconds(entry["time"])


def stack_jobs(kube: Kube, namespace: str, name: str) -> list[JSON]:
    jobs, _ = kube.list_objects(JOBS, namespace, label_selector=f"{STACK_LABEL}={name}")
    return sorted(jobs, key=lambda j: j["metadata"]["creationTimestamp"])


def wait_other_job(kube: Kube, namespace: str, name: str, job: str, timeout: float = 300) -> JSON:
    """The Stack's first Job not named ``job``, once there is one (the run replacing it)."""
    others: list[JSON] = []

    def found() -> bool:
        others[:] = [j for j in stack_jobs(kube, namespace, name) if j["metadata"]["name"] != job]
        return bool(others)

    wait_until(found, timeout=timeout, what=f"a run of Stack {namespace}/{name} other than {job}")
    return others[0]


def last_update(stack: JSON) -> JSON:
    return dict((stack.get("status") or {}).get("lastUpdate") or {})


def settled(stack: JSON) -> bool:
    """The end state every fault must lead to: Ready for the current generation, or a failed
    last run whose message names the cause — and in either case no longer Reconciling."""
    if condition(stack, "Reconciling").get("status") == "True":
        return False
    update = last_update(stack)
    return ready(stack) or (update.get("state") == "failed" and bool(update.get("message")))
