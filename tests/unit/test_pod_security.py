"""Every Pod Security Standards control of pkobatch.api.pod_security, at every level.

Each case is a pod that breaks exactly one control: it must pass at the levels below the
control's and be refused, naming the field, at the control's level and above. The
compliant pods (the run's own default pod, a restricted pod) pass everywhere.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from helpers.pod_security_probes import CASES, OK, restricted_pod, with_container

from pkobatch.api.pod_security import (
    BASELINE_CAPABILITIES,
    CONTROLS,
    LEVELS,
    RESTRICTED_VOLUME_TYPES,
    SAFE_SYSCTLS,
    SELINUX_TYPES,
    Level,
    check_pod,
    controls_for,
)

JSON = dict[str, Any]


def _above(level: Level) -> list[Level]:
    return list(LEVELS[LEVELS.index(level) :])


@pytest.mark.parametrize(
    ("metadata", "spec", "level", "field"),
    [pytest.param(m, s, lv, f, id=case) for case, lv, m, s, f in CASES],
)
def test_each_control_refuses_from_its_level(
    metadata: JSON, spec: JSON, level: Level, field: str
) -> None:
    for judged in LEVELS:
        violations = check_pod(metadata, spec, judged)
        fields = [v.field for v in violations]
        if judged == level:
            assert fields == [field]
            assert field in str(violations[0]) and repr(level) in str(violations[0])
        elif judged in _above(level):
            assert field in fields, judged  # a stricter level may find more
        else:
            assert fields == [], judged


def test_every_control_has_a_case() -> None:
    names = {(c.name, c.level) for c in CONTROLS}
    covered = set()
    for _, level, metadata, spec, _ in CASES:
        for violation in check_pod(metadata, spec, level):
            covered.add((violation.control, violation.level))
    assert names == covered


@pytest.mark.parametrize("level", LEVELS)
def test_compliant_pods_pass(level: Level) -> None:
    assert check_pod({}, OK, level) == []
    # Allowed values of each control.
    allowed = restricted_pod(
        hostNetwork=False,
        volumes=[
            {"name": "cache", "emptyDir": {}},
            {"name": "token", "projected": {"sources": []}},
            {"name": "creds", "secret": {"secretName": "x"}},
        ],
        securityContext={
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
            "seLinuxOptions": {"type": "container_t", "level": "s0:c1"},
            "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}],
            "appArmorProfile": {"type": "RuntimeDefault"},
        },
    )
    allowed = with_container(
        allowed, capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}, procMount="Default"
    )
    annotations = {"container.apparmor.security.beta.kubernetes.io/pulumi": "runtime/default"}
    assert check_pod({"annotations": annotations}, allowed, level) == []


def test_baseline_allows_the_default_minimal_pod() -> None:
    # What a plain `kubectl run` gives: no security context at all.
    assert check_pod({}, {"containers": [{"name": "c", "image": "x"}]}, "baseline") == []
    assert check_pod({}, {"containers": [{"name": "c", "image": "x"}]}, "restricted") != []


def test_user_namespaces_relax_root_and_proc_mount_like_the_standard() -> None:
    pod = with_container(OK, runAsNonRoot=False, runAsUser=0, procMount="Unmasked")
    pod["hostUsers"] = False
    assert check_pod({}, pod, "baseline") == []
    # At restricted, only the /proc mount stays forbidden.
    assert [v.control for v in check_pod({}, pod, "restricted")] == ["/proc Mount Type"]


def test_windows_pods_are_exempt_from_linux_only_restricted_controls() -> None:
    pod = {
        "os": {"name": "windows"},
        "securityContext": {"runAsNonRoot": True},
        "containers": [{"name": "c", "image": "x"}],
    }
    assert check_pod({}, pod, "restricted") == []


def test_restricted_replaces_baseline_controls_so_each_fault_is_reported_once() -> None:
    pod = restricted_pod(volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    assert [v.control for v in check_pod({}, pod, "restricted")] == ["Volume Types"]
    names = [c.name for c in controls_for("restricted")]
    assert len(names) == len(set(names))


def test_malformed_values_are_not_trusted() -> None:
    assert check_pod({}, restricted_pod(hostPID="yes"), "baseline") != []
    assert check_pod({}, with_container(OK, privileged=1), "baseline") != []
    # Containers that are not objects are judged as empty containers, never skipped.
    assert check_pod({}, {"containers": ["junk"]}, "restricted") != []


def test_docs_list_every_control_and_allowed_value() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    rows = re.findall(r"^\| ([^|`]+?) \| (baseline|restricted)\b", text, flags=re.MULTILINE)
    assert set(rows) == {(c.name, c.level) for c in CONTROLS}
    for value in (*SAFE_SYSCTLS, *BASELINE_CAPABILITIES, *RESTRICTED_VOLUME_TYPES):
        assert f"`{value}`" in text, value
    for kind in SELINUX_TYPES - {""}:
        assert f"`{kind}`" in text, kind
