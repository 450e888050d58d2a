"""The node agent runs the real Job controller's pods like a kubelet would."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers.controller_harness import grant_role
from helpers.dev_env import alive

from pkobatch.dev.memory_limit import MemoryCgroup
from pkobatch.dev.node_agent import NodeAgent
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import (
    CONFIGMAPS,
    JOBS,
    NAMESPACES,
    NODES,
    PODS,
    SECRETS,
    Kube,
)

JSON = dict[str, Any]


def read_pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


# A process that records its pid and the pid of a grandchild, then sleeps.
SLEEPER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    with open(os.environ["PID_FILE"], "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    time.sleep(300)
    """
)


def test_job_completes(
    kube: Kube, namespace: str, cluster: Any, python_job: Any, wait_job: Any, job_pods: Any
) -> None:
    code = "import os; print('hello from', os.environ['HOSTNAME'])"
    kube.create(JOBS, python_job("ok", code), namespace)

    kind, reason, job = wait_job(namespace, "ok")

    assert (kind, reason) == ("Complete", "CompletionsReached")
    assert job["status"]["succeeded"] == 1
    (pod,) = job_pods(namespace, "ok")
    assert pod["status"]["phase"] == "Succeeded"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0
    assert terminated["reason"] == "Completed"
    name = pod["metadata"]["name"]
    log = (cluster.log_dir / namespace / f"{name}.log").read_text()
    assert log == f"hello from {name}\n"
    assert cluster.pod_logs.read(namespace, name) == log


def test_failing_job_fails_with_exit_code_and_message(
    kube: Kube, namespace: str, python_job: Any, wait_job: Any, job_pods: Any
) -> None:
    code = "import sys\nfor i in range(100): print('line', i)\nsys.exit(3)"
    kube.create(JOBS, python_job("bad", code), namespace)

    kind, reason, job = wait_job(namespace, "bad")

    assert (kind, reason) == ("Failed", "BackoffLimitExceeded")
    assert job["status"]["failed"] == 1
    (pod,) = job_pods(namespace, "bad")
    assert pod["status"]["phase"] == "Failed"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3
    assert terminated["reason"] == "Error"
    # FallbackToLogsOnError: the last 80 lines of output.
    lines = terminated["message"].splitlines()
    assert lines[-1] == "line 99"
    assert len(lines) == 80


# Writes argv[1] (its size: argv[2] characters) to the file $MESSAGE_FILE names, prints a
# line, and exits with argv[3].
WRITE_MESSAGE = textwrap.dedent(
    """
    import os, sys
    text = sys.argv[1] * int(sys.argv[2])
    with open(os.environ["MESSAGE_FILE"], "w") as f:
        f.write(text)
    print("a line of output")
    sys.exit(int(sys.argv[3]))
    """
)


def test_the_termination_message_file_becomes_the_containers_message(
    kube: Kube, namespace: str, python_job: Any, wait_job: Any, job_pods: Any
) -> None:
    """As with a kubelet: the file at terminationMessagePath (here named to the process by a
    variable holding that path), at most 4096 bytes of it; with FallbackToLogsOnError the
    output only when the file is empty and the exit code not zero."""
    cases = {
        # name: (terminationMessagePath, policy, text, repeat, exit code)
        "default-path": (None, "File", "sha256:abc", 1, 0),
        "own-path": ("/run/pkobatch/message", "FallbackToLogsOnError", "failed: why", 1, 2),
        "too-long": (None, "File", "x", 5000, 0),
        "empty-file": (None, "FallbackToLogsOnError", "", 1, 3),
        "empty-file-policy-file": (None, "File", "", 1, 3),
    }
    for name, (path, policy, text, repeat, code) in cases.items():
        container: JSON = {"terminationMessagePolicy": policy}
        if path:
            container["terminationMessagePath"] = path
        job = python_job(
            name,
            WRITE_MESSAGE,
            env=[{"name": "MESSAGE_FILE", "value": path or "/dev/termination-log"}],
            container=container,
        )
        job["spec"]["template"]["spec"]["containers"][0]["command"] += [
            text,
            str(repeat),
            str(code),
        ]
        kube.create(JOBS, job, namespace)
    messages = {}
    for name in cases:
        wait_job(namespace, name)
        (pod,) = job_pods(namespace, name)
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        messages[name] = terminated.get("message", "")
    assert messages == {
        "default-path": "sha256:abc",
        "own-path": "failed: why",
        "too-long": "x" * 4096,
        "empty-file": "a line of output",
        "empty-file-policy-file": "",
    }


