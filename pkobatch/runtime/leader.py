"""Leader election on a coordination.k8s.io/v1 Lease (client-go's algorithm, ~100 lines).

- Writes carry the Lease's resourceVersion, so two candidates can never both win a round
  (the loser gets 409 Conflict).
- Expiry is judged by the *local* monotonic time at which this process last saw the lease
  record change, never by comparing ``renewTime`` with the local clock: clocks of different
  nodes may disagree, but durations measured on one node are reliable.
- A leader that cannot renew within ``renew_deadline`` (or sees another holder) calls
  ``on_lost`` at once; the manager's default exits the process (status 1) so that nothing
  keeps acting on a lease another replica may already hold — the Deployment restarts it.
- On graceful shutdown the leader releases the lease (empty ``holderIdentity``), so a
  successor takes over without waiting for the lease to expire.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from pkobatch.api.objects import JSON
from pkobatch.api.timestamps import format_micro_time
from pkobatch.kube.client import LEASES, AlreadyExists, Conflict, Kube, KubeError, NotFound
from pkobatch.runtime.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    lease_seconds: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def of(cls, lease: JSON) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )


def claim(
    current: LeaseRecord | None,
    *,
    identity: str,
    expired: bool,
    lease_seconds: int,
    now: datetime,
) -> JSON | None:
    """The Lease spec that makes ``identity`` the holder, or None when another candidate
    holds an unexpired lease."""
    if current is not None and current.holder not in ("", identity) and not expired:
        return None
    renewing = current is not None and current.holder == identity
    stamp = format_micro_time(now)
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": lease_seconds,
        "acquireTime": current.acquire_time if renewing and current else stamp,
        "renewTime": stamp,
        "leaseTransitions": (
            (current.transitions if renewing else current.transitions + 1) if current else 0
        ),
    }


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float,
        renew_deadline: float,
        retry_period: float,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError(
                "leader election needs retry_period < renew_deadline < lease_duration "
                f"(got {retry_period}s, {renew_deadline}s, {lease_duration}s)"
            )
        self._kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._lease_seconds = max(1, round(lease_duration))
        self._renew_deadline = renew_deadline
        self._retry_period = retry_period
        self._metrics = metrics
        self._clock = clock
        self._wall_clock = wall_clock
        self._timeout = (min(5.0, renew_deadline / 3), max(1.0, renew_deadline / 3))
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self.is_leader = False
        self._renewer: threading.Thread | None = None

    def _path(self) -> str:
        return LEASES.path(self.namespace, self.name)

    def _observe(self, record: LeaseRecord) -> None:
        if record != self._observed:
            self._observed = record
            self._observed_at = self._clock()

    def try_acquire_or_renew(self) -> bool:
        """One election round; True when this candidate holds the lease afterwards."""
        try:
            lease = self._kube.request("GET", self._path(), timeout=self._timeout)
        except NotFound:
            return self._create()
        except KubeError as exc:
            log.warning("cannot read lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        record = LeaseRecord.of(lease)
        self._observe(record)
        expired = self._clock() >= self._observed_at + record.lease_seconds
        spec = self._claim(record, expired=expired)
        if spec is None:
            return False
        lease["spec"] = spec
        return self._write("PUT", self._path(), lease, lost=Conflict, action="update")

    def _create(self) -> bool:
        body = {
            "apiVersion": LEASES.api_version,
            "kind": LEASES.kind,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": self._claim(None, expired=True),
        }
        return self._write(
            "POST", LEASES.path(self.namespace), body, lost=AlreadyExists, action="create"
        )

    def _claim(self, current: LeaseRecord | None, *, expired: bool) -> JSON | None:
        return claim(
            current,
            identity=self.identity,
            expired=expired,
            lease_seconds=self._lease_seconds,
            now=self._wall_clock(),
        )

    def _write(
        self, method: str, path: str, lease: JSON, *, lost: type[KubeError], action: str
    ) -> bool:
        """Write the claimed lease; False when another candidate won the race (``lost``) or
        the API server failed."""
        try:
            written = self._kube.request(method, path, body=lease, timeout=self._timeout)
        except lost:
            return False
        except KubeError as exc:
            log.warning("cannot %s lease %s/%s: %s", action, self.namespace, self.name, exc)
            return False
        self._observe(LeaseRecord.of(written))
        return True

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this candidate leads (True) or ``stop`` is set (False)."""
        log.info("waiting for leadership of lease %s/%s", self.namespace, self.name)
        while not stop.is_set():
            if self.try_acquire_or_renew():
                self._set_leader(True)
                log.info(
                    "became leader of lease %s/%s as %s", self.namespace, self.name, self.identity
                )
                return True
            stop.wait(self._retry_period * random.uniform(1.0, 1.2))
        return False

    def keep_renewing(self, stop: threading.Event, on_lost: Callable[[], None]) -> None:
        """Renew every retry period in a thread until ``stop``; ``on_lost()`` when a renew
        deadline passes without success or another candidate took the lease."""

        def renew() -> None:
            last_renewed = self._clock()
            while not stop.wait(self._retry_period):
                if self.try_acquire_or_renew():
                    last_renewed = self._clock()
                    continue
                holder = self._observed.holder if self._observed else ""
                if holder not in ("", self.identity):
                    reason = f"lease is now held by {holder}"
                elif self._clock() - last_renewed > self._renew_deadline:
                    reason = f"no successful renewal for {self._renew_deadline:g}s"
                else:
                    continue
                self._set_leader(False)
                log.error("lost leadership of lease %s/%s: %s", self.namespace, self.name, reason)
                on_lost()
                return

        self._renewer = threading.Thread(target=renew, name="lease-renewer", daemon=True)
        self._renewer.start()

    def release(self) -> None:
        """Give the lease up (after stopping the renewer) so a successor need not wait."""
        if self._renewer is not None:
            self._renewer.join(self._renew_deadline)
        if not self.is_leader:
            return
        self._set_leader(False)
        try:
            lease = self._kube.request("GET", self._path(), timeout=self._timeout)
            if LeaseRecord.of(lease).holder != self.identity:
                return
            lease["spec"] = {
                **lease.get("spec", {}),
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": format_micro_time(self._wall_clock()),
            }
            self._kube.request("PUT", self._path(), body=lease, timeout=self._timeout)
            log.info("released lease %s/%s", self.namespace, self.name)
        except KubeError as exc:
            log.warning("cannot release lease %s/%s: %s", self.namespace, self.name, exc)

    def _set_leader(self, leading: bool) -> None:
        self.is_leader = leading
        if self._metrics:
            self._metrics.set_leader(self.name, leading)
