"""The Automation API, adapted to run inside a Job.

``RunnerPulumiCommand`` is the Automation API's ``PulumiCommand``, made from the output of a
``pulumi version`` run beforehand (``pkobatch.runner.pulumi_start``), with a ``run`` that does
what the SDK's does (``--non-interactive``, ``PULUMI_AUTOMATION_API``, line callbacks, the
SDK's typed errors) plus three things a Job needs:

- the CLI starts in its own session and is tracked by the run's ``Cancellation``, which can
  interrupt it the way Pulumi expects (see ``pkobatch.runner.cancel``);
- no command starts once the run is cancelled;
- a failed command's output stays attached to the error (``command_output``), so the
  runner can classify it and quote Pulumi's own message;
- a command can be given standard input (``stdin_text``): ``RunnerWorkspace`` sets a secret
  or large config value that way, never as an argument (``set_planned_config``).

``RunnerWorkspace`` reads stack outputs *masked* — one ``pulumi stack output --json``
without ``--show-secrets`` — so secret outputs are ``"[secret]"`` at any depth and their
plaintext never reaches the runner. The one exception is explicit:
``stack_outputs_with_secrets``, called only to export outputs (``pkobatch.runner.exports``),
whose caller registers every secret value with the run's redactor before anything else.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections.abc import Mapping
from typing import IO, Any

from pulumi.automation import (
    LocalWorkspace,
    OutputMap,
    OutputValue,
    PulumiCommand,
)
from pulumi.automation._cmd import CommandResult, OnOutput, _parse_and_validate_pulumi_version
from pulumi.automation._env import _SKIP_VERSION_CHECK_VAR
from pulumi.automation._minimum_version import _MINIMUM_VERSION
from pulumi.automation.errors import create_command_error

from pkobatch.api.run import SECRET_PLACEHOLDER
from pkobatch.runner.cancel import Cancellation
from pkobatch.runner.failures import OUTPUT_ATTRIBUTE, RunFailure, stopping_at
from pkobatch.runner.stack_config import ConfigPlan


def _pump(stream: IO[str], callback: OnOutput | None, sink: list[str]) -> None:
    for line in iter(stream.readline, ""):
        stripped = line.rstrip()
        if callback is not None:
            callback(stripped)
        sink.append(stripped)
    stream.close()


def _feed(stream: IO[str] | None, text: str) -> None:
    assert stream is not None
    with contextlib.suppress(BrokenPipeError):  # the command failed early; its error says why
        stream.write(text)
    with contextlib.suppress(BrokenPipeError):
        stream.close()


class RunnerPulumiCommand(PulumiCommand):
    """A ``PulumiCommand`` whose processes a ``Cancellation`` can interrupt."""

    def __init__(
        self, cancellation: Cancellation, env: Mapping[str, str], version: str, command: str
    ) -> None:
        """``version``: what ``pulumi version`` printed by the CLI ``command``. It is checked
        as the SDK's own constructor checks it; that constructor is not called because it runs
        the command."""
        self._cancellation = cancellation
        self._env = dict(env)
        self.command = command
        self.version = _parse_and_validate_pulumi_version(
            min_version=_MINIMUM_VERSION,
            current_version=version.strip().removeprefix("v"),
            opt_out=os.getenv(_SKIP_VERSION_CHECK_VAR) is not None,
        )

    def run(
        self,
        args: list[str],
        cwd: str,
        additional_env: Mapping[str, str],
        on_output: OnOutput | None = None,
        on_error: OnOutput | None = None,
        *,
        stdin_text: str | None = None,
    ) -> CommandResult:
        self._cancellation.raise_if_requested()
        separator = args.index("--") if "--" in args else len(args)
        if "--non-interactive" not in args[:separator]:
            args.insert(0, "--non-interactive")
        env = {**self._env, **additional_env, "PULUMI_AUTOMATION_API": "true"}
        if os.path.isabs(self.command):
            env["PATH"] = os.pathsep.join([os.path.dirname(self.command), env.get("PATH", "")])
        stdout: list[str] = []
        stderr: list[str] = []
        with subprocess.Popen(
            [self.command, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL if stdin_text is None else subprocess.PIPE,
            cwd=cwd,
            env=env,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
        ) as process:
            assert process.stdout is not None and process.stderr is not None
            readers = [
                threading.Thread(target=_pump, args=(process.stdout, on_output, stdout)),
                threading.Thread(target=_pump, args=(process.stderr, on_error, stderr)),
            ]
            if stdin_text is not None:
                readers.append(threading.Thread(target=_feed, args=(process.stdin, stdin_text)))
            with self._cancellation.track(process, graceful=True):
                for reader in readers:
                    reader.start()
                for reader in readers:
                    reader.join()
                process.wait()
        result = CommandResult(
            stdout="\n".join(stdout), stderr="\n".join(stderr), code=process.returncode
        )
        if result.code != 0:
            error = create_command_error(result)
            setattr(error, OUTPUT_ATTRIBUTE, (result.stdout, result.stderr))
            raise error
        return result


class RunnerWorkspace(LocalWorkspace):
    """A ``LocalWorkspace`` that never asks Pulumi for secret plaintext."""

    def set_planned_config(self, stack_name: str, plan: ConfigPlan) -> None:
        """Set the config as ``plan`` says: its ``set-all`` calls, then its values from
        standard input."""
        for arguments in plan.set_all:
            self._run_pulumi_cmd_sync(["config", "set-all", "--stack", stack_name, *arguments])
        for key, item in plan.from_stdin:
            self.set_config_from_stdin(stack_name, key, str(item.value), item.secret)

    def set_config_from_stdin(self, stack_name: str, key: str, value: str, secret: bool) -> None:
        """``pulumi config set KEY`` with the value on standard input, not in the arguments.
        Pulumi drops one trailing newline from what it reads: the value gets one added."""
        command = self.pulumi_command
        assert isinstance(command, RunnerPulumiCommand)
        envs = {"PULUMI_HOME": self.pulumi_home} if self.pulumi_home else {}
        args = ["config", "set", "--secret" if secret else "--plaintext"]
        command.run(
            [*args, "--stack", stack_name, "--", key],
            self.work_dir,
            {**envs, **self.env_vars},
            stdin_text=f"{value}\n",
        )

    def cancel_update(
        self, stack_name: str, on_output: OnOutput | None, on_error: OnOutput | None
    ) -> CommandResult:
        """``pulumi cancel --yes``: the stack's lock released, whoever holds it."""
        return self._run_pulumi_cmd_sync(
            ["cancel", "--yes", "--stack", stack_name], on_output, on_error
        )

    def stack_outputs(self, stack_name: str) -> OutputMap:
        masked = self._read_outputs(["stack", "output", "--json", "--stack", stack_name])
        return {
            key: OutputValue(value=value, secret=value == SECRET_PLACEHOLDER)
            for key, value in masked.items()
        }

    def stack_outputs_with_secrets(self, stack_name: str) -> dict[str, Any]:
        """The outputs in plaintext (``--show-secrets``): only for ``spec.exportOutputs``."""
        return self._read_outputs(
            ["stack", "output", "--json", "--show-secrets", "--stack", stack_name]
        )

    def _read_outputs(self, args: list[str]) -> dict[str, Any]:
        """What ``pulumi stack output --json`` prints; a failure is one of reading the
        outputs (``outputRetrieval``): the Automation API reads them after every ``up``."""
        with stopping_at("outputRetrieval"):
            result = self._run_pulumi_cmd_sync(args)
            try:
                outputs: dict[str, Any] = json.loads(result.stdout or "{}")
            except ValueError:
                # Not quoted: with --show-secrets it may hold secret values.
                raise RunFailure("JobFailed", f"pulumi {' '.join(args)} printed no JSON") from None
        return outputs
