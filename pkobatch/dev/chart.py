"""The Helm chart's copies of files whose source is elsewhere in the repository.

The chart (``deploy/helm/pkobatch``) installs the CRDs of ``crds/`` from its own ``crds/``
and reads its RBAC rules, admission policy, alerts and dashboard from ``files/kustomize/``,
copies of ``deploy/kustomize``'s. They are copies, not symbolic links: Flux's
source-controller leaves links out of a GitRepository's artifact, so a HelmRelease from git
would get no CRDs and empty RBAC rules. Edit the sources, then copy:

    python -m pkobatch.dev.chart            # write the copies
    python -m pkobatch.dev.chart --check    # exit 1 naming every copy out of step

``tests/unit/test_helm_chart.py`` fails when a copy drifts from its source.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
CHART: Final = Path("deploy/helm/pkobatch")
CRDS: Final = Path("crds")
KUSTOMIZE: Final = Path("deploy/kustomize")
KUSTOMIZE_FILES: Final = (
    "base/controller-clusterrole.yaml",
    "base/controller-secret-policy.yaml",
    "base/leader-election-role.yaml",
    "base/runner-clusterrole.yaml",
    "components/monitoring/prometheusrule.yaml",
    "components/monitoring/pkobatch-dashboard.json",
)
"""What the chart reads from ``deploy/kustomize`` (into ``files/kustomize/<file name>``)."""


def chart_copies(root: Path = REPO_ROOT) -> dict[Path, Path]:
    """Each copy in the chart -> its source, both relative to the repository ``root``: every
    CRD of ``crds/`` and the files of ``KUSTOMIZE_FILES``."""
    copies = {
        CHART / "crds" / crd.name: CRDS / crd.name
        for crd in sorted((root / CRDS).glob("*.yaml"))
        if crd.name != "kustomization.yaml"
    }
    for file in KUSTOMIZE_FILES:
        copies[CHART / "files" / "kustomize" / Path(file).name] = KUSTOMIZE / file
    return copies


def drifted(root: Path = REPO_ROOT) -> list[str]:
    """What is out of step in the chart: copies that differ from their source or are
    missing, and files in the copies' directories that no source has."""
    copies = chart_copies(root)
    found = []
    for copy, source in copies.items():
        path = root / copy
        if path.is_symlink() or not path.is_file():
            found.append(f"{copy}: not a copy of {source}")
        elif path.read_bytes() != (root / source).read_bytes():
            found.append(f"{copy}: differs from {source}")
    for directory in {copy.parent for copy in copies}:
        for path in sorted((root / directory).iterdir()):
            if path.relative_to(root) not in copies:
                found.append(f"{path.relative_to(root)}: has no source")
    return found


def sync(root: Path = REPO_ROOT) -> list[Path]:
    """Write every copy from its source (a link in its place is replaced) and remove the
    files no source has; the copies that changed."""
    copies = chart_copies(root)
    changed = []
    for copy, source in copies.items():
        path = root / copy
        content = (root / source).read_bytes()
        if not path.is_symlink() and path.is_file() and path.read_bytes() == content:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        path.write_bytes(content)
        changed.append(copy)
    for directory in {copy.parent for copy in copies}:
        for path in sorted((root / directory).iterdir()):
            if path.relative_to(root) not in copies:
                path.unlink()
                changed.append(path.relative_to(root))
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pkobatch.dev.chart",
        description="Copy crds/ and deploy/kustomize's files into the Helm chart.",
    )
    parser.add_argument(
        "--check", action="store_true", help="only report copies out of step (exit 1)"
    )
    if parser.parse_args(argv).check:
        found = drifted()
        for line in found:
            print(line, file=sys.stderr)
        if found:
            print("run: python -m pkobatch.dev.chart", file=sys.stderr)
        return 1 if found else 0
    for copy in sync():
        print(f"wrote {copy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
