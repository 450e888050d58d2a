"""Built real components (``scripts/tools.sh``): locating them and their fixtures.

Missing binaries: with ``CI=true`` a test needing them fails; locally it is skipped with
the command that builds them.

Session scope
-------------
``pulumi_bin`` -> Path: the bin dir of the built Pulumi CLI. ``yaml_host`` and
``kubernetes_provider`` -> Path: the bin dirs of ``pulumi-language-yaml`` and
``pulumi-resource-kubernetes`` (requiring them; both are on ``pulumi_env``'s PATH when built).

``pulumi_old_bin`` -> Path: the bin dir of an older Pulumi CLI (``PULUMI_OLD_VERSION``, before
``config set-all --json``); ``cluster.pulumi_old_image`` pods get it first on PATH.
``pulumi_mid_bin`` -> Path: the same of the CLI between that flag and ``pulumi``
(``PULUMI_MID_VERSION``); ``cluster.pulumi_mid_image`` pods get it first on PATH.

``health_tools`` -> ``Tools``: Argo CD's health check for Stacks and the kstatus program.

``all_tools`` -> ``Tools``: etcd, Kubernetes and Pulumi, all built (for tests that start their
own environment with ``pkobatch dev``).

``helm_bin`` -> Path: the built ``helm``; ``promtool_bin`` -> Path: the built ``promtool``;
``prometheus_operator_crds`` -> Path: the directory of the Prometheus Operator's CRD files;
``registry_bin`` -> Path: the built OCI registry (distribution's ``registry``)
(``scripts/tools.sh helm promtool prometheus_operator registry``).

Tests that need a tool ``scripts/test.sh`` builds late (after the Pulumi CLI and the YAML
host: the Kubernetes provider, the older CLIs, Argo CD's health check, the OCI registry) carry
the marker ``late_tools``, from the fixtures they use: on a cold machine the script runs the
e2e tests without it while it builds those tools, and the ones with it after.

``runner_bundle`` -> Path: the injected runner bundle directory (its launcher is
``pkobatch-runner`` in it) of the current sources, built by ``jobs/build-runner-bundle.sh``
here rather than in scripts/bootstrap.sh, so that a bare ``pytest`` run after an edit tests a
bundle of the edited sources (the script's cache key is a hash of the sources and pins: a
warm run only hashes, a cold one takes a few minutes).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pkobatch.dev.images import ImageBuildFailed, build_runner_bundle
from pkobatch.dev.tools import Component, Tools, ToolsMissing, find_tools

LATE_TOOL_FIXTURES = frozenset(
    {"kubernetes_provider", "pulumi_old_bin", "pulumi_mid_bin", "health_tools", "registry_bin"}
)
"""The fixtures of the components of ``scripts/test.sh``'s stages 3 and 4."""


def pytest_itemcollected(item: pytest.Item) -> None:
    if LATE_TOOL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        item.add_marker("late_tools")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_tools(components: tuple[Component, ...]) -> Tools:
    """The built components, or fail (CI) / skip (locally) saying how to build them."""
    try:
        return find_tools(components)
    except ToolsMissing as exc:
        if in_ci():
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def pulumi_bin() -> Path:
    return require_tools(("pulumi",)).bin_dir("pulumi")


@pytest.fixture(scope="session")
def pulumi_old_bin() -> Path:
    return require_tools(("pulumi_old",)).bin_dir("pulumi_old")


@pytest.fixture(scope="session")
def pulumi_mid_bin() -> Path:
    return require_tools(("pulumi_mid",)).bin_dir("pulumi_mid")


@pytest.fixture(scope="session")
def yaml_host(pulumi_bin: Path) -> Path:
    """The bin dir of ``pulumi-language-yaml`` (``pulumi_env`` puts it on PATH)."""
    return require_tools(("yaml",)).bin_dir("yaml")


@pytest.fixture(scope="session")
def kubernetes_provider(yaml_host: Path) -> Path:
    """The bin dir of ``pulumi-resource-kubernetes`` (an ambient plugin on ``pulumi_env``'s
    and the node agent's PATH); the test programs using it are YAML and Python."""
    return require_tools(("kubernetes_provider",)).bin_dir("kubernetes_provider")


@pytest.fixture(scope="session")
def health_tools() -> Tools:
    """Argo CD's health check for Stacks and the kstatus program
    (tests/helpers/health_checks.py)."""
    return require_tools(("argocd_health", "kstatus"))


@pytest.fixture(scope="session")
def all_tools() -> Tools:
    """Every built component, for tests that start their own environment (``pkobatch dev``)."""
    return require_tools(("etcd", "kubernetes", "pulumi"))


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    return Path(require_tools(("helm",)).binary("helm", "helm"))


@pytest.fixture(scope="session")
def promtool_bin() -> Path:
    return Path(require_tools(("promtool",)).binary("promtool", "promtool"))


@pytest.fixture(scope="session")
def registry_bin() -> Path:
    return Path(require_tools(("registry",)).binary("registry", "registry"))


@pytest.fixture(scope="session")
def prometheus_operator_crds() -> Path:
    return require_tools(("prometheus_operator",)).bin_dir("prometheus_operator") / "crds"


@pytest.fixture(scope="session")
def runner_bundle() -> Path:
    try:
        return build_runner_bundle(sys.executable)
    except ImageBuildFailed as error:
        pytest.fail(str(error), pytrace=False)
