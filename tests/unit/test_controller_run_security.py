"""What a Stack may not get through its run: a pod beyond the Pod Security level, another
ServiceAccount, or its git credentials sent over plain http:// (pure parts and shells)."""

from __future__ import annotations

import copy
import threading
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from pkobatch.api.git_transport import credentials_allowed, plain_http_host
from pkobatch.api.run import Run
from pkobatch.api.stack.spec import StackSpec
from pkobatch.config import JobSettings, Settings
from pkobatch.controller.decide import decide
from pkobatch.controller.decision import Observed, RunCheck, SourceHead
from pkobatch.controller.job_builder import build_run, builtin_template
from pkobatch.controller.observe import Observer
from pkobatch.controller.polling import GitCredentials, GitPoller, PollKey
from pkobatch.controller.run_pod import JobBuildError
from pkobatch.controller.steps.runs import run_refusal
from pkobatch.controller.stores import StackKey, Stores
from pkobatch.runner.failures import RunFailure
from pkobatch.runner.git import GitCredentials as RunnerCredentials
from pkobatch.runner.git import check_transport

RUN = Run(operation="up", kind="sync", generation=1, reconcile_request="", commit="c", trigger="t")
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
BASIC_AUTH = {
    "basicAuth": {
        "userName": {"type": "Secret", "secret": {"name": "git", "key": "username"}},
        "password": {"type": "Secret", "secret": {"name": "git", "key": "password"}},
    }
}


def stack(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {
            "name": "app",
            "namespace": "team",
            "uid": "uid-1",
            "generation": 1,
            "finalizers": ["finalizer.stack.pulumi.com"],
        },
        "spec": {"stack": "dev", **spec},
    }


def build(spec: dict[str, Any], settings: JobSettings | None = None, **kwargs: Any) -> Any:
    obj = stack(spec)
    return build_run(
        obj,
        StackSpec.model_validate(obj["spec"]),
        RUN,
        settings or JobSettings(),
        builtin_template(),
        **kwargs,
    ).job


# -- Pod Security --------------------------------------------------------------------------

ESCALATIONS: list[tuple[str, dict[str, Any], str]] = [
    ("hostPID", {"jobTemplate": {"spec": {"hostPID": True}}}, "spec.hostPID"),
    ("hostNetwork", {"jobTemplate": {"spec": {"hostNetwork": True}}}, "spec.hostNetwork"),
    ("hostIPC", {"jobTemplate": {"spec": {"hostIPC": True}}}, "spec.hostIPC"),
    (
        "hostPath",
        {
            "workspaceTemplate": {
                "spec": {
                    "podTemplate": {
                        "spec": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}
                    }
                }
            }
        },
        "spec.volumes[host].hostPath",
    ),
    (
        "privileged",
        {
            "jobTemplate": {
                "spec": {
                    "containers": [{"name": "pulumi", "securityContext": {"privileged": True}}]
                }
            }
        },
        "spec.containers[pulumi].securityContext.privileged",
    ),
    (
        "capabilities",
        {
            "jobTemplate": {
                "spec": {
                    "containers": [
                        {
                            "name": "pulumi",
                            "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
                        }
                    ]
                }
            }
        },
        "spec.containers[pulumi].securityContext.capabilities.add",
    ),
    (
        "init-container",
        {
            "jobTemplate": {
                "spec": {
                    "initContainers": [
                        {
                            "name": "escape",
                            "image": "busybox",
                            "securityContext": {"privileged": True},
                        }
                    ]
                }
            }
        },
        "spec.initContainers[escape].securityContext.privileged",
    ),
]


