"""Leader election on a real Lease: optimistic concurrency, skew tolerance, release, lost
lease; and two controller processes of which only the leader acts, with hand-over when the
leader is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pkobatch.api.timestamps import format_micro_time
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import LEASES, STACKS, Kube
from pkobatch.runtime.leader import LeaderElector

LEASE = "pkobatch-test"


def elector(kube: Kube, namespace: str, identity: str, duration: float = 3.0) -> LeaderElector:
    return LeaderElector(
        kube,
        namespace=namespace,
        name=LEASE,
        identity=identity,
        lease_duration=duration,
        renew_deadline=duration * 2 / 3,
        retry_period=duration / 6,
    )


def holder(kube: Kube, namespace: str) -> str:
    return str(kube.get(LEASES, LEASE, namespace)["spec"].get("holderIdentity") or "")


def test_one_winner_and_takeover_only_after_local_expiry(kube: Kube, namespace: str) -> None:
    a, b = elector(kube, namespace, "a"), elector(kube, namespace, "b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.try_acquire_or_renew(), "the holder renews"
    lease = kube.get(LEASES, LEASE, namespace)
    assert lease["spec"]["holderIdentity"] == "a"
    assert lease["spec"]["leaseDurationSeconds"] == 3
    # "a" stops renewing: "b" must wait a full lease duration after it last saw a change.
    seen_at = time.monotonic()
    assert not b.try_acquire_or_renew()
    wait_until(b.try_acquire_or_renew, timeout=30, interval=0.2, what="b takes over")
    assert time.monotonic() - seen_at >= 3.0
    lease = kube.get(LEASES, LEASE, namespace)
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1


@pytest.mark.parametrize("renewed_years_ago", [30, -70])
def test_expiry_ignores_the_holders_clock(
    kube: Kube, namespace: str, renewed_years_ago: int
) -> None:
    """A renewTime far in the past (or future) — another node's skewed clock — neither
    frees the lease early nor keeps it forever."""
    skewed = datetime.now(UTC).replace(year=datetime.now(UTC).year - renewed_years_ago)
    kube.create(
        LEASES,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEASE},
            "spec": {
                "holderIdentity": "skewed-node",
                "leaseDurationSeconds": 2,
                "renewTime": format_micro_time(skewed),
                "acquireTime": format_micro_time(skewed),
            },
        },
        namespace,
    )
    b = elector(kube, namespace, "b")
    first_seen = time.monotonic()
    assert not b.try_acquire_or_renew()
    wait_until(b.try_acquire_or_renew, timeout=30, interval=0.2, what="takeover")
    assert time.monotonic() - first_seen >= 2.0
    assert holder(kube, namespace) == "b"


def test_release_hands_over_at_once(kube: Kube, namespace: str) -> None:
    a, b = elector(kube, namespace, "a", duration=30), elector(kube, namespace, "b", duration=30)
    stop = threading.Event()
    assert a.acquire(stop)
    assert not b.try_acquire_or_renew()
    a.release()
    assert holder(kube, namespace) == ""
    assert b.try_acquire_or_renew()
    assert not a.is_leader


def test_leader_that_sees_another_holder_gives_up(kube: Kube, namespace: str) -> None:
    a = elector(kube, namespace, "a")
    stop = threading.Event()
    lost = threading.Event()
    assert a.acquire(stop)
    a.keep_renewing(stop, lost.set)
    try:
        lease = kube.get(LEASES, LEASE, namespace)
        lease["spec"]["holderIdentity"] = "intruder"
        lease["spec"]["leaseDurationSeconds"] = 3600
        kube.replace(LEASES, lease, namespace)
        assert lost.wait(30), "on_lost must be called"
        assert not a.is_leader
    finally:
        stop.set()


# -- two controller processes --------------------------------------------------------------

# A controller process with the real Manager and a reconciler that only records the keys
# it reconciles, each with whether the process led at that moment (one line per reconcile,
# "<key> leader" or "<key> standby", in the file named by argv[2]).
CONTROLLER = textwrap.dedent(
    """
    import sys
    from pkobatch.config import load_settings
    from pkobatch.kube.client import Kube
    from pkobatch.controller.composition import CONTROLLER_NAME, build_manager
    from pkobatch.runtime.interfaces import ReconcileResult
    from pkobatch.runtime.structured_logging import setup_logging
    from pkobatch.runtime.metrics import Metrics
    import signal

    identity, record = sys.argv[1], sys.argv[2]

    class Recorder:
        def reconcile(self, key):
            role = "leader" if manager.elector.is_leader else "standby"
            with open(record, "a") as f:
                f.write(f"{key} {role}\\n")
            return ReconcileResult()

    settings = load_settings(metrics_addr="0", health_addr="0")
    setup_logging("info", "json")
    manager = build_manager(
        Kube.connect(), settings, Metrics(CONTROLLER_NAME), lambda *a: Recorder(), identity=identity
    )
    signal.signal(signal.SIGTERM, lambda *_: manager.stop())
    manager.run()
    """
)


class Controllers:
    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.env = env
        self.workdir = workdir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, identity: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{identity}.log", "wb")  # noqa: SIM115 - lives with the process
        process = subprocess.Popen(
            [sys.executable, "-c", CONTROLLER, identity, str(self.record(identity))],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes[identity] = process
        return process

    def record(self, identity: str) -> Path:
        return self.workdir / f"{identity}.keys"

    def reconciled(self, identity: str, role: str | None = None) -> list[str]:
        """The keys ``identity`` reconciled (only those while it was ``role``)."""
        path = self.record(identity)
        lines = path.read_text().splitlines() if path.exists() else []
        records = [line.split() for line in lines]
        return [key for key, as_role in records if role is None or as_role == role]

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(30)


@pytest.fixture
def controllers(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[Controllers]:
    env = cluster.env(
        PKOBATCH_NAMESPACES=namespace,
        PKOBATCH_LEADER_ELECTION__ENABLED="true",
        PKOBATCH_LEADER_ELECTION__LEASE_NAME=LEASE,
        PKOBATCH_LEADER_ELECTION__LEASE_NAMESPACE=namespace,
        PKOBATCH_LEADER_ELECTION__LEASE_DURATION="4s",
        PKOBATCH_LEADER_ELECTION__RENEW_DEADLINE="3s",
        PKOBATCH_LEADER_ELECTION__RETRY_PERIOD="1s",
    )
    env.pop("PKOBATCH_KUBECONFIG", None)
    group = Controllers(env, tmp_path)
    yield group
    group.stop_all()


def create_stack(kube: Kube, namespace: str, name: str) -> None:
    kube.create(
        STACKS,
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": name},
            "spec": {
                "stack": f"org/{name}/dev",
                "projectRepo": "https://example.com/r",
                "branch": "main",
            },
        },
        namespace,
    )


def test_only_the_leader_acts_and_a_killed_leader_is_replaced(
    kube: Kube, namespace: str, controllers: Controllers
) -> None:
    first = controllers.start("first")
    wait_until(
        lambda: (
            kube.get_or_none(LEASES, LEASE, namespace) is not None
            and holder(kube, namespace) == "first"
        ),
        timeout=60,
        what="first controller to lead",
    )
    second = controllers.start("second")
    create_stack(kube, namespace, "s1")
    key1 = f"{namespace}/s1"
    wait_until(lambda: key1 in controllers.reconciled("first"), timeout=60, what="leader acts")
    assert second.poll() is None

    first.send_signal(signal.SIGKILL)
    first.wait(30)
    create_stack(kube, namespace, "s2")
    wait_until(
        lambda: f"{namespace}/s2" in controllers.reconciled("second"),
        timeout=120,
        what="standby to take over and act",
    )
    # The standby stood by from its start until the lease of the killed leader expired: a
    # reconcile in that time (of s1, which existed all along) would be recorded as "standby".
    assert controllers.reconciled("second", "standby") == []
    assert controllers.reconciled("first", "standby") == []
    assert key1 in controllers.reconciled("second"), "the new leader re-lists everything"
    assert holder(kube, namespace) == "second"

    second.send_signal(signal.SIGTERM)
    assert second.wait(60) == 0
    assert holder(kube, namespace) == "", "graceful shutdown releases the lease"


def test_a_leader_whose_lease_is_taken_exits_with_status_1(
    kube: Kube, namespace: str, controllers: Controllers
) -> None:
    process = controllers.start("only")
    wait_until(
        lambda: (
            kube.get_or_none(LEASES, LEASE, namespace) is not None
            and holder(kube, namespace) == "only"
        ),
        timeout=60,
        what="controller to lead",
    )
    lease = kube.get(LEASES, LEASE, namespace)
    lease["spec"]["holderIdentity"] = "intruder"
    lease["spec"]["leaseDurationSeconds"] = 3600
    kube.replace(LEASES, lease, namespace)
    assert process.wait(60) == 1
    assert holder(kube, namespace) == "intruder"
    assert os.path.getsize(controllers.workdir / "only.log") > 0
