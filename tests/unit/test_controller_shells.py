"""The controller's shared pieces outside ``decide``: merge patches, the run-slot admission,
the prerequisite index, the branch poller (with a fake ``ls-remote`` and clock), and the
events' shape. The API side of these is covered by tests/integration/test_controller_*.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from pkobatch.config import Settings
from pkobatch.controller.act import merge_patch
from pkobatch.controller.decision import SourceHead
from pkobatch.controller.events import MAX_NOTE_CHARS, event_body
from pkobatch.controller.job_builder import builtin_template
from pkobatch.controller.polling import (
    CredentialRef,
    GitCredentials,
    GitPoller,
    PollError,
    PollKey,
    poll_key,
    scrub,
)
from pkobatch.controller.reconcile import Admission, Dependents, TemplateInvalid, load_template
from pkobatch.controller.stores import StackKey

A, B, C, D = (StackKey("ns", n) for n in "abcd")


def test_merge_patch_is_minimal_and_removes_keys() -> None:
    old = {"a": 1, "b": {"x": 1, "y": 2}, "c": [1], "gone": {"z": 1}}
    new = {"a": 1, "b": {"x": 1, "y": 3}, "c": [1, 2], "added": None}
    assert merge_patch(old, new) == {"b": {"y": 3}, "c": [1, 2], "gone": None, "added": None}
    assert merge_patch(old, old) == {}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_admission_caps_active_jobs_and_serves_the_oldest_waiter_first() -> None:
    woken: list[StackKey] = []
    clock = Clock()
    admission = Admission(2, woken.append, clock)
    assert admission.acquire(A)
    admission.track(A, "a-job")
    assert admission.acquire(B)
    clock.now = 1
    assert not admission.acquire(C)  # full: C waits
    clock.now = 2
    assert not admission.acquire(D)  # D waits behind C
    assert admission.waiting() == 2
    admission.track(B, None)  # B's run reserved a slot but it never showed; still counted
    admission.track(A, None)  # A's Job finished: one slot free
    assert woken == [C]
    assert not admission.acquire(D)  # D may not jump the queue
    assert admission.acquire(C)
    assert admission.waiting() == 1


def test_a_waiter_that_no_longer_needs_a_slot_does_not_hold_up_others() -> None:
    clock = Clock()
    admission = Admission(1, lambda key: None, clock)
    assert admission.acquire(A)
    admission.track(A, "a-job")
    assert not admission.acquire(B)
    clock.now = 1
    assert not admission.acquire(C)
    admission.withdraw(B)  # e.g. B was suspended meanwhile
    admission.track(A, None)
    assert admission.acquire(C)


def test_admission_reservations_expire() -> None:
    clock = Clock()
    admission = Admission(1, lambda key: None, clock)
    assert admission.acquire(A)
    assert not admission.acquire(B)
    clock.now = 61
    assert admission.acquire(B)


def test_admission_seeds_running_jobs() -> None:
    admission = Admission(1, lambda key: None)
    running = {"metadata": {"name": "a-up-1", "namespace": "ns"}, "status": {}}
    done = {
        "metadata": {"name": "b-up-1", "namespace": "ns"},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    admission.seed([running, done], lambda job: StackKey("ns", job["metadata"]["name"][0]))
    assert not admission.acquire(C)


def test_dependents_follow_spec_changes() -> None:
    index = Dependents()
    index.record(A, ["b", "c"])
    index.record(D, ["b"])
    assert index.of(B) == [A, D]
    index.record(A, ["c"])
    assert index.of(B) == [D]
    assert index.of(C) == [A]


def test_template_file_problems_are_reported(tmp_path: Any) -> None:
    with pytest.raises(TemplateInvalid, match="cannot read"):
        load_template(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Pod\n")
    with pytest.raises(TemplateInvalid, match="kind: Job"):
        load_template(str(bad))
    assert load_template("")["kind"] == "Job"


def test_event_body_is_bounded_and_names_the_stack() -> None:
    stack = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": "app", "namespace": "ns", "uid": "u", "resourceVersion": "7"},
    }
    body = event_body(stack, "Warning", "StackUpdateFailure", "x" * 5000, datetime.now(UTC), "pod")
    assert len(body["note"]) == MAX_NOTE_CHARS
    assert body["regarding"]["uid"] == "u" and body["metadata"]["namespace"] == "ns"
    assert body["metadata"]["name"].startswith("app.")


# ---------------------------------------------------------------------------------------
# Branch polling
# ---------------------------------------------------------------------------------------


def test_poll_key_identifies_credentials_by_reference() -> None:
    key = poll_key(
        "ns",
        {
            "projectRepo": "https://g/x.git",
            "branch": "main",
            "gitAuth": {"accessToken": {"type": "Secret", "secret": {"name": "git", "key": "t"}}},
        },
    )
    assert key == PollKey(
        "https://g/x.git",
        "refs/heads/main",
        GitCredentials(
            "token", "ns", username=CredentialRef(literal="git"), password=CredentialRef("git", "t")
        ),
    )
    assert poll_key("ns", {"projectRepo": "https://g/x.git", "commit": "abc"}) is None
    assert poll_key("ns", {"stack": "dev"}) is None


def test_scrub_removes_credentials_from_urls() -> None:
    text = "fatal: unable to access 'https://bot:s3cret@git.example/x.git/': 403\n"
    assert "s3cret" not in scrub(text) and "git.example" in scrub(text)


BARRIER = "https://g/barrier.git"


class FakeGit:
    """``ls-remote`` of the repositories' heads; ``gate`` holds every call while closed.
    ``calls`` counts the calls for every repository but ``settle``'s."""

    def __init__(self) -> None:
        self.heads = {"refs/heads/main": "1" * 40}
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, url: str, ref: str, creds: Any, timeout: float) -> str:
        self.gate.wait(10)
        if url != BARRIER:
            self.calls += 1
        if ref not in self.heads:
            raise PollError(f"{ref} does not exist in the repository")
        return self.heads[ref]


