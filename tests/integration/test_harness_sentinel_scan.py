"""The sentinel scan itself (tests/helpers/sentinels.py): a deliberately leaked sentinel is found
in every kind of place it covers (objects, logs, process arguments, what a test's receivers
got), and a leak fails the pytest session that made it.

The leaks planted here use private sentinels (not registered for the session), so this
session's own scan stays clean; the last test runs a separate pytest session that leaks a
registered one.
"""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from helpers.sentinels import (
    ArgumentWatch,
    encodings,
    record_received,
    scan_logs,
    scan_objects,
    scan_received,
)

from pkobatch.kube.client import CONFIGMAPS, CORE_EVENTS, EVENTS, JOBS, PODS, STACKS, Kube

TESTS = Path(__file__).resolve().parents[1]


def private_sentinel() -> tuple[str, dict[str, str]]:
    value = f"sentinel-selftest-{secrets.token_hex(8)}"
    return value, {value: "selftest"}


def test_encodings_find_the_value_in_base64_at_any_alignment() -> None:
    value, _ = private_sentinel()
    for prefix in ("", "a", "ab", "abc"):
        encoded = base64.b64encode(f"{prefix}{value}tail".encode()).decode()
        assert any(form in encoded for form in encodings(value)[1:]), prefix
    other, _ = private_sentinel()
    assert not any(form in base64.b64encode(other.encode()).decode() for form in encodings(value))


def test_a_sentinel_in_any_scanned_object_is_found(kube: Kube, namespace: str) -> None:
    value, sentinels = private_sentinel()
    assert scan_objects(kube, sentinels, namespace) == []

    kube.create(
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "plain"},
            "data": {"k": value},
        },
        namespace,
    )
    kube.create(
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "encoded"},
            "binaryData": {"k": base64.b64encode(b"x" + value.encode()).decode()},
        },
        namespace,
    )
    kube.create(
        JOBS,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "job"},
            "spec": {
                "suspend": True,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "c", "image": "x", "args": ["--token", value]}],
                    }
                },
            },
        },
        namespace,
    )
    # A scheduling gate keeps the node agent from running it.
    kube.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "pod"},
            "spec": {
                "schedulingGates": [{"name": "pkobatch.io/never"}],
                "containers": [{"name": "c", "image": "x", "env": [{"name": "T", "value": value}]}],
            },
        },
        namespace,
    )
    stack = kube.create(
        STACKS,
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": "stack"},
            "spec": {"stack": "dev", "suspend": True},
        },
        namespace,
    )
    kube.merge_patch(
        STACKS,
        "stack",
        {"status": {"lastUpdate": {"state": "failed", "message": f"failed with {value}"}}},
        namespace,
        subresource="status",
    )
    involved = {
        "kind": "Stack",
        "name": "stack",
        "namespace": namespace,
        "uid": stack["metadata"]["uid"],
    }
    kube.create(
        CORE_EVENTS,
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "core-event"},
            "involvedObject": involved,
            "reason": "Leak",
            "message": f"leaking {value}",
            "type": "Warning",
        },
        namespace,
    )
    kube.create(
        EVENTS,
        {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "event"},
            "regarding": involved,
            "reason": "Leak",
            "action": "Leak",
            "note": f"leaking {value}",
            "type": "Warning",
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "pkobatch.io/tests",
            "reportingInstance": "tests",
        },
        namespace,
    )

    expected = {
        f"ConfigMap {namespace}/plain",
        f"ConfigMap {namespace}/encoded",
        f"Job {namespace}/job",
        f"Pod {namespace}/pod",
        f"Stack {namespace}/stack",
        f"Event {namespace}/core-event",
        f"Event {namespace}/event",
    }
    found = {leak.where for leak in scan_objects(kube, sentinels, namespace)}
    assert found == expected
    everywhere = {leak.where for leak in scan_objects(kube, sentinels)}
    assert expected <= everywhere
    assert {leak.label for leak in scan_objects(kube, sentinels)} == {"selftest"}


def test_a_sentinel_in_a_process_argument_list_or_a_log_is_found(tmp_path: Path) -> None:
    value, sentinels = private_sentinel()
    (tmp_path / "clean.log").write_text("nothing to see\n")
    assert scan_logs(tmp_path, sentinels) == []
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "run.log").write_text(f"password={value}\n")
    (tmp_path / "encoded.log").write_text(base64.b64encode(b"yy" + value.encode()).decode())
    assert {leak.where for leak in scan_logs(tmp_path, sentinels)} == {
        f"file {tmp_path / 'nested' / 'run.log'}",
        f"file {tmp_path / 'encoded.log'}",
    }

    with ArgumentWatch(lambda: sentinels, interval=0.05) as watch:
        time.sleep(0.2)
        assert watch.leaks == []
        # Short-lived, as a `pulumi config set` inside a run is.
        subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5)", value], check=True)
        time.sleep(0.2)
    assert len(watch.leaks) == 1
    assert watch.leaks[0].label == "selftest" and "the arguments of process" in watch.leaks[0].where
    assert value not in watch.leaks[0].where and "<sentinel selftest>" in watch.leaks[0].where


def test_a_sentinel_in_what_a_test_receiver_got_is_found() -> None:
    value, sentinels = private_sentinel()
    record_received("a clean webhook body", b'{"summary": "run failed: [secret]"}')
    assert scan_received(sentinels) == []
    record_received("a leaking webhook body", f'{{"summary": "failed: {value}"}}'.encode())
    record_received("an encoding one", base64.b64encode(b"z" + value.encode()))
    assert {leak.where for leak in scan_received(sentinels)} == {
        "a leaking webhook body",
        "an encoding one",
    }


def inner_session(tmp_path: Path, test_code: str) -> subprocess.CompletedProcess[str]:
    """A separate pytest session with the sentinel fixtures of tests/helpers/sentinels.py."""
    root = tmp_path / "inner"
    root.mkdir(parents=True)
    (root / "conftest.py").write_text(
        "from helpers.sentinels import sentinel_session as sentinel_session\n"
    )
    (root / "test_inner.py").write_text(test_code)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "--basetemp",
            str(tmp_path / "basetemp"),
            str(root),
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


LEAKY_TEST = """
from helpers import sentinels

def test_plants_a_sentinel_and_leaks_it(tmp_path):
    value = sentinels.plant("leaky")
    (tmp_path / "app.log").write_text("connecting with " + value)
"""

CLEAN_TEST = """
from helpers import sentinels

def test_plants_a_sentinel_and_keeps_it(tmp_path):
    value = sentinels.plant("kept")
    (tmp_path / "app.log").write_text("connecting with [secret]")
"""


def test_a_leaked_sentinel_fails_the_session(tmp_path: Path) -> None:
    leaky = inner_session(tmp_path / "leaky", LEAKY_TEST)
    assert leaky.returncode != 0, leaky.stdout
    assert "1 passed, 1 error" in leaky.stdout
    assert "secret values leaked (scan after the whole session)" in leaky.stdout
    assert "sentinel 'leaky' in file" in leaky.stdout and "app.log" in leaky.stdout

    clean = inner_session(tmp_path / "clean", CLEAN_TEST)
    assert clean.returncode == 0, clean.stdout
