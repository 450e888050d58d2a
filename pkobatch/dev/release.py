"""What a release checks before it publishes anything (``.github/workflows/release.yml``).

pkobatch's version is the one ``pkobatch/__init__.py`` declares (``pkobatch --version``,
the wheel's version, the default image tags); a release is the git tag ``v<version>``. A tag
is released only when it names that version, the chart's version and appVersion are that
version, and ``CHANGELOG.md`` has a section for it, whose text becomes the release notes:

    python -m pkobatch.dev.release check v0.1.0     # exit 1 naming every mismatch
    python -m pkobatch.dev.release notes 0.1.0      # the changelog's section for 0.1.0
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import yaml

from pkobatch import __version__

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
CHART_FILE: Final = Path("deploy/helm/pkobatch/Chart.yaml")
CHANGELOG: Final = Path("CHANGELOG.md")


def changelog_section(changelog: str, version: str) -> str | None:
    """The text under ``## [<version>]`` (up to the next section), or None without one."""
    match = re.search(
        rf"^## \[{re.escape(version)}\][^\n]*\n(.*?)(?=^## \[|\Z)", changelog, re.M | re.S
    )
    return match.group(1).strip() if match else None


def release_problems(tag: str, root: Path = REPO_ROOT, version: str = __version__) -> list[str]:
    """Why ``tag`` cannot be released from the tree at ``root`` (none when it can)."""
    problems = []
    if tag != f"v{version}":
        problems.append(f"the tag {tag} is not v{version}, the version pkobatch/__init__.py says")
    chart = yaml.safe_load((root / CHART_FILE).read_text())
    for field in ("version", "appVersion"):
        if str(chart[field]) != version:
            problems.append(f"{CHART_FILE} has {field} {chart[field]}, not {version}")
    if not changelog_section((root / CHANGELOG).read_text(), version):
        problems.append(f"{CHANGELOG} has no section ## [{version}]")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pkobatch.dev.release")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="may this tag be released?").add_argument("tag")
    commands.add_parser("notes", help="the changelog's section").add_argument("version")
    args = parser.parse_args(argv)
    if args.command == "check":
        problems = release_problems(args.tag)
        for problem in problems:
            print(f"release: {problem}", file=sys.stderr)
        return 1 if problems else 0
    notes = changelog_section((REPO_ROOT / CHANGELOG).read_text(), args.version)
    if notes is None:
        print(f"release: {CHANGELOG} has no section ## [{args.version}]", file=sys.stderr)
        return 1
    print(notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
