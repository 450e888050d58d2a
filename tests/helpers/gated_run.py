"""A run program for controller tests that must act while a run is in progress.

    PKOBATCH_JOB__COMMAND=<python>,tests/helpers/gated_run.py,<gate directory>

The controller appends ``--snapshot <json>``. Like the real runner, the run reads its own Job
at start (``ResultWriter.load_job``: the result copies that Job's labels as they were then);
it then waits until the file ``<gate directory>/<stack name>`` exists, and writes a succeeded
result with the runner's own writer, which also vouches for it in the pod's termination
message. Its output ``run`` is the Job's name.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pkobatch.api.run import JOB_UID_ENV, SNAPSHOT_FLAG, RunResult, RunSnapshot, StackRef
from pkobatch.kube.client import Kube
from pkobatch.runner.report import ResultWriter, termination_log_path

GATE_TIMEOUT_SECONDS = 900.0


def main(gate_dir: Path, flag: str, snapshot_text: str) -> None:
    assert flag == SNAPSHOT_FLAG, f"expected {SNAPSHOT_FLAG}, got {flag}"
    snapshot = RunSnapshot.model_validate_json(snapshot_text)
    stack = snapshot.stack
    assert snapshot.result_config_map, "the snapshot names no result ConfigMap"
    writer = ResultWriter(
        Kube.connect,
        stack.namespace,
        snapshot.result_config_map,
        termination_log=termination_log_path(os.environ),
        job_uid=os.environ.get(JOB_UID_ENV, ""),
    )
    writer.load_job()
    gate = gate_dir / stack.name
    deadline = time.monotonic() + GATE_TIMEOUT_SECONDS
    while not gate.exists():
        if time.monotonic() > deadline:
            sys.exit(f"gate {gate} never opened")
        time.sleep(0.2)
    writer.write(
        RunResult(
            operation=snapshot.operation,
            state="succeeded",
            reason="Succeeded",
            stack=StackRef(name=stack.name, namespace=stack.namespace, uid=stack.uid),
            job_name=snapshot.job_name,
            generation=snapshot.generation,
            reconcile_request=snapshot.reconcile_request,
            commit=snapshot.commit,
            outputs={"run": snapshot.job_name},
        )
    )
    writer.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
