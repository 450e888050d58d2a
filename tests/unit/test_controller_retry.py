"""pkobatch.controller.retry: PKO's timing rules (resync period, failure backoff, isSynced)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pkobatch.api.stack.base import MAX_SPEC_SECONDS
from pkobatch.api.stack.spec import StackSpec
from pkobatch.config import Settings
from pkobatch.controller.retry import cooldown, resting_state, resync_frequency, same_commit

NOW = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)


def spec(**fields: Any) -> StackSpec:
    return StackSpec.model_validate({"stack": "dev", **fields})


def test_resync_frequency_has_pkos_minimum() -> None:
    assert resync_frequency(spec()) == timedelta(seconds=60)
    assert resync_frequency(spec(resyncFrequencySeconds=5)) == timedelta(seconds=60)
    assert resync_frequency(spec(resyncFrequencySeconds=300)) == timedelta(seconds=300)


def test_out_of_bounds_seconds_are_clamped_never_overflow() -> None:
    # A spec stored before the CRD bounded these fields bypasses validation.
    huge = 2**63 - 1
    for value in (huge, -huge - 1):
        stored = StackSpec.model_construct(
            stack="dev",
            resync_frequency_seconds=value,
            retry_max_backoff_duration_seconds=value,
        )
        assert resync_frequency(stored) <= timedelta(seconds=MAX_SPEC_SECONDS)
        assert NOW + cooldown(40, stored, Settings()) > NOW
    assert cooldown(
        9,
        StackSpec.model_construct(stack="dev", retry_max_backoff_duration_seconds=huge),
        Settings(),
    ) == timedelta(seconds=min(10 * 3**9, MAX_SPEC_SECONDS))


def test_pko_backoff_ignores_a_negative_cap_and_waits_the_base_first() -> None:
    settings = Settings()
    negative = spec(retryMaxBackoffDurationSeconds=-1)
    assert [cooldown(n, negative, settings).total_seconds() for n in range(3)] == [10, 30, 90]
    low = spec(retryMaxBackoffDurationSeconds=4)
    assert [cooldown(n, low, settings).total_seconds() for n in range(3)] == [10, 4, 4]
    twenty = spec(retryMaxBackoffDurationSeconds=20)
    assert [cooldown(n, twenty, settings).total_seconds() for n in range(3)] == [10, 20, 20]


def test_cooldown_is_base_times_three_to_the_failures_capped() -> None:
    settings = Settings()
    assert [cooldown(n, spec(), settings).total_seconds() for n in range(4)] == [10, 30, 90, 270]
    assert cooldown(30, spec(), settings) == timedelta(hours=24)
    assert cooldown(5, spec(retryMaxBackoffDurationSeconds=100), settings) == timedelta(seconds=100)
    fast = Settings(retry={"base": "1s", "cap": "5s"})
    assert cooldown(3, spec(), fast) == timedelta(seconds=5)


def test_same_commit() -> None:
    assert same_commit("abc1234", "abc1234" + "0" * 33)
    assert not same_commit("abc", "abd")
    assert same_commit("", "")
    assert not same_commit("", "abc")
    # Program generations and Flux revisions match only exactly.
    assert not same_commit("1", "12")
    assert not same_commit("main@sha1:abc1234", "main@sha1:abc1234ff")
    assert same_commit("7", "7")


def test_failures_a_retry_cannot_fix_stall_at_once_with_their_own_reason() -> None:
    settings = Settings()
    for reason, stalled in (
        ("InvalidSpec", "SpecInvalid"),
        ("PulumiVersionTooLow", "PulumiVersionTooLow"),
    ):
        last = {"state": "failed", "reason": reason, "message": "m", "failures": 0}
        resting = resting_state(last, settings)  # type: ignore[arg-type]
        assert (resting.kind, resting.reason) == ("stalled", stalled)
        assert resting.message.endswith("Error: m")
    last = {"state": "failed", "reason": "ProgramError", "message": "m", "failures": 0}
    assert resting_state(last, settings).kind == "retrying"  # type: ignore[arg-type]
