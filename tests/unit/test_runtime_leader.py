"""Leader election decisions (the Lease round trips are tested against the real API
server in tests/integration/test_leader_election.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pkobatch.api.timestamps import format_micro_time
from pkobatch.runtime.leader import LeaderElector, LeaseRecord, claim

NOW = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def record(holder: str, transitions: int = 3) -> LeaseRecord:
    return LeaseRecord(
        holder=holder,
        lease_seconds=15,
        acquire_time="2026-03-01T11:00:00.000000Z",
        renew_time="2026-03-01T11:59:59.000000Z",
        transitions=transitions,
    )


def test_first_claim_creates_a_record() -> None:
    assert claim(None, identity="me", expired=True, lease_seconds=15, now=NOW) == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-03-01T12:00:00.123456Z",
        "renewTime": "2026-03-01T12:00:00.123456Z",
        "leaseTransitions": 0,
    }


def test_another_holders_unexpired_lease_is_respected() -> None:
    assert claim(record("other"), identity="me", expired=False, lease_seconds=15, now=NOW) is None


def test_expired_lease_is_taken_over_with_a_transition() -> None:
    spec = claim(record("other"), identity="me", expired=True, lease_seconds=15, now=NOW)
    assert spec is not None
    assert spec["holderIdentity"] == "me"
    assert spec["leaseTransitions"] == 4
    assert spec["acquireTime"] == format_micro_time(NOW)


def test_released_lease_is_free_at_once() -> None:
    spec = claim(record(""), identity="me", expired=False, lease_seconds=15, now=NOW)
    assert spec is not None and spec["leaseTransitions"] == 4


def test_renewal_keeps_acquire_time_and_transitions() -> None:
    spec = claim(record("me"), identity="me", expired=False, lease_seconds=15, now=NOW)
    assert spec is not None
    assert spec["acquireTime"] == "2026-03-01T11:00:00.000000Z"
    assert spec["renewTime"] == format_micro_time(NOW)
    assert spec["leaseTransitions"] == 3


def test_timings_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="retry_period < renew_deadline < lease_duration"):
        LeaderElector(
            None,  # type: ignore[arg-type]
            namespace="ns",
            name="l",
            identity="me",
            lease_duration=10,
            renew_deadline=10,
            retry_period=2,
        )
