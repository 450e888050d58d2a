"""steps.schedules (and spec.schedule runs of steps.sync): schedules and drift detection."""

from __future__ import annotations

import json

import pytest
from decision_world import (
    GIT_SPEC,
    deployed_world,
)


def test_schedule_runs_the_normal_operation_at_its_times() -> None:
    world = deployed_world({**GIT_SPEC, "schedule": "0 13 * * *"})
    result = world.step()
    assert result.create_job is None
    assert result.requeue_after == pytest.approx(3600)
    world.advance(3600)
    result = world.step()
    assert result.create_job is not None
    assert "scheduled run 2026-01-01T13:00:00Z" in result.events[0].message
    assert world.status["lastScheduleTime"] == "2026-01-01T13:00:00Z"
    world.finish()
    world.step()
    assert world.step().create_job is None


def test_missed_schedule_beyond_the_starting_deadline_is_skipped() -> None:
    world = deployed_world({**GIT_SPEC, "schedule": "0 13 * * *"})
    world.advance(3600 + 7200)  # controller was down from before 13:00 until 15:00
    assert world.step().create_job is None


def test_drift_check_detects_and_remediates() -> None:
    world = deployed_world(
        {**GIT_SPEC, "driftDetection": {"schedule": "30 12 * * *", "remediate": True}}
    )
    world.advance(1800)
    result = world.step()
    assert result.create_job is not None
    check = result.create_job["metadata"]["name"]
    assert "-refresh-" in check
    snapshot = json.loads(result.create_job["spec"]["template"]["spec"]["containers"][0]["args"][1])
    assert snapshot["driftCheck"] is True
    assert world.condition("Ready")["status"] == "True"  # a check is not an update
    world.finish(drifted=2)
    result = world.step()
    drifted = world.condition("Drifted")
    assert drifted["status"] == "True" and "2 resource(s) drifted" in drifted["message"]
    assert "DriftDetected" in [e.reason for e in result.events]
    assert world.status["lastDriftCheck"]["driftedResources"] == 2
    # remediation: an up with refresh
    assert result.create_job is not None
    remediation = json.loads(
        result.create_job["spec"]["template"]["spec"]["containers"][0]["args"][1]
    )
    assert remediation["operation"] == "up" and remediation["spec"]["refresh"] is True
    world.finish()
    world.step()
    assert world.condition("Drifted")["reason"] == "Remediated"
    assert world.step().create_job is None


def test_drift_check_without_remediation_only_reports() -> None:
    world = deployed_world({**GIT_SPEC, "driftDetection": {"schedule": "30 12 * * *"}})
    world.advance(1800)
    world.step()
    world.finish(drifted=1)
    result = world.step()
    assert result.create_job is None
    assert world.condition("Drifted")["status"] == "True"
    ready = world.condition("Ready")
    # GitOps tools show Ready's message as the health message: it names the drift.
    assert ready["status"] == "True" and "1 resource(s) drifted" in ready["message"]


def test_no_drift_sets_drifted_false() -> None:
    world = deployed_world({**GIT_SPEC, "driftDetection": {"schedule": "30 12 * * *"}})
    world.advance(1800)
    world.step()
    world.finish(drifted=0)
    world.step()
    assert world.condition("Drifted")["reason"] == "NoDrift"
    assert world.status["lastDriftCheck"]["scheduledTime"] == "2026-01-01T12:30:00Z"
