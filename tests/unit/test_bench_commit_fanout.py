"""bench/commit_fanout.py's own logic: the rate-limit bound it prints, its latency summary,
and the repository it pushes to, read by the controller's own ``ls-remote``."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from pkobatch.controller.polling import LS_REMOTE_TIMEOUT, ls_remote
from pkobatch.controller.push import Push, branch_ref, read_push, repository_identity, verify

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # it imports bench/fanout.py as the script does
    return importlib.import_module("commit_fanout")


def test_the_bound_spends_the_burst_first_then_the_qps(bench: ModuleType) -> None:
    assert bench.rate_limit_bound(4200, 100, 200) == 40.0
    assert bench.rate_limit_bound(150, 100, 200) == 0.0
    assert bench.rate_limit_bound(300, 50, 0) == 6.0


def test_the_summary_times_the_fanout_from_the_first_job_to_the_last(
    bench: ModuleType,
) -> None:
    latencies = tuple(float(second) for second in range(10, 111))  # 10 s .. 110 s
    result = bench.CommitFanout(latencies)
    assert (result.first, result.last, result.fanout) == (10.0, 110.0, 100.0)
    assert result.summary() == "first 10.00s, p50 60.00s, p99 109.00s, last 110.00s"


def test_each_pushed_commit_is_the_head_the_controller_polls(
    bench: ModuleType, tmp_path: Path
) -> None:
    repo = bench.Repository(tmp_path)
    heads = [repo.push_commit(f"commit {index}") for index in range(2)]
    assert heads[0] != heads[1]
    assert ls_remote(repo.url, branch_ref(bench.BRANCH), None, LS_REMOTE_TIMEOUT) == heads[1]


def test_the_webhook_it_posts_verifies_and_names_the_stacks_repository(
    bench: ModuleType, tmp_path: Path
) -> None:
    repo = bench.Repository(tmp_path)
    webhook = bench.Webhook(port=1, secret="bench-secret")
    body, headers = webhook.signed(repo.url, bench.BRANCH)
    lowered = {name.lower(): value for name, value in headers.items()}
    verify("generic", b"bench-secret", lowered, body)
    assert read_push("generic", lowered, body) == Push(
        frozenset({repository_identity(repo.url)}), branch_ref(bench.BRANCH)
    )