def poller_of(git: FakeGit, clock: Clock, woken: list[StackKey]) -> GitPoller:
    """A poller running one fetch at a time, in the order they start (what ``settle`` needs)."""
    return GitPoller(None, 60.0, woken.append, fetch=git, clock=clock, max_parallel=1)  # type: ignore[arg-type]


def wait_for(condition: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def settle(poller: GitPoller, woken: list[StackKey]) -> None:
    """Wait until every fetch started so far has finished and woken its Stacks: a fetch of a
    new repository, started now, runs after them (one at a time, in order) and wakes its
    Stack last. Its wake-up is taken out of ``woken`` again."""
    barrier = StackKey("barrier", f"b{len(woken)}")
    poller.head(barrier, PollKey(BARRIER, "refs/heads/main", None))
    poller.poll_due()
    wait_for(lambda: barrier in woken)
    poller.forget(barrier)
    woken.remove(barrier)


def test_many_stacks_share_one_ls_remote_per_interval() -> None:
    git = FakeGit()
    woken: list[StackKey] = []
    clock = Clock()
    poller = poller_of(git, clock, woken)
    key = PollKey("https://g/x.git", "refs/heads/main", None)
    stacks = [StackKey("ns", f"s{i}") for i in range(200)]
    for stack in stacks:
        assert poller.head(stack, key) == SourceHead()
    poller.poll_due()
    wait_for(lambda: len(woken) == 200)
    assert git.calls == 1 == poller.calls
    assert {s: poller.head(s, key) for s in stacks} == dict.fromkeys(stacks, SourceHead("1" * 40))
    clock.now = 30
    poller.poll_due()
    settle(poller, woken)
    assert git.calls == 1
    clock.now = 60
    poller.poll_due()
    settle(poller, woken)
    assert git.calls == 2
    assert len(woken) == 200  # same head: nobody is woken
    git.heads["refs/heads/main"] = "2" * 40
    clock.now = 120
    poller.poll_due()
    wait_for(lambda: len(woken) == 400)
    assert poller.head(stacks[0], key).commit == "2" * 40
    poller.stop()


def test_a_poll_in_flight_is_not_repeated_and_never_blocks_head() -> None:
    git = FakeGit()
    git.gate.clear()
    woken: list[StackKey] = []
    clock = Clock()
    poller = poller_of(git, clock, woken)
    key = PollKey("https://g/x.git", "refs/heads/main", None)
    poller.head(A, key)
    poller.poll_due()
    clock.now = 120
    poller.poll_due()
    assert poller.head(B, key) == SourceHead()
    # A head() waiting for the fetch would have returned only after the gate's timeout let
    # the fetch through.
    assert git.calls == 0
    git.gate.set()
    settle(poller, woken)
    assert git.calls == 1
    poller.stop()


def test_poll_errors_are_reported_per_key() -> None:
    git = FakeGit()
    woken: list[StackKey] = []
    poller = poller_of(git, Clock(), woken)
    missing = PollKey("https://g/x.git", "refs/heads/nope", None)
    poller.head(A, missing)
    poller.poll_due()
    wait_for(lambda: woken == [A])
    assert poller.head(A, missing) == SourceHead(
        error="refs/heads/nope does not exist in the repository"
    )
    poller.stop()


def test_a_refusal_of_the_credentials_is_flagged_in_the_head() -> None:
    refusal = "fatal: Authentication failed for 'https://g/x.git/'"

    def refusing(url: str, ref: str, creds: Any, timeout: float) -> str:
        raise PollError(refusal, credentials_refused=True)

    woken: list[StackKey] = []
    poller = GitPoller(None, 60.0, woken.append, fetch=refusing, clock=Clock())  # type: ignore[arg-type]
    key = PollKey("https://g/x.git", "refs/heads/main", None)
    poller.head(A, key)
    poller.poll_due()
    wait_for(lambda: woken == [A])
    assert poller.head(A, key) == SourceHead(error=refusal, credentials_refused=True)
    poller.stop()


def test_longer_resync_frequency_slows_a_key_down() -> None:
    git = FakeGit()
    woken: list[StackKey] = []
    clock = Clock()
    poller = poller_of(git, clock, woken)
    key = PollKey("https://g/x.git", "refs/heads/main", None)
    poller.head(A, key, resync_seconds=600)
    poller.poll_due()
    wait_for(lambda: git.calls == 1)
    clock.now = 120
    poller.poll_due()
    settle(poller, woken)
    assert git.calls == 1
    poller.head(B, key)  # a Stack without a preference: the key goes back to 60 s
    poller.poll_due()
    wait_for(lambda: git.calls == 2)
    poller.stop()


def test_a_change_gets_a_head_fetched_after_it_shared_by_every_stack_asking() -> None:
    git = FakeGit()
    woken: list[StackKey] = []
    clock = Clock()
    poller = poller_of(git, clock, woken)
    key = PollKey("https://g/x.git", "refs/heads/main", None)
    poller.head(A, key)
    poller.poll_due()
    wait_for(lambda: woken == [A])
    git.heads["refs/heads/main"] = "2" * 40
    clock.now = 30  # the cached head ("1"...) is 30 s old
    assert poller.head(A, key) == SourceHead("1" * 40)  # polling alone: the cache is fine
    # B and C are new (their first run awaits): no answer older than their ask.
    assert poller.head(B, key, fresh_for=(1, "")) == SourceHead()
    assert poller.head(C, key, fresh_for=(1, "")) == SourceHead()
    poller.poll_due()
    wait_for(lambda: len(woken) == 4)
    assert git.calls == 2  # one ls-remote for both
    assert sorted(woken[1:]) == [A, B, C]  # the head moved: every subscriber
    assert poller.head(B, key, fresh_for=(1, "")) == SourceHead("2" * 40)
    clock.now = 40
    assert poller.head(B, key, fresh_for=(1, "")) == SourceHead("2" * 40)  # same change
    poller.poll_due()
    settle(poller, woken)
    assert git.calls == 2
    # A spec change of B (generation 2) needs a head newer than its moment again.
    assert poller.head(B, key, fresh_for=(2, "")) == SourceHead()
    poller.poll_due()
    wait_for(lambda: git.calls == 3)
    wait_for(lambda: woken[-1] == B)  # same head: only the waiting Stack is woken
    assert poller.head(B, key, fresh_for=(2, "")) == SourceHead("2" * 40)
    poller.stop()


def test_a_stack_asking_during_a_fetch_waits_for_the_next_one() -> None:
    git = FakeGit()
    git.gate.clear()
    woken: list[StackKey] = []
    clock = Clock()
    poller = poller_of(git, clock, woken)
    key = PollKey("https://g/x.git", "refs/heads/main", None)
    poller.head(A, key)
    poller.poll_due()  # started at t=0, blocked
    clock.now = 1
    assert poller.head(B, key, fresh_for=(1, "")) == SourceHead()
    git.gate.set()
    wait_for(lambda: git.calls == 1)
    wait_for(lambda: A in woken)
    assert poller.head(B, key, fresh_for=(1, "")) == SourceHead()  # that fetch was older
    poller.poll_due()
    wait_for(lambda: git.calls == 2)
    wait_for(lambda: B in woken)
    assert poller.head(B, key, fresh_for=(1, "")) == SourceHead("1" * 40)
    poller.stop()


def test_a_push_fetches_its_branch_now_and_only_for_the_stacks_following_it() -> None:
    git = FakeGit()
    woken: list[StackKey] = []
    clock = Clock()
    poller = poller_of(git, clock, woken)
    main = PollKey("https://g/x.git", "refs/heads/main", None)
    other = PollKey("https://g/x.git", "refs/heads/other", None)
    git.heads["refs/heads/other"] = "3" * 40
    poller.head(A, main)
    poller.head(B, other)
    poller.poll_due()
    wait_for(lambda: sorted(woken) == [A, B])
    git.heads["refs/heads/main"] = "2" * 40
    clock.now = 5  # far from the next poll (60 s)
    # The identity of the push's SSH URL matches the Stack's HTTPS projectRepo.
    assert poller.refresh(frozenset({"g/x"}), "refs/heads/main") == (2, 1)
    poller.poll_due()
    wait_for(lambda: len(woken) == 3)
    assert woken[-1] == A and git.calls == 3  # one more ls-remote, of main only
    assert poller.head(A, main) == SourceHead("2" * 40)
    assert poller.refresh(frozenset({"g/x"}), "refs/heads/gone") == (2, 0)
    assert poller.refresh(frozenset({"g/unknown"}), "refs/heads/main") == (0, 0)
    poller.poll_due()
    settle(poller, woken)
    assert git.calls == 3  # neither started a fetch
    poller.stop()


def test_a_push_during_a_fetch_gets_a_fetch_of_its_own() -> None:
    git = FakeGit()
    woken: list[StackKey] = []
    clock = Clock()
    poller = poller_of(git, clock, woken)
    key = PollKey("https://g/x.git", "refs/heads/main", None)
    poller.head(A, key)
    poller.poll_due()
    wait_for(lambda: woken == [A])
    git.gate.clear()
    clock.now = 60
    poller.poll_due()  # the interval's poll, started before the commit: held at the gate
    clock.now = 61
    git.heads["refs/heads/main"] = "2" * 40  # too late for the held fetch to be trusted
    assert poller.refresh(frozenset({"g/x"}), "refs/heads/main") == (1, 1)
    poller.poll_due()  # in flight: not started twice
    git.gate.set()
    wait_for(lambda: woken == [A, A])  # the held fetch is done (and saw the new head)
    poller.poll_due()
    wait_for(lambda: git.calls == 3)
    poller.poll_due()
    settle(poller, woken)
    assert git.calls == 3  # the push was served: no fourth fetch
    poller.stop()


def test_forgotten_stacks_are_not_polled_for() -> None:
    git = FakeGit()
    woken: list[StackKey] = []
    poller = poller_of(git, Clock(), woken)
    key = PollKey("https://g/x.git", "refs/heads/main", None)
    poller.head(A, key)
    poller.forget(A)
    poller.poll_due()
    settle(poller, woken)
    assert git.calls == 0
    assert woken == []
    poller.stop()


# ---------------------------------------------------------------------------------------
# Observe: the two cache gaps closed by a live read (a real server cannot be made to lag)
# ---------------------------------------------------------------------------------------


class LiveReads:
    """Answers ``get`` from a dict and lists of pods with ``pods``; records what was asked."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]], pods: Any = ()) -> None:
        self.objects = objects
        self.pods = pods
        self.asked: list[tuple[str, str]] = []

    def list_objects(
        self, resource: Any, namespace: str | None = None, **selectors: Any
    ) -> tuple[list[dict[str, Any]], str]:
        assert resource.plural == "pods"
        self.asked.append(("pods", selectors["label_selector"]))
        if isinstance(self.pods, Exception):
            raise self.pods
        return list(self.pods), "1"

    def get(self, resource: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        from pkobatch.kube.client import NotFound

        self.asked.append((resource.plural, name))
        if (resource.plural, name) not in self.objects:
            raise NotFound(404, "NotFound", name)
        return self.objects[(resource.plural, name)]


def observer_world(current: str, jobs: list[dict[str, Any]], live: LiveReads) -> Any:
    from pkobatch.controller.observe import Observer
    from pkobatch.controller.stores import Stores

    stores = Stores.empty()
    stores.stacks.upsert(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": "app", "namespace": "ns", "uid": "stack-uid"},
            "spec": {"stack": "dev"},
            "status": {"currentUpdate": {"name": current}},
        }
    )
    for job in jobs:
        stores.jobs.upsert(job)
    poller = GitPoller(None, 60.0, lambda key: None)  # type: ignore[arg-type]
    return Observer(live, stores, poller, Settings(), builtin_template())  # type: ignore[arg-type]


def job_of(name: str, uid: str = "stack-uid", done: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {"pkobatch.io/stack": "app"},
            "ownerReferences": [{"kind": "Stack", "name": "app", "uid": uid, "controller": True}],
        },
        "status": {"conditions": [{"type": "Complete", "status": "True"}]} if done else {},
    }


def test_observe_reads_a_current_job_the_cache_has_not_shown_yet() -> None:
    live = LiveReads({("jobs", "app-up-1"): job_of("app-up-1")})
    observed = observer_world("app-up-1", [], live).observe(
        StackKey("ns", "app"), datetime.now(UTC)
    )
    assert [j["metadata"]["name"] for j in observed.jobs] == ["app-up-1"]
    assert live.asked == [("jobs", "app-up-1")]


def test_observe_confirms_a_vanished_job_and_a_missing_result() -> None:
    live = LiveReads({})
    observed = observer_world("app-up-1", [], live).observe(
        StackKey("ns", "app"), datetime.now(UTC)
    )
    assert observed.jobs == []
    live = LiveReads({("configmaps", "app-up-2"): {"metadata": {"name": "app-up-2"}}})
    done = job_of("app-up-2", done=True)
    done["metadata"]["uid"] = "job-uid"
    observed = observer_world("app-up-2", [done], live).observe(
        StackKey("ns", "app"), datetime.now(UTC)
    )
    assert list(observed.results) == ["app-up-2"]
    assert live.asked[0] == ("configmaps", "app-up-2")


def test_observe_reads_the_pods_of_a_finished_run_which_vouch_for_its_result() -> None:
    from pkobatch.kube.client import Unreachable

    pod = {"metadata": {"name": "app-up-2-x"}}
    done = job_of("app-up-2", done=True)
    done["metadata"]["uid"] = "job-uid"
    live = LiveReads({}, pods=[pod])
    observed = observer_world("app-up-2", [done], live).observe(
        StackKey("ns", "app"), datetime.now(UTC)
    )
    assert observed.run_pods == {"app-up-2": [pod]}
    assert ("pods", "batch.kubernetes.io/controller-uid=job-uid") in live.asked
    # Unread pods would fold a genuine result as untrusted: the reconcile fails, and is
    # retried, instead.
    live = LiveReads({}, pods=Unreachable(0, "Unreachable", "down"))
    with pytest.raises(Unreachable):
        observer_world("app-up-2", [done], live).observe(StackKey("ns", "app"), datetime.now(UTC))
    # A running Job's pods are not read (its pod started in time).
    running = job_of("app-up-2")
    live = LiveReads({}, pods=[pod])
    observed = observer_world("app-up-2", [running], live).observe(
        StackKey("ns", "app"), datetime.now(UTC)
    )
    assert observed.run_pods == {} and live.asked == []


def test_observe_ignores_jobs_of_an_earlier_stack_with_the_same_name() -> None:
    live = LiveReads({})
    world = observer_world("", [job_of("app-up-old", uid="previous-uid"), job_of("app-up-1")], live)
    observed = world.observe(StackKey("ns", "app"), datetime.now(UTC))
    assert [j["metadata"]["name"] for j in observed.jobs] == ["app-up-1"]
    assert live.asked == []


class EventLists(LiveReads):
    """LiveReads that also answers ``list_objects`` with fixed Events."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        super().__init__({})
        self.events = events
        self.listed: list[tuple[str, str | None]] = []

    def list_objects(
        self, resource: Any, namespace: str | None = None, **selectors: Any
    ) -> tuple[list[dict[str, Any]], str]:
        self.listed.append((resource.plural, selectors.get("field_selector")))
        return self.events, "1"


def test_observe_asks_for_failed_create_events_only_for_a_current_job_without_pod() -> None:
    events = [
        {"message": "Error creating: older", "lastTimestamp": "2026-01-01T00:00:01Z"},
        {"message": 'serviceaccount "deployer" not found', "lastTimestamp": "2026-01-01T00:00:09Z"},
    ]
    stuck = job_of("app-up-1")
    stuck["metadata"].update(uid="job-uid", creationTimestamp="2026-01-01T00:00:00Z")
    live = EventLists(events)
    observed = observer_world("app-up-1", [stuck], live).observe(
        StackKey("ns", "app"), datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    )
    assert observed.pod_creation_failures == {"app-up-1": 'serviceaccount "deployer" not found'}
    assert live.listed == [("events", "involvedObject.uid=job-uid,reason=FailedCreate")]

    # Running with its pod ready: nothing to read (a not-ready one past 30 s gets its pods
    # read, not its Events).
    running = job_of("app-up-1")
    running["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    running["status"] = {"active": 1, "ready": 1}
    young = job_of("app-up-1")
    young["metadata"]["creationTimestamp"] = "2026-01-01T00:00:58Z"
    for job in (running, young):
        live = EventLists(events)
        observed = observer_world("app-up-1", [job], live).observe(
            StackKey("ns", "app"), datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
        )
        assert observed.pod_creation_failures == {} and live.listed == []


def test_a_run_awaits_a_change_until_a_run_for_it_is_recorded_or_in_progress() -> None:
    from pkobatch.controller.observe import run_awaited_for

    meta = {"generation": 2, "annotations": {"pulumi.com/reconciliation-request": "r"}}
    assert run_awaited_for({"metadata": meta}) == (2, "r")
    old = {"generation": 1, "reconcileRequest": "r"}
    now = {"generation": 2, "reconcileRequest": "r"}
    assert run_awaited_for({"metadata": meta, "status": {"lastUpdate": old}}) == (2, "r")
    assert run_awaited_for({"metadata": meta, "status": {"lastUpdate": now}}) is None
    status = {"lastUpdate": old, "currentUpdate": now}
    assert run_awaited_for({"metadata": meta, "status": status}) is None
    # A plan saved for the change (spec.approval) is its run until approved: the head it was
    # made at stays the answer, so the pending plan's status does not flicker.
    status = {"lastUpdate": old, "approval": {**now, "state": "Pending"}}
    assert run_awaited_for({"metadata": meta, "status": status}) is None


class FreshnessRecorder(GitPoller):
    def __init__(self) -> None:
        super().__init__(None, 60.0, lambda key: None)  # type: ignore[arg-type]
        self.asked: list[object | None] = []

    def head(
        self,
        stack: StackKey,
        key: PollKey,
        resync_seconds: float | None = None,
        fresh_for: object | None = None,
    ) -> SourceHead:
        self.asked.append(fresh_for)
        return SourceHead()


@pytest.mark.parametrize(("suspend", "fresh_for"), [(False, (1, "")), (True, None)])
def test_observe_asks_for_a_fresh_head_only_when_the_change_will_run(
    suspend: bool, fresh_for: object
) -> None:
    from pkobatch.controller.observe import Observer
    from pkobatch.controller.stores import Stores

    stores = Stores.empty()
    spec = {"stack": "dev", "projectRepo": "https://g/x.git", "branch": "main", "suspend": suspend}
    stores.stacks.upsert(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": "app", "namespace": "ns", "uid": "u", "generation": 1},
            "spec": spec,
        }
    )
    poller = FreshnessRecorder()
    observer = Observer(LiveReads({}), stores, poller, Settings(), builtin_template())  # type: ignore[arg-type]
    observer.observe(StackKey("ns", "app"), datetime.now(UTC))
    assert poller.asked == [fresh_for]


@pytest.mark.parametrize(
    ("spec", "refused", "polled"),
    [
        ({"stack": "dev"}, False, True),
        ({"stack": "dev", "jobTemplate": {"spec": {"hostPID": True}}}, True, False),
        ({"projectRepo": 5}, None, False),
    ],
)
def test_observe_hands_its_run_check_to_plan(
    spec: dict[str, Any], refused: bool | None, polled: bool
) -> None:
    from pkobatch.controller.observe import Observer
    from pkobatch.controller.stores import Stores

    stores = Stores.empty()
    stores.stacks.upsert(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": "app", "namespace": "ns", "uid": "u", "generation": 1},
            "spec": {"projectRepo": "https://g/x.git", "branch": "main", **spec},
        }
    )
    poller = FreshnessRecorder()
    observer = Observer(LiveReads({}), stores, poller, Settings(), builtin_template())  # type: ignore[arg-type]
    observed = observer.observe(StackKey("ns", "app"), datetime.now(UTC))
    assert observed is not None
    if refused is None:
        assert observed.run_check is None
    else:
        assert observed.run_check is not None
        assert (observed.run_check.refusal is not None) == refused
    assert bool(poller.asked) == polled