@pytest.mark.parametrize(("spec", "field"), [pytest.param(s, f, id=i) for i, s, f in ESCALATIONS])
def test_escalations_are_refused_naming_the_field_and_the_level(
    spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(JobBuildError) as refused:
        build(spec)
    message = str(refused.value)
    assert f"pod {field}" in message
    assert "Pod Security level 'baseline'" in message
    assert "PKOBATCH_JOB__POD_SECURITY_LEVEL" in message
    assert "spec.jobTemplate" in message
    # Only the explicit operator setting allows it.
    assert build(spec, JobSettings(pod_security_level="privileged"))


def test_run_as_root_is_refused_at_restricted() -> None:
    spec = {"jobTemplate": {"spec": {"securityContext": {"runAsUser": 0, "runAsNonRoot": False}}}}
    assert build(spec)  # baseline allows root, as the standard does
    with pytest.raises(JobBuildError, match=r"spec.securityContext.runAsUser.*'restricted'"):
        build(spec, JobSettings(pod_security_level="restricted"))


def test_the_default_run_pod_meets_restricted() -> None:
    assert build({}, JobSettings(pod_security_level="restricted"))
    compliant_init = {
        "name": "fetch",
        "image": "busybox",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    assert build(
        {"jobTemplate": {"spec": {"initContainers": [compliant_init]}}},
        JobSettings(pod_security_level="restricted"),
    )


def test_pkobatchs_injected_init_container_is_judged_and_meets_restricted() -> None:
    # A run in another image gets the runner bundle through an init container.
    job = build(
        {"workspaceTemplate": {"spec": {"image": "pulumi/pulumi-python:3"}}},
        JobSettings(pod_security_level="restricted"),
    )
    assert job["spec"]["template"]["spec"]["initContainers"]
    # The same pod with a template that weakens the run container is refused.
    with pytest.raises(JobBuildError, match=r"spec.containers\[pulumi\].*allowPrivilegeEscalation"):
        build(
            {
                "workspaceTemplate": {"spec": {"image": "pulumi/pulumi-python:3"}},
                "jobTemplate": {
                    "spec": {
                        "containers": [
                            {
                                "name": "pulumi",
                                "securityContext": {"allowPrivilegeEscalation": True},
                            }
                        ]
                    }
                },
            },
            JobSettings(pod_security_level="restricted"),
        )


def test_the_controllers_own_template_is_blamed_on_the_operator() -> None:
    template = copy.deepcopy(builtin_template())
    template["spec"]["template"]["spec"]["hostNetwork"] = True
    obj = stack({})
    with pytest.raises(JobBuildError, match="controller's Job template breaks"):
        build_run(obj, StackSpec.model_validate(obj["spec"]), RUN, JobSettings(), template)


def test_many_violations_give_a_bounded_message() -> None:
    containers = [
        {"name": f"c{i}", "image": "x", "securityContext": {"privileged": True}} for i in range(40)
    ]
    with pytest.raises(JobBuildError) as refused:
        build({"jobTemplate": {"spec": {"initContainers": containers}}})
    assert "and 35 more" in str(refused.value)
    assert len(str(refused.value)) < 2000


# -- ServiceAccount -------------------------------------------------------------------------

SA_OVERRIDES = [
    ("jobTemplate.spec", {"jobTemplate": {"spec": {"serviceAccountName": "cluster-admin"}}}),
    ("jobTemplate.spec", {"jobTemplate": {"spec": {"serviceAccount": "cluster-admin"}}}),
    (
        "workspaceTemplate.spec.podTemplate.spec",
        {
            "workspaceTemplate": {
                "spec": {"podTemplate": {"spec": {"serviceAccountName": "cluster-admin"}}}
            }
        },
    ),
    ("jobTemplate.spec", {"jobTemplate": {"spec": {"serviceAccountName": "pkobatch-runner"}}}),
    (
        "jobTemplate.spec",
        {"serviceAccountName": "mine", "jobTemplate": {"spec": {"serviceAccountName": ""}}},
    ),
]


@pytest.mark.parametrize(("path", "spec"), SA_OVERRIDES)
def test_templates_cannot_choose_the_service_account(path: str, spec: dict[str, Any]) -> None:
    with pytest.raises(JobBuildError, match=rf"spec\.{path}\.serviceAccount"):
        build(spec)


def test_templates_may_repeat_the_stacks_service_account() -> None:
    job = build({"serviceAccountName": "mine", "jobTemplate": {"spec": {"serviceAccount": "mine"}}})
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "mine"
    job = build(
        {
            "workspaceTemplate": {
                "spec": {
                    "serviceAccountName": "ws",
                    "podTemplate": {"spec": {"serviceAccountName": "ws"}},
                }
            }
        }
    )
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "ws"


def test_templates_cannot_take_the_token_away() -> None:
    with pytest.raises(JobBuildError, match="automountServiceAccountToken"):
        build({"jobTemplate": {"spec": {"automountServiceAccountToken": False}}})


# -- plain http ------------------------------------------------------------------------------


def test_plain_http_rule() -> None:
    assert plain_http_host("http://user:pw@127.0.0.1:8080/r.git") == "127.0.0.1:8080"
    assert plain_http_host("HTTP://git.local/r") == "git.local"
    assert plain_http_host("https://git.local/r") is None
    assert plain_http_host("git@github.com:o/r.git") is None
    assert not credentials_allowed("http://127.0.0.1:8080/r", [])
    assert not credentials_allowed("http://localhost/r", ["127.0.0.1"])
    assert credentials_allowed("http://127.0.0.1:8080/r", ["127.0.0.1"])
    assert credentials_allowed("http://127.0.0.1:8080/r", ["127.0.0.1:8080"])
    assert not credentials_allowed("http://127.0.0.1:9090/r", ["127.0.0.1:8080"])
    assert credentials_allowed("https://anything/r", [])


@pytest.mark.parametrize(
    "spec",
    [
        {"projectRepo": "http://127.0.0.1:1/r.git", "branch": "main", "gitAuth": BASIC_AUTH},
        {"projectRepo": "http://127.0.0.1:1/r.git", "branch": "main", "gitAuthSecret": "git"},
        {"projectRepo": "http://u:p@127.0.0.1:1/r.git", "branch": "main"},
    ],
)
def test_http_credentials_need_the_operators_opt_in(spec: dict[str, Any]) -> None:
    with pytest.raises(JobBuildError) as refused:
        build(spec)
    message = str(refused.value)
    assert "PKOBATCH_INSECURE_HTTP_GIT_HOSTS=127.0.0.1:1" in message
    assert "u:p" not in message
    job = build(spec, insecure_http_git_hosts=["127.0.0.1"])
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert '"insecureHttpGitHosts":["127.0.0.1"]' in args[1]


def test_http_without_credentials_and_https_need_nothing() -> None:
    assert build({"projectRepo": "http://127.0.0.1:1/r.git", "branch": "main"})
    assert build({"projectRepo": "https://g/r.git", "branch": "main", "gitAuth": BASIC_AUTH})


def test_runner_refuses_http_credentials_without_opt_in() -> None:
    creds = RunnerCredentials(username="u", password="secret")
    with pytest.raises(RunFailure) as refused:
        check_transport("http://127.0.0.1:1/r.git", creds, [])
    assert refused.value.reason == "InvalidSpec"
    assert "PKOBATCH_INSECURE_HTTP_GIT_HOSTS" in refused.value.message
    check_transport("http://127.0.0.1:1/r.git", creds, ["127.0.0.1"])
    check_transport("http://127.0.0.1:1/r.git", None, [])
    check_transport("https://g/r.git", creds, [])
    with pytest.raises(RunFailure):
        check_transport("http://u:p@127.0.0.1:1/r.git", None, [])


# -- the controller: refused Stacks stall at once and are never polled -----------------------


def observed(spec: dict[str, Any], source: SourceHead | None) -> Observed:
    return Observed(stack=stack(spec), jobs=[], results={}, now=NOW, source=source)


@pytest.mark.parametrize("spec", [s for _, s, _ in ESCALATIONS] + [s for _, s in SA_OVERRIDES])
def test_a_refused_stack_is_stalled_before_waiting_for_its_source(spec: dict[str, Any]) -> None:
    git = {"projectRepo": "https://g/r.git", "branch": "main", "gitAuth": BASIC_AUTH}
    result = decide(observed({**git, **spec}, None), Settings(), builtin_template())
    assert result.create_job is None
    stalled = next(c for c in result.status["conditions"] if c["type"] == "Stalled")
    assert stalled["reason"] == "SpecInvalid"
    assert "spec." in stalled["message"]


@pytest.mark.parametrize("spec", [ESCALATIONS[0][1], {}])
def test_decide_takes_the_observers_run_check_as_its_own(spec: dict[str, Any]) -> None:
    git = {"projectRepo": "https://g/r.git", "branch": "main", "gitAuth": BASIC_AUTH}
    obj = stack({**git, **spec})
    refusal = run_refusal(
        obj, StackSpec.model_validate(obj["spec"]), Settings(), builtin_template()
    )
    asked = decide(observed({**git, **spec}, None), Settings(), builtin_template())
    told = decide(
        replace(observed({**git, **spec}, None), run_check=RunCheck(refusal)),
        Settings(),
        builtin_template(),
    )
    assert told == asked


def test_a_refusal_the_observer_found_is_not_checked_again() -> None:
    git = {"projectRepo": "https://g/r.git", "branch": "main", "gitAuth": BASIC_AUTH}
    told = replace(observed(git, None), run_check=RunCheck("refused by the observer"))
    result = decide(told, Settings(), builtin_template())
    stalled = next(c for c in result.status["conditions"] if c["type"] == "Stalled")
    assert stalled["reason"] == "SpecInvalid"
    assert stalled["message"] == "refused by the observer"


def test_an_http_stack_without_opt_in_is_stalled_saying_what_to_set() -> None:
    spec = {"projectRepo": "http://127.0.0.1:1/r.git", "branch": "main", "gitAuth": BASIC_AUTH}
    result = decide(observed(spec, None), Settings(), builtin_template())
    stalled = next(c for c in result.status["conditions"] if c["type"] == "Stalled")
    assert stalled["reason"] == "SpecInvalid"
    assert "PKOBATCH_INSECURE_HTTP_GIT_HOSTS=127.0.0.1:1" in stalled["message"]
    opted_in = Settings(insecure_http_git_hosts=["127.0.0.1"])
    assert (
        run_refusal(
            stack(spec),
            StackSpec.model_validate(stack(spec)["spec"]),
            opted_in,
            {**builtin_template()},
        )
        is None
    )
    result = decide(observed(spec, SourceHead(commit="1" * 40)), opted_in, builtin_template())
    assert result.create_job is not None


class _CountingPoller(GitPoller):
    def __init__(self) -> None:
        super().__init__(None, 60.0, lambda key: None)  # type: ignore[arg-type]
        self.asked: list[PollKey] = []

    def head(
        self,
        stack: StackKey,
        key: PollKey,
        resync_seconds: float | None = None,
        fresh_for: object | None = None,
    ) -> Any:
        self.asked.append(key)
        return SourceHead()


@pytest.mark.parametrize(
    ("spec", "polled"),
    [
        ({"jobTemplate": {"spec": {"hostPID": True}}}, False),
        ({"projectRepo": "http://127.0.0.1:1/r.git"}, False),
        ({"serviceAccountName": 3}, False),  # invalid spec
        ({}, True),
    ],
)
def test_only_stacks_that_could_run_are_polled(spec: dict[str, Any], polled: bool) -> None:
    stores = Stores.empty()
    git = {"projectRepo": "https://g/r.git", "branch": "main", "gitAuth": BASIC_AUTH}
    stores.stacks.upsert(stack({**git, **spec}))
    poller = _CountingPoller()
    observer = Observer(None, stores, poller, Settings(), builtin_template())  # type: ignore[arg-type]
    observer.observe(StackKey("team", "app"), NOW)
    assert bool(poller.asked) is polled
    poller.stop()


def test_the_poller_itself_never_sends_credentials_over_http() -> None:
    fetched: list[str] = []
    done = threading.Event()

    def fetch(url: str, ref: str, creds: Any, timeout: float) -> str:
        fetched.append(url)
        return "1" * 40

    poller = GitPoller(None, 60.0, lambda key: done.set(), fetch=fetch)  # type: ignore[arg-type]
    creds = GitCredentials("basic", "team", legacy_secret="")
    key = PollKey("http://127.0.0.1:1/r.git", "refs/heads/main", creds)
    poller.head(StackKey("team", "app"), key)
    poller.poll_due()
    assert done.wait(10)
    head = poller.head(StackKey("team", "app"), key)
    assert fetched == [] and "PKOBATCH_INSECURE_HTTP_GIT_HOSTS" in (head.error or "")
    poller.stop()
