"""The command line itself, without a cluster: help, docs, global options, usage errors,
and the one-line errors for a cluster that cannot be reached."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml
from click.shell_completion import get_completion_class
from click.testing import CliRunner

from pkobatch.cli.commands import USER_COMMANDS
from pkobatch.cli.completion import kubectl_completions
from pkobatch.cli.reference import cli_reference, user_group
from pkobatch.cli.session import GlobalOptions, Session, command, global_params
from pkobatch.main import build_cli

BIN = Path(sys.executable).parent

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def unreachable_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig naming a port nothing listens on."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("name", [c.name for c in USER_COMMANDS] + [None])
def test_help_fits_80_columns(runner: CliRunner, name: str | None) -> None:
    result = runner.invoke(user_group(), [name, "--help"] if name else ["--help"])

    assert result.exit_code == 0, result.output
    too_long = [line for line in result.output.splitlines() if len(line) > 80]
    assert too_long == []


def test_every_command_has_an_example() -> None:
    for cmd in USER_COMMANDS:
        assert cmd.epilog and f"pkobatch {cmd.name}" in cmd.epilog, cmd.name


def test_docs_cli_md_is_generated_from_the_commands() -> None:
    expected = cli_reference(user_group())

    assert (ROOT / "docs" / "cli.md").read_text() == expected, (
        "docs/cli.md is stale: run `python -m pkobatch.cli.reference > docs/cli.md`"
    )
    for cmd in USER_COMMANDS:
        assert f"## `pkobatch {cmd.name}`" in expected


@click.group()
def probe_group() -> None:
    """A group with the global options, as register() sets up pkobatch's."""


probe_group.params.extend(global_params())


@command("probe")
def probe() -> None:
    options = Session.current().options
    click.echo(f"{options.namespace} {options.output} {options.timeout} {options.all_namespaces}")
    overrides = options.client_overrides()
    click.echo(f"{overrides.server_url()} {overrides.headers()} {options.no_headers}")


probe_group.add_command(probe)


def test_global_options_work_before_and_after_the_command(runner: CliRunner) -> None:
    before = runner.invoke(probe_group, ["-n", "a", "-o", "json", "probe"])
    after = runner.invoke(probe_group, ["probe", "-n", "b", "--timeout", "90s", "-A"])
    both = runner.invoke(probe_group, ["-n", "a", "-o", "yaml", "probe", "-n", "b"])
    defaults = runner.invoke(probe_group, ["probe"])

    assert before.output.splitlines()[0] == "a json None False"
    assert after.output.splitlines()[0] == "b table 0:01:30 True"
    assert both.output.splitlines()[0] == "b yaml None False"
    assert defaults.output == "None table None False\nNone () False\n"


def test_connection_options_are_kubectls(runner: CliRunner) -> None:
    given = runner.invoke(
        probe_group,
        ["--as", "jane", "--as-group", "a", "probe", "--as-group", "b", "-s", "10.0.0.1:6443"],
    )
    headers = runner.invoke(probe_group, ["probe", "--no-headers", "--server", "https://k:1"])
    groups_alone = runner.invoke(probe_group, ["probe", "--as-group", "admins"])

    # The command's own copy of an option wins over the group's, as for every global option.
    assert given.output.splitlines()[1] == (
        "https://10.0.0.1:6443 (('Impersonate-User', 'jane'), ('Impersonate-Group', 'b')) False"
    )
    assert headers.output.splitlines()[1] == "https://k:1 () True"
    assert groups_alone.exit_code == 2
    assert "impersonating groups needs a user to impersonate (--as)" in groups_alone.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["get", "--status-selector", "colour=red"], "KEY=VALUE"),
        (["get", "--timeout", "5 parsecs"], "invalid duration"),
        (["get", "-o", "xml"], "'xml' is not one of"),
        (["refresh"], "exactly one of NAME, -l SELECTOR or --all"),
        (["refresh", "web", "--all"], "exactly one of NAME, -l SELECTOR or --all"),
        (["describe", "web", "-o", "json"], "does not support -o json"),
        (["logs", "web", "-o", "yaml"], "does not support -o yaml"),
        (["schedule", "web", "--next", "0"], "0 is not in the range"),
        (["outputs", "web", "-o", "name"], "does not support -o name"),
        (["logs"], "give a Stack NAME, or --controller"),
        (["logs", "web", "--controller"], "--controller takes no NAME and no --run"),
        (["completion", "tcsh"], "'tcsh' is not one of"),
    ],
)
def test_usage_errors_exit_2(
    runner: CliRunner, args: list[str], message: str, unreachable_kubeconfig: Path
) -> None:
    result = runner.invoke(user_group(), [*args, "--kubeconfig", str(unreachable_kubeconfig)])

    assert result.exit_code == 2, result.output
    assert message in result.output