def test_a_container_over_its_memory_limit_is_oom_killed(
    kube: Kube, namespace: str, python_job: Any, wait_job: Any, job_pods: Any
) -> None:
    probe = MemoryCgroup.create(f"probe-{namespace}", 2**26)
    if probe is None:
        message = "the node agent cannot write a memory cgroup here (it needs root)"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    probe.remove()
    limits = {"resources": {"limits": {"memory": "64Mi"}}}
    hungry = "chunks = [bytearray(16 * 2**20) for _ in range(32)]\nprint('survived')"
    kube.create(JOBS, python_job("hungry", hungry, container=limits), namespace)
    modest = "chunk = bytearray(8 * 2**20)\nprint('fits')"
    kube.create(JOBS, python_job("modest", modest, container=limits), namespace)

    kind, _, _ = wait_job(namespace, "hungry")
    assert kind == "Failed"
    (pod,) = job_pods(namespace, "hungry")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)
    assert "survived" not in terminated.get("message", "")
    kind, _, _ = wait_job(namespace, "modest")
    assert kind == "Complete"


def test_deadline_exceeded_kills_the_process_group(
    kube: Kube, namespace: str, tmp_path: Path, python_job: Any, wait_job: Any
) -> None:
    pid_file = tmp_path / "pids"
    manifest = python_job(
        "slow",
        SLEEPER,
        env=[{"name": "PID_FILE", "value": str(pid_file)}],
        activeDeadlineSeconds=4,
    )
    kube.create(JOBS, manifest, namespace)
    wait_until(lambda: len(read_pids(pid_file)) == 2, timeout=60, what="the pod to start")
    pids = read_pids(pid_file)
    assert all(alive(pid) for pid in pids)

    kind, reason, _ = wait_job(namespace, "slow")

    assert (kind, reason) == ("Failed", "DeadlineExceeded")
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout=60, what="processes to end")


def test_sigkill_after_grace_period_when_sigterm_is_ignored(
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    cluster: Any,
    python_job: Any,
    wait_job: Any,
    job_pods: Any,
) -> None:
    pid_file = tmp_path / "pid"
    code = textwrap.dedent(
        """
        import os, signal, time
        signal.signal(signal.SIGTERM, lambda *a: print("got SIGTERM", flush=True))
        open(os.environ["PID_FILE"], "w").write(str(os.getpid()))
        while True:
            time.sleep(0.1)
        """
    )
    manifest = python_job(
        "stubborn",
        code,
        env=[{"name": "PID_FILE", "value": str(pid_file)}],
        grace=2,
        activeDeadlineSeconds=3,
    )
    kube.create(JOBS, manifest, namespace)
    wait_until(lambda: len(read_pids(pid_file)) == 1, timeout=60, what="the pod to start")
    (pid,) = read_pids(pid_file)
    pod_name = job_pods(namespace, "stubborn")[0]["metadata"]["name"]

    kind, reason, _ = wait_job(namespace, "stubborn")

    assert (kind, reason) == ("Failed", "DeadlineExceeded")
    wait_until(lambda: not alive(pid), timeout=60, what="the process to be killed")
    # The pod is gone (the Job controller deletes it at the deadline): the agent's own file.
    assert "got SIGTERM" in (cluster.log_dir / namespace / f"{pod_name}.log").read_text()


