"""``spec.prerequisites`` as a graph: the names a Stack waits for, and cycles among them.

A Stack runs only after its prerequisites succeeded, so Stacks whose prerequisites lead
back to one of them (``a`` needs ``b``, ``b`` needs ``a``; or a Stack that needs itself)
would wait for each other forever. The controller looks for such a cycle through the
Stacks it holds (``prerequisite_cycle``) and stalls the Stacks that wait on one, naming it
(docs/operations.md). A prerequisite it does not hold (missing, or in another shard) has
no known prerequisites of its own, so it closes no cycle.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

_ON_PATH = 1
_DONE = 2


def prerequisite_names(spec: Mapping[str, Any]) -> list[str]:
    """The names in a raw spec's ``prerequisites``, in order (malformed entries skipped)."""
    return [
        str(item["name"])
        for item in spec.get("prerequisites") or ()
        if isinstance(item, Mapping) and item.get("name")
    ]


def prerequisite_cycle(start: str, graph: Mapping[str, Sequence[str]]) -> list[str]:
    """The first cycle met following prerequisites from ``start`` (depth first, in spec
    order), as the names along it with the first repeated at the end (``["a", "b", "a"]``);
    [] when none is reachable. ``graph`` maps a Stack's name to its prerequisites' names;
    a name missing from it has none."""
    state = {start: _ON_PATH}
    path = [start]
    pending: list[Iterator[str]] = [iter(graph.get(start, ()))]
    while pending:
        name = next(pending[-1], None)
        if name is None:
            state[path.pop()] = _DONE
            pending.pop()
        elif state.get(name) == _ON_PATH:
            return [*path[path.index(name) :], name]
        elif name not in state:
            state[name] = _ON_PATH
            path.append(name)
            pending.append(iter(graph.get(name, ())))
    return []
