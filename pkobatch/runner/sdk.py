"""Whether this installation can run Pulumi: the runner's Pulumi SDK is the extra ``runner``.

``pip install pkobatch`` gives the CLI and the controller, which never import the SDK (an
import-linter contract each); the runner image and the runner bundle install
``pkobatch[runner]``. The runner's commands check first, so an installation without the extra
stops with what to install rather than an ImportError from deep inside a run.
"""

from __future__ import annotations

import importlib.util
from typing import Final

INSTALL_RUNNER_EXTRA: Final = "pip install 'pkobatch[runner]'"


def missing_runner_extra() -> str | None:
    """Why this installation cannot run Pulumi (a message for the user), or None when it can."""
    if importlib.util.find_spec("pulumi") is not None:
        return None
    return (
        "the runner needs the Pulumi SDK, which this installation of pkobatch does not "
        f"have: install the runner's extra with {INSTALL_RUNNER_EXTRA} (the CLI and the "
        "controller run without it)"
    )
