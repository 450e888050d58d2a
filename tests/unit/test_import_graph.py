"""No import cycle anywhere in pkobatch (import-linter has no contract type for that).

The graph is grimp's (the library import-linter is built on): every ``import`` statement,
including those under ``if TYPE_CHECKING:`` and inside functions, so a cycle cannot hide
behind a type-checking or lazy import.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

import grimp


def cycles(imports: Mapping[str, Set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            target = next((t for t in targets if t in imports), None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(imports[target]))))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_cycle_and_only_cycles() -> None:
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d", "e"}}
    assert cycles(imports) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_pkobatch_has_no_import_cycle() -> None:
    graph = grimp.build_graph("pkobatch")
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    found = cycles(imports)
    assert not found, "import cycles (break each; a TYPE_CHECKING import counts too): " + (
        "; ".join(" <-> ".join(component) for component in found)
    )
