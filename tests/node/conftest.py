"""Fixtures of the real node's tier (``node_cluster``: tests/fixture_plugins/cluster.py;
its images: tests/fixture_plugins/node_images.py).

``wait_pod(namespace, name, done, timeout=300)`` -> the pod on ``node_cluster`` once
``done(pod)`` is true.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fixture_plugins.cluster import Cluster

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import PODS, Kube

JSON = dict[str, Any]


@pytest.fixture
def wait_pod(node_cluster: Cluster) -> Callable[..., JSON]:
    kube: Kube = node_cluster.kube

    def wait(namespace: str, name: str, done: Callable[[JSON], bool], timeout: float = 300) -> JSON:
        found: list[JSON] = []

        def check() -> bool:
            pod = kube.get(PODS, name, namespace)
            found[:] = [pod]
            return done(pod)

        wait_until(check, timeout=timeout, what=f"pod {namespace}/{name}")
        return found[0]

    return wait