def test_unreachable_cluster_is_one_line_and_exit_1(
    runner: CliRunner, unreachable_kubeconfig: Path
) -> None:
    expected = "cannot reach the Kubernetes API server at https://127.0.0.1:1 (connection refused)"
    for args in (["get"], ["describe", "web"], ["refresh", "web", "--no-wait"]):
        result = runner.invoke(user_group(), ["--kubeconfig", str(unreachable_kubeconfig), *args])

        assert result.exit_code == 1, (args, result.output)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"Error: {expected}"), line


def test_check_reports_an_unreachable_cluster_as_a_failed_check(
    runner: CliRunner, unreachable_kubeconfig: Path
) -> None:
    result = runner.invoke(user_group(), ["check", "--kubeconfig", str(unreachable_kubeconfig)])

    assert result.exit_code == 1
    assert result.stdout.splitlines()[1].split()[:3] == ["api", "server", "FAIL"]
    assert "cannot reach the Kubernetes API server" in result.stdout


def test_missing_kubeconfig_is_one_line_and_exit_1(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(user_group(), ["get", "--kubeconfig", str(tmp_path / "nope")])

    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert "pass --kubeconfig or set KUBECONFIG" in result.stderr


def test_version_client_needs_no_cluster(runner: CliRunner) -> None:
    result = runner.invoke(user_group(), ["version", "--client", "-o", "json"])

    assert result.exit_code == 0
    assert '"cli"' in result.stdout


def test_the_console_script_has_the_user_commands_and_global_options() -> None:
    from pkobatch.main import build_cli

    cli = build_cli()
    assert {c.name for c in USER_COMMANDS} <= set(cli.commands)
    assert {"kubeconfig", "context", "namespace", "all_namespaces", "output"} <= {
        p.name for p in cli.params
    }


def test_colour_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    flagged = Session(GlobalOptions(no_color=True))
    monkeypatch.setenv("NO_COLOR", "1")
    from_env = Session(GlobalOptions())

    assert flagged.out.no_color and flagged.err.no_color
    assert from_env.out.no_color and from_env.err.no_color


def test_internal_commands_work_but_are_not_in_the_user_help(runner: CliRunner) -> None:
    cli = build_cli()
    listed = runner.invoke(cli, ["--help"])
    # The first word of each line of the Commands section (descriptions wrap with more
    # indentation).
    section = listed.output.split("Commands:\n")[1].splitlines()
    commands = [line.split()[0] for line in section if line.startswith("  ") and line[2] != " "]

    assert {"get", "up", "completion", "crds"} <= set(commands)
    assert not {"job", "controller", "dev"} & set(commands)
    for internal in ("job", "controller", "dev"):
        own = runner.invoke(cli, [internal, "--help"], prog_name="pkobatch")
        assert own.exit_code == 0, own.output
        assert own.output.startswith(f"Usage: pkobatch {internal} ")


def test_completion_prints_clicks_script_for_each_shell(runner: CliRunner) -> None:
    cli = build_cli()
    for shell in ("bash", "zsh", "fish"):
        printed = runner.invoke(cli, ["completion", shell])
        completion = get_completion_class(shell)
        assert completion is not None
        assert printed.exit_code == 0, printed.output
        assert printed.output == completion(cli, {}, "pkobatch", "_PKOBATCH_COMPLETE").source()


def test_bash_completes_with_the_printed_script() -> None:
    """The script in a real bash, calling the installed pkobatch as a completion does."""
    script = subprocess.run(
        [BIN / "pkobatch", "completion", "bash"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    probe = script + (
        "\nCOMP_WORDS=(pkobatch re); COMP_CWORD=1; _pkobatch_completion pkobatch; "
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
        "COMP_WORDS=(pkobatch get --no-h); COMP_CWORD=2; COMPREPLY=(); "
        '_pkobatch_completion pkobatch; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}

    done = subprocess.run(
        ["bash", "-c", probe], capture_output=True, text=True, timeout=60, env=env, check=False
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "reconcile",
        "refresh",
        "reject",
        "resume",
        "--no-headers",
    ]


def test_kubectl_completions_answer_in_cobras_format() -> None:
    cli = build_cli()

    commands = kubectl_completions(cli, ["re"])
    flags = kubectl_completions(cli, ["get", "--no-h"])
    kubeconfig = kubectl_completions(cli, ["get", "--kubeconfig", ""])

    assert commands.splitlines() == [
        "reconcile\tRe-run a Stack's normal operation now and wait for Ready.",
        "refresh\tRun `pulumi refresh` on Stacks now.",
        "reject\tDiscard the plan awaiting approval; nothing runs until something changes.",
        "resume\tLet suspended Stacks run again, and run them now.",
        ":4",
    ]
    assert flags.splitlines() == ["--no-headers\tTables without their header line.", ":4"]
    assert kubeconfig == ":0\n"  # a file name: the shell completes it


UNREACHABLE = "cannot reach the Kubernetes API server at https://127.0.0.1:1"


def test_unlock_without_a_terminal_needs_yes(
    runner: CliRunner, unreachable_kubeconfig: Path
) -> None:
    kubeconfig = ["--kubeconfig", str(unreachable_kubeconfig)]

    refused = runner.invoke(user_group(), [*kubeconfig, "unlock", "web"], input="y\n")
    confirmed = runner.invoke(user_group(), [*kubeconfig, "unlock", "web", "--yes"])

    # Refused before the cluster is asked anything, even with "y" on standard input.
    assert refused.exit_code == 2, refused.output
    assert "standard input is not a terminal: pass --yes" in refused.stderr
    assert UNREACHABLE not in refused.stderr
    assert confirmed.exit_code == 1 and UNREACHABLE in confirmed.stderr


def on_terminal(args: list[str], answer: str) -> tuple[int, str]:
    """Run ``pkobatch ARGS`` with a pseudo-terminal as its standard streams; ``answer`` is
    typed once the confirmation prompt shows."""
    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "pkobatch.main", *args],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env={**os.environ, "NO_COLOR": "1"},
    )
    os.close(secondary)
    output = b""
    answered = False
    try:
        while True:
            ready, _, _ = select.select([primary], [], [], 60)
            assert ready, f"pkobatch {args} printed nothing for 60 s: {output!r}"
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # EIO: the command has exited and closed the terminal
                break
            if not chunk:
                break
            output += chunk
            if not answered and b"whoever holds it?" in output:
                os.write(primary, answer.encode() + b"\n")
                answered = True
    finally:
        os.close(primary)
        code = process.wait(timeout=60)
    return code, output.decode(errors="replace")


def test_unlock_on_a_terminal_asks_first(unreachable_kubeconfig: Path) -> None:
    args = ["--kubeconfig", str(unreachable_kubeconfig), "unlock", "web"]

    declined_code, declined = on_terminal(args, "n")
    accepted_code, accepted = on_terminal(args, "y")

    assert "Remove the Pulumi lock of Stack ns/web, whoever holds it? [y/N]" in declined
    assert declined_code == 1 and "not confirmed: nothing was unlocked" in declined
    assert UNREACHABLE not in declined
    # Confirmed, the command goes on to read the Stack (here: from a cluster that is not there).
    assert accepted_code == 1 and UNREACHABLE in accepted