# A launcher like the runner bundle's PyInstaller bootloader: it passes SIGTERM on to its
# child, which stays in its process group and records how many SIGTERMs it got. It passes
# it on a little later, so that a second SIGTERM (sent to the whole group) cannot merge
# with it into one pending signal.
LAUNCHER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", os.environ["CHILD"]])

    def forward(signum, frame):
        time.sleep(0.5)
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    sys.exit(child.wait())
    """
)
COUNTING_CHILD = textwrap.dedent(
    """
    import os, signal, time
    received = []
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    open(os.environ["READY"], "w").close()
    while not received:
        time.sleep(0.1)
    time.sleep(2)
    with open(os.environ["COUNT"], "w") as f:
        f.write(str(len(received)))
    """
)


def test_sigterm_reaches_the_containers_first_process_only(
    kube: Kube, namespace: str, tmp_path: Path, python_job: Any, job_pods: Any
) -> None:
    ready, count = tmp_path / "ready", tmp_path / "count"
    env = [
        {"name": "CHILD", "value": COUNTING_CHILD},
        {"name": "READY", "value": str(ready)},
        {"name": "COUNT", "value": str(count)},
    ]
    kube.create(JOBS, python_job("launcher", LAUNCHER, env=env, grace=30), namespace)
    wait_until(ready.exists, timeout=60, what="the pod to start")

    kube.delete(JOBS, "launcher", namespace, propagation="Background")

    wait_until(count.exists, timeout=60, what="the child to count its signals")
    assert count.read_text() == "1"


def test_deleting_a_job_removes_its_pods_and_kills_their_processes(
    kube: Kube, namespace: str, tmp_path: Path, python_job: Any, job_pods: Any
) -> None:
    pid_file = tmp_path / "pids"
    manifest = python_job("doomed", SLEEPER, env=[{"name": "PID_FILE", "value": str(pid_file)}])
    kube.create(JOBS, manifest, namespace)
    wait_until(lambda: len(read_pids(pid_file)) == 2, timeout=60, what="the pod to start")
    pids = read_pids(pid_file)
    assert job_pods(namespace, "doomed")

    kube.delete(JOBS, "doomed", namespace, propagation="Background")

    wait_until(lambda: not job_pods(namespace, "doomed"), timeout=90, what="pods to be deleted")
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout=30, what="processes to end")


# A process that starts a grandchild in a session of its own (as a Pulumi dynamic provider
# can be), which a process-group kill never reaches, records both pids and the hostname.
SESSION_ESCAPER = textwrap.dedent(
    """
    import os, socket, subprocess, sys, time
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    with open(os.environ["PID_FILE"] + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid} {socket.gethostname()}")
    os.rename(os.environ["PID_FILE"] + ".tmp", os.environ["PID_FILE"])
    time.sleep(float(os.environ["SLEEP"]))
    """
)


@pytest.mark.parametrize("ending", ["exits", "deleted"])
def test_a_pod_ends_with_its_whole_process_tree_and_runs_under_its_own_hostname(
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    python_job: Any,
    wait_job: Any,
    job_pods: Any,
    ending: str,
) -> None:
    pid_file = tmp_path / "pids"
    env = [
        {"name": "PID_FILE", "value": str(pid_file)},
        {"name": "SLEEP", "value": "0" if ending == "exits" else "600"},
    ]
    kube.create(JOBS, python_job("tree", SESSION_ESCAPER, env=env, grace=2), namespace)
    wait_until(pid_file.exists, timeout=60, what="the pod to start")
    main_pid, grandchild, hostname = pid_file.read_text().split()
    (pod,) = job_pods(namespace, "tree")

    if ending == "exits":
        kind, _, _ = wait_job(namespace, "tree")
        assert kind == "Complete"
    else:
        kube.delete(JOBS, "tree", namespace, propagation="Background")
        wait_until(lambda: not job_pods(namespace, "tree"), timeout=90, what="pod deletion")

    wait_until(
        lambda: not alive(int(grandchild)) and not alive(int(main_pid)),
        timeout=30,
        what="the setsid grandchild to end with its pod",
    )
    if os.geteuid() == 0:  # a UTS namespace of the pod's own needs root
        assert hostname == pod["metadata"]["name"]


# Runs in each container: appends its argv[1] as a line to the file argv[2].
APPEND = "import sys; f = open(sys.argv[2], 'a'); f.write(sys.argv[1] + '\\n'); f.close()"


def test_init_containers_run_in_order_and_share_empty_dirs(
    kube: Kube, namespace: str, cluster: Any, python_job: Any, wait_job: Any, job_pods: Any
) -> None:
    report = (
        "import os, sys; path = os.environ['SHARED_FILE']; "
        "print(repr(open(path).read()), os.path.realpath(path), os.getcwd())"
    )
    manifest = python_job(
        "init",
        report,
        env=[{"name": "SHARED_FILE", "value": "/shared/order"}],
        container={
            "volumeMounts": [
                {"name": "shared", "mountPath": "/shared"},
                {"name": "scratch", "mountPath": "/shared/work", "subPath": "w"},
            ],
            "workingDir": "/shared/work",
        },
    )
    pod_spec = manifest["spec"]["template"]["spec"]
    pod_spec["volumes"] = [{"name": "shared", "emptyDir": {}}, {"name": "scratch", "emptyDir": {}}]
    mount = [{"name": "shared", "mountPath": "/shared"}]
    pod_spec["initContainers"] = [
        {
            "name": f"init-{n}",
            "image": "python:3.11",
            "command": [sys.executable, "-c", APPEND, n, "/shared/order"],
            "volumeMounts": mount,
        }
        for n in ("one", "two")
    ]
    kube.create(JOBS, manifest, namespace)

    kind, _, _ = wait_job(namespace, "init")

    (pod,) = job_pods(namespace, "init")
    log = (cluster.log_dir / namespace / f"{pod['metadata']['name']}.log").read_text()
    assert kind == "Complete", log
    content, real_path, cwd = log.splitlines()[-1].rsplit(" ", 2)
    assert content == repr("one\ntwo\n")
    # Real per-pod directories, not /shared on this host.
    pod_dir = cluster.agent.state_dir / "pods" / namespace / pod["metadata"]["name"]
    assert real_path == str(pod_dir / "volumes" / "shared" / "order")
    assert cwd == str(pod_dir / "volumes" / "scratch" / "w")
    assert not Path("/shared").exists()


def test_a_failing_init_container_fails_the_pod(
    kube: Kube, namespace: str, tmp_path: Path, python_job: Any, wait_job: Any, job_pods: Any
) -> None:
    marker = tmp_path / "main-ran"
    manifest = python_job("init-fails", f"open({str(marker)!r}, 'w').close()")
    manifest["spec"]["template"]["spec"]["initContainers"] = [
        {"name": "ok", "image": "x", "command": [sys.executable, "-c", "pass"]},
        {"name": "broken", "image": "x", "command": [sys.executable, "-c", "raise SystemExit(4)"]},
        {"name": "never", "image": "x", "command": [sys.executable, "-c", "raise SystemExit(9)"]},
    ]
    kube.create(JOBS, manifest, namespace)

    kind, reason, _ = wait_job(namespace, "init-fails")

    assert (kind, reason) == ("Failed", "BackoffLimitExceeded")
    (pod,) = job_pods(namespace, "init-fails")
    assert pod["status"]["phase"] == "Failed"
    (status,) = pod["status"]["initContainerStatuses"]
    assert status["name"] == "broken"
    assert status["state"]["terminated"]["exitCode"] == 4
    assert not marker.exists()


def test_an_image_without_pkobatch_gets_no_virtualenv_on_path(
    kube: Kube, namespace: str, cluster: Any, python_job: Any, wait_job: Any, job_pods: Any
) -> None:
    code = "import os; print(os.environ['PATH'])"
    kube.create(
        JOBS, python_job("stock", code, container={"image": cluster.pulumi_image}), namespace
    )
    kube.create(JOBS, python_job("runner", code), namespace)
    paths = {}
    for name in ("stock", "runner"):
        assert wait_job(namespace, name)[0] == "Complete"
        (pod,) = job_pods(namespace, name)
        log = cluster.log_dir / namespace / f"{pod['metadata']['name']}.log"
        paths[name] = log.read_text().strip().split(os.pathsep)
    interpreter_dir = str(Path(sys.executable).parent)
    assert interpreter_dir in paths["runner"]
    assert interpreter_dir not in paths["stock"]
    assert paths["stock"][: len(cluster.agent.path_prefix)] == cluster.agent.path_prefix


def test_environment_is_resolved_like_the_kubelet(
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    python_job: Any,
    wait_job: Any,
    job_pods: Any,
    cluster: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Nothing of the agent's own environment may reach a pod.
    monkeypatch.setenv("PKOBATCH_AGENT_ONLY", "leak")
    kube.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds"},
            "data": {
                "password": base64.b64encode(b"s3cret").decode(),
                "TOKEN": base64.b64encode(b"tok").decode(),
            },
        },
        namespace,
    )
    kube.create(
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings"},
            "data": {"color": "blue", "SIZE": "3"},
        },
        namespace,
    )
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = [
        {"name": "PLAIN", "value": "plain"},
        {"name": "EXPANDED", "value": "$(PLAIN)-$(COLOR)-$$(PLAIN)-$(UNDEFINED)"},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
        {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "color"}}},
        {
            "name": "OPTIONAL",
            "valueFrom": {"secretKeyRef": {"name": "absent", "key": "x", "optional": True}},
        },
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
        {
            "name": "JOB_LABEL",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['job-name']"}},
        },
        # How a run learns its Job's UID without reading the Job (the Job controller's label).
        {
            "name": "JOB_UID",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']"}
            },
        },
    ]
    code = "import json, os; print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd()}))"
    manifest = python_job(
        "env",
        code,
        env=env,
        service_account="pkobatch-runner",
        container={
            "workingDir": str(workdir),
            "envFrom": [
                {"prefix": "CM_", "configMapRef": {"name": "settings"}},
                {"secretRef": {"name": "creds"}},
                {"configMapRef": {"name": "absent", "optional": True}},
            ],
        },
    )
    kube.create(JOBS, manifest, namespace)

    kind, _, job = wait_job(namespace, "env")

    assert kind == "Complete"
    (pod,) = job_pods(namespace, "env")
    name = pod["metadata"]["name"]
    seen = json.loads(cluster.pod_logs.read(namespace, name))
    got = seen["env"]
    assert seen["cwd"] == str(workdir)
    assert got["PLAIN"] == "plain"
    # COLOR is defined after EXPANDED: not yet visible to its expansion, as in Kubernetes.
    assert got["EXPANDED"] == "plain-$(COLOR)-$(PLAIN)-$(UNDEFINED)"
    assert got["PASSWORD"] == "s3cret"
    assert got["COLOR"] == "blue"
    assert "OPTIONAL" not in got
    assert got["POD_NAME"] == name == got["HOSTNAME"]
    assert got["POD_NAMESPACE"] == namespace
    assert got["POD_UID"] == pod["metadata"]["uid"]
    assert got["SA"] == "pkobatch-runner"
    assert got["JOB_LABEL"] == "env"
    assert got["JOB_UID"] == job["metadata"]["uid"]
    assert got["CM_color"] == "blue" and got["CM_SIZE"] == "3"
    assert got["TOKEN"] == "tok" and got["password"] == "s3cret"
    assert "PKOBATCH_AGENT_ONLY" not in got
    interpreter_dir = str(Path(sys.executable).parent)
    first_on_path = str(cluster.tools.pulumi) if cluster.tools.pulumi else interpreter_dir
    assert got["PATH"].split(os.pathsep)[0] == first_on_path
    assert interpreter_dir in got["PATH"].split(os.pathsep)
    assert Path(got["KUBECONFIG"]).stat().st_mode & 0o077 == 0


def test_missing_secret_keeps_the_pod_pending_until_it_exists(
    kube: Kube, namespace: str, python_job: Any, wait_job: Any, job_pods: Any
) -> None:
    env = [{"name": "V", "valueFrom": {"secretKeyRef": {"name": "later", "key": "v"}}}]
    kube.create(JOBS, python_job("waits", "import os; print(os.environ['V'])", env=env), namespace)

    def waiting_reason() -> str | None:
        pods = job_pods(namespace, "waits")
        statuses = (pods[0].get("status") or {}).get("containerStatuses") if pods else None
        if not statuses:
            return None
        return str((statuses[0]["state"].get("waiting") or {}).get("reason"))

    wait_until(
        lambda: waiting_reason() == "CreateContainerConfigError",
        timeout=60,
        what="CreateContainerConfigError",
    )
    assert job_pods(namespace, "waits")[0]["status"]["phase"] == "Pending"
    kube.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "later"},
            "stringData": {"v": "arrived"},
        },
        namespace,
    )

    kind, _, _ = wait_job(namespace, "waits")

    assert kind == "Complete"


RBAC_PROBE = textwrap.dedent(
    """
    import sys
    from pkobatch.kube.client import SECRETS, Forbidden, Kube
    kube = Kube.connect()
    try:
        kube.get(SECRETS, "probe", sys.argv[1])
    except Forbidden as exc:
        print("forbidden:", exc)
        sys.exit(7)
    print("read the secret")
    """
)


def test_service_account_token_is_subject_to_rbac(
    kube: Kube, namespace: str, python_job: Any, wait_job: Any, job_pods: Any
) -> None:
    kube.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "probe"},
            "stringData": {"k": "v"},
        },
        namespace,
    )

    def probe(name: str) -> tuple[str, JSON]:
        manifest = python_job(name, RBAC_PROBE, service_account="pkobatch-runner")
        manifest["spec"]["template"]["spec"]["containers"][0]["args"] = [namespace]
        kube.create(JOBS, manifest, namespace)
        kind, _, _ = wait_job(namespace, name)
        (pod,) = job_pods(namespace, name)
        return kind, pod

    kind, pod = probe("denied")
    assert kind == "Failed"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 7
    assert "system:serviceaccount:" + namespace + ":pkobatch-runner" in terminated["message"]

    grant(kube, namespace, [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}])

    kind, pod = probe("allowed")
    assert kind == "Complete"


def test_at_most_max_running_pods_run_at_once(
    kube: Kube, namespace: str, tmp_path: Path, cluster: Any, python_job: Any, wait_job: Any
) -> None:
    record = tmp_path / "intervals"
    record.mkdir()
    code = textwrap.dedent(
        """
        import os, time
        start = time.time()
        time.sleep(1.5)
        path = os.path.join(os.environ["RECORD"], os.environ["HOSTNAME"])
        open(path, "w").write(f"{start} {time.time()}")
        """
    )
    limit = cluster.agent.slots.limit
    cluster.agent.slots.limit = 2
    try:
        manifest = python_job(
            "limited",
            code,
            env=[{"name": "RECORD", "value": str(record)}],
            parallelism=5,
            completions=5,
        )
        kube.create(JOBS, manifest, namespace)
        kind, _, _ = wait_job(namespace, "limited", timeout=180)
    finally:
        cluster.agent.slots.limit = limit

    assert kind == "Complete"
    intervals = [tuple(map(float, p.read_text().split())) for p in record.iterdir()]
    assert len(intervals) == 5
    most = max(sum(1 for s, e in intervals if s <= t < e) for t, _ in intervals)
    assert most <= 2


def test_pod_logs_follow_until_the_pod_ends(
    kube: Kube, namespace: str, cluster: Any, python_job: Any, job_pods: Any
) -> None:
    code = "import time\nfor i in range(5):\n    print('tick', i, flush=True)\n    time.sleep(0.3)"
    kube.create(JOBS, python_job("ticks", code), namespace)
    wait_until(
        lambda: any(p["status"].get("phase") == "Running" for p in job_pods(namespace, "ticks")),
        timeout=60,
        what="the pod to run",
    )
    pod = job_pods(namespace, "ticks")[0]["metadata"]["name"]

    # pods/log through the API server, which calls the node agent as it would a kubelet.
    lines = list(cluster.pod_logs.follow(namespace, pod))

    assert lines == [f"tick {i}\n" for i in range(5)]
    assert kube.get(PODS, pod, namespace)["status"]["phase"] == "Succeeded"


# On SIGTERM: wait a little, then use the pod's own token to read the pod and write a
# ConfigMap saying what it saw — what the runner does to write its `Cancelled` result.
WRITES_ON_SIGTERM = textwrap.dedent(
    """
    import os, signal, sys, time
    from pkobatch.kube.client import CONFIGMAPS, PODS, Kube

    def on_sigterm(signum, frame):
        time.sleep(2)
        kube = Kube.connect()
        namespace, name = os.environ["POD_NAMESPACE"], os.environ["HOSTNAME"]
        meta = kube.get(PODS, name, namespace)["metadata"]
        data = {
            "pod": name,
            "deletionTimestamp": meta.get("deletionTimestamp") or "",
            "deletionGracePeriodSeconds": str(meta.get("deletionGracePeriodSeconds")),
        }
        body = {"metadata": {"name": "cancelled-" + os.environ["JOB_NAME"]}, "data": data}
        kube.create(CONFIGMAPS, body, namespace)
        print("result written", flush=True)
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)
    open(os.environ["READY_FILE"], "w").write(str(os.getpid()))
    while True:
        time.sleep(0.1)
    """
)


def grant(kube: Kube, namespace: str, rules: list[JSON]) -> None:
    """Grant ServiceAccount pkobatch-runner ``rules`` in ``namespace``."""
    grant_role(kube, namespace, "runner", rules, "pkobatch-runner")


@pytest.mark.parametrize("ending", ["job deleted", "deadline passed"])
def test_a_terminated_pod_keeps_its_token_through_the_grace_period(
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    cluster: Any,
    python_job: Any,
    wait_job: Any,
    job_pods: Any,
    ending: str,
) -> None:
    grant(
        kube,
        namespace,
        [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        ],
    )
    ready = tmp_path / "ready"
    env = [
        {"name": "READY_FILE", "value": str(ready)},
        {"name": "JOB_NAME", "value": "cancel-me"},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    spec: JSON = {"activeDeadlineSeconds": 8} if ending == "deadline passed" else {}
    manifest = python_job(
        "cancel-me", WRITES_ON_SIGTERM, env=env, service_account="pkobatch-runner", grace=30, **spec
    )
    kube.create(JOBS, manifest, namespace)
    wait_until(lambda: len(read_pids(ready)) == 1, timeout=60, what="the pod to start")
    (pid,) = read_pids(ready)
    (pod,) = job_pods(namespace, "cancel-me")
    pod_name = pod["metadata"]["name"]

    if ending == "job deleted":
        # As the controller cancels a run: the Job stays until its pods are gone.
        kube.delete(JOBS, "cancel-me", namespace, propagation="Foreground")
    else:
        kind, reason, _ = wait_job(namespace, "cancel-me")
        assert (kind, reason) == ("Failed", "DeadlineExceeded")

    wait_until(
        lambda: kube.get_or_none(CONFIGMAPS, "cancelled-cancel-me", namespace) is not None,
        timeout=60,
        what="the ConfigMap written on SIGTERM",
    )
    written = kube.get(CONFIGMAPS, "cancelled-cancel-me", namespace)["data"]
    # The pod object was still there, terminating with its grace period, as on a real node.
    assert written["pod"] == pod_name
    assert written["deletionTimestamp"]
    assert written["deletionGracePeriodSeconds"] == "30"
    wait_until(lambda: not alive(pid), timeout=60, what="the process to end")
    wait_until(
        lambda: kube.get_or_none(PODS, pod_name, namespace) is None,
        timeout=60,
        what="the pod to be removed once its process ended",
    )
    if ending == "job deleted":
        wait_until(
            lambda: kube.get_or_none(JOBS, "cancel-me", namespace) is None,
            timeout=60,
            what="the Job's foreground deletion to finish",
        )
    # The pod is gone: the agent's own file.
    assert "result written" in (cluster.log_dir / namespace / f"{pod_name}.log").read_text()


def bare_pod(name: str, code: str, node_name: str, *, grace: int = 30) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node_name,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": grace,
            "containers": [
                {"name": "main", "image": "python:3.11", "command": [sys.executable, "-c", code]}
            ],
        },
    }


def pod_condition(pod: JSON, kind: str) -> JSON:
    for condition in pod["status"].get("conditions") or []:
        if condition["type"] == kind:
            return dict(condition)
    return {}


def test_stopping_the_agent_ends_its_pods_and_lets_the_namespace_go(
    kube: Kube, namespace: str, tmp_path: Path, cluster: Any
) -> None:

    node = f"stop-test-{os.getpid()}"
    agent = NodeAgent(
        kube,
        server=cluster.server,
        ca_pem=cluster.control_plane.ca_file.read_bytes(),
        state_dir=tmp_path / "agent",
        node_name=node,
        shutdown_grace=2,
    )
    agent.start()
    stubborn = textwrap.dedent(
        """
        import os, signal, time
        signal.signal(signal.SIGTERM, lambda *a: print("got SIGTERM", flush=True))
        open(os.environ["HOSTNAME"] + ".pid", "w").write(str(os.getpid()))
        while True:
            time.sleep(0.1)
        """
    )
    try:
        for name in ("running", "deleting"):
            pod = bare_pod(name, stubborn, node, grace=600)
            pod["spec"]["containers"][0]["workingDir"] = str(tmp_path)
            kube.create(PODS, pod, namespace)
        pid_files = [tmp_path / "running.pid", tmp_path / "deleting.pid"]
        wait_until(
            lambda: all(len(read_pids(p)) == 1 for p in pid_files), timeout=60, what="both pods"
        )
        pids = [pid for p in pid_files for pid in read_pids(p)]
        kube.delete(PODS, "deleting", namespace)
        log = agent.log_dir / namespace / "deleting.log"
        wait_until(
            lambda: log.exists() and "got SIGTERM" in log.read_text(),
            timeout=30,
            what="SIGTERM",
        )
        # Bound to the node: the pod stays, terminating, while its process runs.
        assert kube.get(PODS, "deleting", namespace)["metadata"]["deletionTimestamp"]
    finally:
        agent.stop()

    assert not any(alive(pid) for pid in pids)
    running = kube.get(PODS, "running", namespace)
    assert running["status"]["phase"] == "Failed"
    disruption = pod_condition(running, "DisruptionTarget")
    assert (disruption["status"], disruption["reason"]) == ("True", "TerminationByKubelet")
    assert kube.get_or_none(PODS, "deleting", namespace) is None

    kube.delete(NAMESPACES, namespace)
    wait_until(
        lambda: kube.get_or_none(NAMESPACES, namespace) is None,
        timeout=120,
        what="the namespace to be deleted",
    )


def test_a_pod_left_running_by_an_earlier_agent_is_reported_and_released(
    kube: Kube, namespace: str, tmp_path: Path, cluster: Any
) -> None:

    node = f"crashed-{os.getpid()}"
    kube.create(PODS, bare_pod("orphan", "import time; time.sleep(600)", node), namespace)
    # What an agent that crashed while the pod ran leaves behind.
    kube.request(
        "PATCH",
        PODS.path(namespace, "orphan", "status"),
        body={"status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}},
        content_type="application/strategic-merge-patch+json",
    )
    kube.create(PODS, bare_pod("fresh", "print('ran')", node), namespace)
    agent = NodeAgent(
        kube,
        server=cluster.server,
        ca_pem=cluster.control_plane.ca_file.read_bytes(),
        state_dir=tmp_path / "agent",
        node_name=node,
    )
    agent.start()
    try:
        wait_until(
            lambda: kube.get(PODS, "fresh", namespace)["status"].get("phase") == "Succeeded",
            timeout=60,
            what="the pod created bound to the node to run",
        )
        orphan = kube.get(PODS, "orphan", namespace)
        assert orphan["status"]["phase"] == "Failed"
        terminated = orphan["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == 137
        assert pod_condition(orphan, "DisruptionTarget")["status"] == "True"
        assert not (agent.log_dir / namespace / "orphan.log").exists()
        assert (agent.log_dir / namespace / "fresh.log").read_text() == "ran\n"
    finally:
        agent.stop()


def test_pods_log_is_served_through_the_api_server_as_by_a_kubelet(
    kube: Kube, namespace: str, cluster: Any, python_job: Any, wait_job: Any, job_pods: Any
) -> None:
    code = "for i in range(10):\n    print('line', i)"
    kube.create(JOBS, python_job("printer", code), namespace)
    wait_job(namespace, "printer")
    pod = job_pods(namespace, "printer")[0]["metadata"]["name"]
    kubectl = [
        str(Path(sys.executable).parent / "kubectl"),
        "--kubeconfig",
        str(cluster.kubeconfig),
    ]

    whole = subprocess.run(
        [*kubectl, "logs", "-n", namespace, pod], capture_output=True, text=True, timeout=60
    )
    tail = subprocess.run(
        [*kubectl, "logs", "-n", namespace, pod, "--tail", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert whole.returncode == 0, whole.stderr
    assert whole.stdout == "".join(f"line {i}\n" for i in range(10))
    assert tail.stdout == "line 7\nline 8\nline 9\n"
    assert cluster.pod_logs.read(namespace, pod, container="main", tail_lines=1) == "line 9\n"
    # The Node tells the API server where the endpoint is; it accepts only the cluster's
    # client certificates (the API server's), over TLS.
    node = kube.get(NODES, cluster.agent.node_name)
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
    anonymous = ssl.create_default_context(cafile=str(cluster.control_plane.ca_file))

    def answer_without_client_certificate() -> bytes:
        request = f"GET /containerLogs/{namespace}/{pod}/main HTTP/1.1\r\n\r\n".encode()
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                anonymous.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
            ):
                tls.sendall(request)
                return tls.recv(1024)
        except (ssl.SSLError, ConnectionError):
            return b""

    assert answer_without_client_certificate() == b""
