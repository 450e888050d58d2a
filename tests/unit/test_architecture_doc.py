"""docs/architecture.md's "Where does X live" table names real modules, one per row."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def where_table() -> list[tuple[str, str]]:
    text = (REPO / "docs/architecture.md").read_text()
    section = text.split("## Where does X live", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    return [(cells[0], cells[1]) for cells in (row.strip("| ").split(" | ") for row in rows)]


def test_every_row_names_one_existing_module() -> None:
    rows = where_table()
    assert len(rows) >= 7
    for what, module in rows:
        paths = re.findall(r"`([^`]+)`", module)
        assert len(paths) == 1, f"{what!r} names {len(paths)} modules"
        assert (REPO / paths[0]).is_file(), f"{what!r} names {paths[0]}, which does not exist"


def test_the_table_answers_what_a_newcomer_asks_first() -> None:
    asked = " ".join(what for what, _ in where_table()).lower()
    for topic in (
        "becomes a job",
        "retry",
        "becomes status",
        "operation request",
        "branch polling",
        "schedule",
        "secret",
    ):
        assert topic in asked, f"no row about {topic}"