def test_observe_checks_whether_a_stack_may_run_again_only_when_its_spec_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pkobatch.controller import observe
    from pkobatch.controller.stores import Stores

    probed: list[str] = []

    def run_refusal(stack: Any, *_: Any) -> str | None:
        probed.append(f"{stack['metadata']['uid']}@{stack['metadata']['generation']}")
        return "hostPID" if stack["spec"].get("jobTemplate") else None

    monkeypatch.setattr(observe, "run_refusal", run_refusal)
    stores = Stores.empty()
    observer = observe.Observer(
        LiveReads({}),  # type: ignore[arg-type]
        stores,
        FreshnessRecorder(),
        Settings(),
        builtin_template(),
    )

    def seen(uid: str, generation: int, status: str, **spec: Any) -> str | None:
        meta = {"name": "app", "namespace": "ns", "uid": uid, "generation": generation}
        stores.stacks.upsert(
            {
                "apiVersion": "pulumi.com/v1",
                "kind": "Stack",
                "metadata": meta,
                "spec": {"stack": "dev", **spec},
                "status": {"outputs": {"version": status}},
            }
        )
        observed = observer.observe(StackKey("ns", "app"), datetime.now(UTC))
        assert observed is not None and observed.run_check is not None
        return observed.run_check.refusal

    assert seen("u1", 1, "a") is None
    assert seen("u1", 1, "b") is None  # only its status changed
    assert seen("u1", 2, "b", jobTemplate={"spec": {"hostPID": True}}) == "hostPID"
    assert seen("u1", 2, "c", jobTemplate={"spec": {"hostPID": True}}) == "hostPID"
    assert seen("u2", 2, "c") is None  # another Stack of the same name
    assert probed == ["u1@1", "u1@2", "u2@2"]


