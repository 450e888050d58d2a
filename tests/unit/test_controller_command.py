"""``pkobatch controller`` option handling (the running controller is tested in
tests/integration)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pkobatch.controller.command import controller_command


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--workers", "0"], {}, "PKOBATCH_WORKERS"),
        (["--metrics-addr", "nonsense"], {}, "PKOBATCH_METRICS_ADDR"),
        ([], {"PKOBATCH_LEADER_ELECTION__LEASE_DURATION": "soon"}, "LEASE_DURATION"),
        ([], {"PKOBATCH_MAX_ACTIVE_JOBS": "-1"}, "PKOBATCH_MAX_ACTIVE_JOBS"),
        # The documented lower bound of the polling interval is enforced.
        ([], {"PKOBATCH_POLL_INTERVAL": "500ms"}, "PKOBATCH_POLL_INTERVAL"),
        ([], {"PKOBATCH_POLL_INTERVAL": "0s"}, "PKOBATCH_POLL_INTERVAL"),
        # A rate limit that would never let a request through is refused.
        ([], {"PKOBATCH_KUBE_QPS": "0"}, "PKOBATCH_KUBE_QPS"),
        (["--kube-burst", "0"], {}, "PKOBATCH_KUBE_BURST"),
        ([], {"PKOBATCH_RESYNC_PERIOD": "0s"}, "PKOBATCH_RESYNC_PERIOD"),
        # The push receiver: an address needs receivers, each NAME=KIND of a known kind.
        ([], {"PKOBATCH_RECEIVER__ADDR": ":8090"}, "PKOBATCH_RECEIVER__RECEIVERS (e.g."),
        ([], {"PKOBATCH_RECEIVER__RECEIVERS": "infra=bitbucket"}, "is not NAME=KIND"),
        ([], {"PKOBATCH_RECEIVER__RECEIVERS": "a=github,a=gitlab"}, "named twice"),
        ([], {"PKOBATCH_RECEIVER__ADDR": "8090"}, "PKOBATCH_RECEIVER__ADDR"),
        ([], {"PKOBATCH_RECEIVER__RATE": "0"}, "PKOBATCH_RECEIVER__RATE"),
        # A namespace selector is parsed at start-up, by flag or variable.
        (["--namespace-selector", "team in (a"], {}, "PKOBATCH_NAMESPACE_SELECTOR"),
        ([], {"PKOBATCH_NAMESPACE_SELECTOR": "=x"}, "is not a requirement"),
        ([], {"PKOBATCH_JOB__FLUX_MAX_UNTAR_SIZE_BYTES": "-2"}, "FLUX_MAX_UNTAR_SIZE_BYTES"),
    ],
)
def test_invalid_settings_exit_2_with_the_variable_named(
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = CliRunner().invoke(controller_command, args, env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "invalid settings" in result.output


def test_bad_flag_type_is_a_usage_error() -> None:
    result = CliRunner().invoke(controller_command, ["--workers", "many"])
    assert result.exit_code == 2
    assert "--workers" in result.output


def test_command_is_named_controller() -> None:
    assert controller_command.name == "controller"


def test_help_shows_the_defaults_the_settings_use() -> None:
    # The help once said 100 QPS after the default had become 200.
    result = CliRunner().invoke(controller_command, ["--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    help_text = " ".join(result.output.split())
    for shown in (
        "PKOBATCH_KUBE_QPS; 200]",
        "PKOBATCH_KUBE_BURST; 400]",
        "PKOBATCH_WORKERS; 4]",
        "PKOBATCH_MAX_ACTIVE_JOBS; 50]",
        "PKOBATCH_METRICS_ADDR; :8080]",
        "PKOBATCH_LOG_FORMAT; json]",
    ):
        assert shown in help_text
