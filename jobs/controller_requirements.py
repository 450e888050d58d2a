"""Print the requirements of the controller image: pyproject.toml's dependencies without the
ones only the runner imports.

    python3 jobs/controller_requirements.py pyproject.toml > requirements.txt

The controller image (``jobs/Dockerfile``, target ``controller``) installs these, then
pkobatch itself with ``--no-deps``. ``pip install pkobatch`` still installs everything. The
runner-only distributions are listed here and nowhere else; import-linter's contract "the
controller does not import the runner's Pulumi SDK" keeps the controller from importing them
(tests/unit/test_images.py checks that both name the same ones). Runs on a bare Python 3.11:
the image's, before anything is installed.
"""

from __future__ import annotations

import re
import sys
import tomllib

RUNNER_ONLY = ("pulumi",)
"""Distributions only the runner imports: the Pulumi SDK (it brings gRPC and protobuf)."""


def distribution(requirement: str) -> str:
    """The normalized distribution name of a PEP 508 requirement."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def controller_requirements(pyproject: str) -> list[str]:
    dependencies: list[str] = tomllib.loads(pyproject)["project"]["dependencies"]
    return [d for d in dependencies if distribution(d) not in RUNNER_ONLY]


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as file:
        print("\n".join(controller_requirements(file.read())))