PLAN_ID = "plan-00000000000000000001"


def test_the_approver_is_read_live_only_when_the_stack_approves_its_pending_plan() -> None:
    from pkobatch.controller.observe import Observer
    from pkobatch.controller.stores import Stores

    managed = [
        {
            "manager": "pkobatch-cli:alice",
            "time": "2026-01-01T00:00:00Z",
            "fieldsV1": {"f:metadata": {"f:annotations": {"f:pkobatch.io/approve": {}}}},
        }
    ]
    stack: dict[str, Any] = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": "app", "namespace": "ns", "uid": "stack-uid", "annotations": {}},
        "spec": {"stack": "dev", "approval": {"required": True}},
        "status": {"approval": {"state": "Pending", "planID": PLAN_ID}},
    }
    live = LiveReads({("stacks", "app"): {**stack, "metadata": {"managedFields": managed}}})
    stores = Stores.empty()
    stores.stacks.upsert(stack)
    poller = GitPoller(None, 60.0, lambda key: None)  # type: ignore[arg-type]
    observer = Observer(live, stores, poller, Settings(), builtin_template())  # type: ignore[arg-type]
    moment = datetime(2026, 1, 1, tzinfo=UTC)

    observed = observer.observe(StackKey("ns", "app"), moment)
    assert observed is not None and not observed.managed_fields and live.asked == []

    stores.stacks.upsert(
        {
            **stack,
            "metadata": {**stack["metadata"], "annotations": {"pkobatch.io/approve": PLAN_ID}},
        }
    )
    observed = observer.observe(StackKey("ns", "app"), moment)
    assert observed is not None and live.asked == [("stacks", "app")]
    assert list(observed.managed_fields) == managed


def test_a_stack_the_reconciler_forgets_is_no_longer_polled_for() -> None:
    """``StackReconciler.forget`` (its namespace stopped matching the namespace selector)
    drops the Stack's branch subscription, which observing it had made."""
    from pkobatch.controller.observe import Observer
    from pkobatch.controller.stores import Stores

    git, clock, woken = FakeGit(), Clock(), []
    poller = poller_of(git, clock, woken)
    stores = Stores.empty()
    stores.stacks.upsert(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": "app", "namespace": "ns", "uid": "u", "generation": 1},
            "spec": {"stack": "dev", "projectRepo": "https://g/x.git", "branch": "main"},
        }
    )
    observer = Observer(LiveReads({}), stores, poller, Settings(), builtin_template())  # type: ignore[arg-type]
    key = StackKey("ns", "app")
    observer.observe(key, datetime.now(UTC))
    settle(poller, woken)
    assert git.calls == 1  # observing subscribed the Stack to its branch
    observer.forget(key)
    clock.now += 3600
    poller.poll_due()
    settle(poller, woken)
    assert git.calls == 1
    assert stores.stacks.get("ns", "app") is not None
    poller.stop()
