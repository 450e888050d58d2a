"""The Automation API, started while a run fetches its source.

Before its first command the Automation API costs about a quarter of a second: importing the
SDK (gRPC, protobuf, OpenTelemetry) and ``pulumi version``, which the SDK runs to check the
CLI. Neither depends on the program, so ``PulumiStart`` begins both as a run starts — the
version as a process, the import on a thread — and ``command()`` collects them once the source
is there. Only these two overlap the checkout: every Pulumi command of the run still runs
after it, one at a time, as before.

This module must not import the SDK itself (``pkobatch.runner.pulumi_cli`` does), and neither
may the code that runs before ``command()``: ``failures.pulumi_command_failure`` recognizes
the SDK's errors without importing it.
"""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Final

from pkobatch.runner.failures import RunFailure

if TYPE_CHECKING:
    from pkobatch.runner.cancel import Cancellation
    from pkobatch.runner.pulumi_cli import RunnerPulumiCommand

# The CLI the runner runs, from PATH (the Automation API's default too).
PULUMI_CLI: Final = "pulumi"
_SDK_MODULE: Final = "pkobatch.runner.pulumi_cli"


def _import_sdk() -> None:
    # An error here surfaces when ``command()`` imports the module again.
    with contextlib.suppress(Exception):
        importlib.import_module(_SDK_MODULE)


class PulumiStart:
    """``pulumi version`` and the SDK's import, begun now; ``command()`` waits for both."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = dict(env)
        self._import = threading.Thread(target=_import_sdk, name="pkobatch-import-pulumi")
        self._import.start()
        self._version: subprocess.Popen[str] | None = None
        with contextlib.suppress(FileNotFoundError):  # command() says so
            self._version = subprocess.Popen(
                [PULUMI_CLI, "version"],
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
            )

    def command(self, cancellation: Cancellation) -> RunnerPulumiCommand:
        """The run's ``RunnerPulumiCommand`` (with the CLI's version checked)."""
        if self._version is None:
            raise RunFailure(
                "JobFailed",
                "the pulumi CLI is not on PATH: the runner image must provide it "
                "(see jobs/Dockerfile)",
            )
        stdout, stderr = self._version.communicate()
        if self._version.returncode != 0:
            raise RunFailure(
                "JobFailed",
                f"`pulumi version` failed (exit status {self._version.returncode}): "
                f"{(stderr or stdout).strip()}",
            )
        self._import.join()
        from pkobatch.runner.pulumi_cli import RunnerPulumiCommand

        return RunnerPulumiCommand(cancellation, self._env, version=stdout, command=PULUMI_CLI)

    def close(self) -> None:
        """Wait for what was started (a run that failed before needing Pulumi)."""
        if self._version is not None:
            self._version.communicate()
        self._import.join()

    def __enter__(self) -> PulumiStart:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
