"""The real node's link network is the first 10.243.<n>.0/30 that no host route overlaps —
another environment's link included — and a host whose routes cover the range gets a clear
error."""

from __future__ import annotations

import ipaddress

import pytest

from pkobatch.dev import node_network
from pkobatch.dev.node_network import NodeNetworkError


def routes(monkeypatch: pytest.MonkeyPatch, *networks: str) -> None:
    found = [ipaddress.IPv4Network(n) for n in networks]
    monkeypatch.setattr(node_network, "_host_routes", lambda: found)


def test_the_first_link_no_route_overlaps(monkeypatch: pytest.MonkeyPatch) -> None:
    routes(monkeypatch, "192.0.2.0/24", "127.0.0.0/8")
    assert str(node_network._free_link()) == "10.243.0.0/30"
    # Another environment's link, and a host network over the next block.
    routes(monkeypatch, "10.243.0.0/30", "10.243.1.0/24", "10.243.2.1/32")
    assert str(node_network._free_link()) == "10.243.3.0/30"


def test_a_host_route_over_the_whole_range_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    routes(monkeypatch, "10.0.0.0/8")
    with pytest.raises(NodeNetworkError, match=r"10\.243\.0\.0/16 overlaps a host route"):
        node_network._free_link()
