"""Locating the components scripts/tools.sh builds: every component has a pinned version and a
build function, and a Pulumi run's PATH holds the CLI and the plugins that are built."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pkobatch.api.quantity import parse_quantity
from pkobatch.dev.tools import (
    COMPONENTS,
    ECOSYSTEM_TOOLS,
    NODE_TOOLS,
    PULUMI_PLUGINS,
    VERSION_CHECK_TOOLS,
    Component,
    ToolsMissing,
    available_tools,
    component_dir,
    find_tools,
    versions,
)
from pkobatch.runner.stack_config import JSON_CONFIG_MIN_VERSION

TOOLS_SH = Path(__file__).resolve().parents[2] / "scripts" / "tools.sh"
TEST_SH = TOOLS_SH.with_name("test.sh")


def _build(component: Component, *binaries: str) -> Path:
    """A stamped build of ``component`` in the (monkeypatched) tools root."""
    directory = component_dir(component)
    directory.mkdir(parents=True)
    for name in binaries:
        (directory / name).write_text("#!/bin/sh\n")
        (directory / name).chmod(0o755)
    (directory / ".stamp").touch()
    return directory


def test_every_component_has_a_build_function_and_a_pinned_version() -> None:
    script = TOOLS_SH.read_text()
    built = set(re.findall(r"^build_(\w+)\(\) \{", script, re.MULTILINE))
    assert built == {*COMPONENTS, *ECOSYSTEM_TOOLS, *NODE_TOOLS, *VERSION_CHECK_TOOLS}
    default = re.search(r"^want=\$\{\*:-(.*)\}$", script, re.MULTILINE)
    assert default is not None and default.group(1).split() == list(COMPONENTS)
    # The test command builds every component, each in exactly one of its stages; the default
    # (bootstrap, demo) builds only the control plane and Pulumi.
    stages = re.search(r"^stages=\(\n(.*?)^\)$", TEST_SH.read_text(), re.MULTILINE | re.DOTALL)
    assert stages is not None
    staged = [name for line in stages.group(1).splitlines() for name in line.strip('" ').split()]
    assert sorted(staged) == sorted(
        {*COMPONENTS, *ECOSYSTEM_TOOLS, *NODE_TOOLS, *VERSION_CHECK_TOOLS}
    )
    pinned = versions()
    for key in (
        "PULUMI_YAML_VERSION",
        "KUBERNETES_PROVIDER_MODULE_VERSION",
        "HELM_VERSION",
        "PROMETHEUS_MODULE_VERSION",
        "PROMETHEUS_OPERATOR_VERSION",
        "ARGOCD_VERSION",
        "CLI_UTILS_VERSION",
        "DISTRIBUTION_VERSION",
        "CONTAINERD_VERSION",
        "CNI_PLUGINS_VERSION",
        "CRI_TOOLS_VERSION",
    ):
        assert f"${key}" in script and pinned[key].startswith("v")
    # The old CLI is older than `config set-all --json`, the middle one between that and the
    # main one (Pulumi's versions carry no "v" here).
    old, minimum, middle, current = (
        tuple(int(part) for part in version.split("."))
        for version in (
            pinned["PULUMI_OLD_VERSION"],
            JSON_CONFIG_MIN_VERSION,
            pinned["PULUMI_MID_VERSION"],
            pinned["PULUMI_VERSION"],
        )
    )
    assert "$PULUMI_OLD_VERSION" in script and "$PULUMI_MID_VERSION" in script
    assert old < minimum <= middle < current


def test_pulumi_path_lists_the_cli_and_the_built_plugins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PKOBATCH_TOOLS_DIR", str(tmp_path))
    pulumi = _build("pulumi", "pulumi", "pulumi-resource-pulumi-python")
    yaml_host = _build("yaml", "pulumi-language-yaml")

    tools = available_tools()
    assert tools.etcd is None and tools.kubernetes_provider is None
    assert tools.pulumi_path() == [str(pulumi), str(yaml_host)]
    assert set(PULUMI_PLUGINS) == {"yaml", "kubernetes_provider"}

    with pytest.raises(ToolsMissing) as missing:
        find_tools(("pulumi", "kubernetes_provider"))
    assert "scripts/tools.sh kubernetes_provider" in str(missing.value)


def test_a_component_without_its_binary_is_not_available(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PKOBATCH_TOOLS_DIR", str(tmp_path))
    _build("kubernetes_provider")  # stamped, but the binary is missing
    assert available_tools().kubernetes_provider is None
    with pytest.raises(ToolsMissing, match="lacks pulumi-resource-kubernetes"):
        find_tools(("kubernetes_provider",))


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        ("64Mi", 64 * 2**20),
        ("1Gi", 2**30),
        ("1.5Gi", 3 * 2**29),
        ("500M", 500 * 10**6),
        ("128974848", 128974848),
        ("129e6", 129 * 10**6),
        ("0.1Ki", 103),
    ],
)
def test_memory_limits_are_read_as_the_kubelet_reads_them(quantity: str, expected: int) -> None:
    assert parse_quantity(quantity) == expected


@pytest.mark.parametrize("quantity", ["", "64MB", "Mi", "-1Mi", "1.2.3Gi"])
def test_an_unreadable_memory_limit_is_refused(quantity: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(quantity)
