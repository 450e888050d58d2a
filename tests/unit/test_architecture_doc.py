"""docs/architecture.md: the "Where does X live" table names real modules, one per row; its
table of the decision's steps follows ``controller.decide``; the package table names every
package and what each may import."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pkobatch.controller.decide import DELETION_STEPS, RECONCILE_STEPS, Step

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


def steps_table() -> list[list[str]]:
    """The modules each row of the decision's steps table names, in the table's order."""
    text = (REPO / "docs/architecture.md").read_text()
    section = text.split("**Decide**", 1)[1].split("**Act**", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    return [re.findall(r"`(controller/[^`]+\.py)`", row.rsplit(" | ", 1)[1]) for row in rows]


def module_of(step: Step) -> str:
    return (
        "controller/"
        + step.__module__.removeprefix("pkobatch.controller.").replace(".", "/")
        + ".py"
    )


def test_the_steps_table_lists_decides_steps_in_order_with_their_modules() -> None:
    rows = steps_table()
    for modules in rows:
        assert modules, "a step row names no module"
        for module in modules:
            assert (REPO / "pkobatch" / module).is_file(), f"{module} does not exist"
    named = [modules[0] for modules in rows]
    deletion = named.index(module_of(DELETION_STEPS[0]))
    assert len(DELETION_STEPS) == 1
    ordered = named[deletion + 1 : deletion + 1 + len(RECONCILE_STEPS)]
    assert ordered == [module_of(step) for step in RECONCILE_STEPS]


def package_table() -> dict[str, set[str]]:
    """Package -> what it may import (``api`` or ``api.objects``), from docs/architecture.md."""
    text = (REPO / "docs/architecture.md").read_text()
    section = text.split("## Packages", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `pkobatch.")]
    table = {}
    for row in rows:
        package, _, allowed = row.strip("| ").split(" | ")
        name = re.fullmatch(r"`pkobatch\.(\w+)`", package)
        assert name is not None, f"{package!r} is not one package"
        table[name[1]] = set(re.findall(r"`([\w.]+)`", allowed))
    return table


def imports_of(package: str) -> set[str]:
    """The pkobatch modules ``package`` imports (any depth, in functions too), without the
    ``pkobatch.`` prefix; its own modules left out."""
    root = REPO / "pkobatch"
    files = [root / f"{package}.py"] if (root / f"{package}.py").is_file() else []
    files += sorted((root / package).rglob("*.py")) if (root / package).is_dir() else []
    found: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.startswith("pkobatch.") and name.split(".")[1] != package:
                    found.add(name.removeprefix("pkobatch."))
    return found


def test_the_package_table_names_every_package() -> None:
    root = REPO / "pkobatch"
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    packages |= {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    assert set(package_table()) == packages


def test_every_package_imports_only_what_the_table_allows() -> None:
    for package, allowed in package_table().items():
        for module in imports_of(package):
            assert any(module == a or module.startswith(f"{a}.") for a in allowed), (
                f"pkobatch.{package} imports pkobatch.{module}, which docs/architecture.md's "
                f"package table does not allow it ({sorted(allowed) or 'nothing'})"
            )
