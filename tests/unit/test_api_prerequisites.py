"""pkobatch.api.prerequisites: the names a Stack waits for, and cycles among them."""

from __future__ import annotations

import itertools

from pkobatch.api.prerequisites import prerequisite_cycle, prerequisite_names


def test_names_keep_spec_order_and_skip_malformed_entries() -> None:
    spec = {"prerequisites": [{"name": "b"}, {"name": ""}, "c", {"other": 1}, {"name": "a"}]}
    assert prerequisite_names(spec) == ["b", "a"]
    assert prerequisite_names({}) == []


def test_a_stack_needing_itself_is_a_cycle() -> None:
    assert prerequisite_cycle("a", {"a": ["a"]}) == ["a", "a"]


def test_a_two_cycle_is_named_from_the_start() -> None:
    graph = {"a": ["b"], "b": ["a"]}
    assert prerequisite_cycle("a", graph) == ["a", "b", "a"]
    assert prerequisite_cycle("b", graph) == ["b", "a", "b"]


def test_a_three_cycle_is_named_in_order() -> None:
    graph = {"a": ["b"], "b": ["c"], "c": ["a"]}
    assert prerequisite_cycle("b", graph) == ["b", "c", "a", "b"]


def test_a_diamond_is_no_cycle() -> None:
    graph = {"top": ["left", "right"], "left": ["bottom"], "right": ["bottom"], "bottom": []}
    assert prerequisite_cycle("top", graph) == []


def test_a_cycle_further_down_is_found_from_a_stack_waiting_on_it() -> None:
    graph = {"app": ["db"], "db": ["net"], "net": ["dns"], "dns": ["net"]}
    assert prerequisite_cycle("app", graph) == ["net", "dns", "net"]


def test_prerequisites_the_graph_lacks_close_no_cycle() -> None:
    # "b" is missing or in another shard: its prerequisites are unknown.
    assert prerequisite_cycle("a", {"a": ["b"]}) == []
    assert prerequisite_cycle("a", {"a": ["b", "c"], "c": []}) == []


def test_a_long_chain_is_walked_without_recursion() -> None:
    names = [f"s{i}" for i in range(20_000)]
    graph = {name: [after] for name, after in itertools.pairwise(names)}
    assert prerequisite_cycle("s0", graph) == []
    graph[names[-1]] = ["s0"]
    cycle = prerequisite_cycle("s0", graph)
    assert cycle[0] == cycle[-1] == "s0" and len(cycle) == 20_001
