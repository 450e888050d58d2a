"""The root of the test tree: which fixtures exist and where, and the tier of each test.

Tiers (docs/development.md) are folders: every test under ``tests/unit``,
``tests/integration``, ``tests/node`` or ``tests/e2e`` carries the marker of that name, so
``-m`` selects a tier as the folder does (``pytest -m "not e2e"``). A test module never sets
one itself.

Fixtures shared by every tier, one pytest plugin per concern (each module's docstring lists
its fixtures and what they give; ``pytest --fixtures`` shows where each is defined):

``fixture_plugins/cluster.py``  ``cluster``, ``fresh_cluster``, ``kube``, ``namespace``,
                                ``flux_crds``, ``flux_source_controller``: the real local
                                control plane and node agent (pkobatch.dev.environment);
                                ``node_cluster``, ``node_namespace``: the same with the
                                real node
``fixture_plugins/git.py``      ``git_server``, ``git_repo``, ``program_dir``, ``github_app``
                                and the test programs of ``tests/fixtures/programs``
``fixture_plugins/pulumi.py``   ``pulumi_env``: the offline Pulumi environment
``fixture_plugins/receivers.py`` ``receivers_on_loopback``, ``hanging``: webhook receivers for
                                notification tests
``fixture_plugins/images.py``   ``built_images``, ``image_containers``: pkobatch's images built
                                on stand-in bases (pkobatch.dev.images), or fail (CI) / skip
                                (locally) saying how to install the builder
``fixture_plugins/tools.py``    ``pulumi_bin``, ``yaml_host``, ``kubernetes_provider``,
                                ``all_tools``, ``health_tools``, ``helm_bin``, ``promtool_bin``,
                                ``prometheus_operator_crds``, ``registry_bin``: built
                                binaries, or fail (CI) / skip (locally) saying how to
                                build them
``helpers/sentinels.py``        ``sentinel_session`` (autouse): the secret-leak scan

Tier fixtures: ``tests/integration/conftest.py`` (Jobs), ``tests/node/conftest.py`` (pods
on the real node), ``tests/e2e/conftest.py`` (the Automation API, the runner bundle, the
real controller of tests/helpers/controller_harness.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = [
    "helpers.sentinels",
    "fixture_plugins.tools",
    "fixture_plugins.cluster",
    # Before node_images, which imports it.
    "fixture_plugins.images",
    "fixture_plugins.node_images",
    "fixture_plugins.git",
    "fixture_plugins.pulumi",
    "fixture_plugins.receivers",
]

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "node", "e2e")


def pytest_itemcollected(item: pytest.Item) -> None:
    tier = item.path.relative_to(TESTS).parts[0]
    if tier in TIERS:
        item.add_marker(tier)
