"""Where the real components built by ``scripts/tools.sh`` live.

The script builds each component into ``$PKOBATCH_TOOLS_DIR/<name>-<version>/`` (default
``~/.cache/pkobatch/tools``) and touches ``.stamp`` there when the build is complete; the
versions are pinned in ``pkobatch/dev/versions.env``, which ships inside the package so that
the code and the script always agree on them.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final, Literal

Component = Literal[
    "etcd",
    "kubernetes",
    "pulumi",
    "yaml",
    "kubernetes_provider",
    "helm",
    "promtool",
    "prometheus_operator",
    "source_controller",
    "argocd_health",
    "kstatus",
    "registry",
    "node",
    "containerd",
    "cni_plugins",
    "crictl",
    "pulumi_old",
    "pulumi_mid",
]
COMPONENTS: Final[tuple[Component, ...]] = (
    "etcd",
    "kubernetes",
    "pulumi",
    "yaml",
    "kubernetes_provider",
)
PULUMI_PLUGINS: Final[tuple[Component, ...]] = ("yaml", "kubernetes_provider")
"""Plugins the Pulumi CLI finds on ``PATH`` (a language host, a resource provider)."""
ECOSYSTEM_TOOLS: Final[tuple[Component, ...]] = (
    "helm",
    "promtool",
    "prometheus_operator",
    "source_controller",
    "argocd_health",
    "kstatus",
    "registry",
)
"""Tools only some tests need (``deploy/``; Flux's source-controller for ``spec.fluxSource``;
Argo CD's health check and kstatus for GitOps health; an OCI registry for the chart pushed
and installed as an OCI artefact); ``scripts/test.sh`` builds them, the demo does not."""
NODE_TOOLS: Final[tuple[Component, ...]] = ("node", "containerd", "cni_plugins", "crictl")
"""The real node's components (``pkobatch.dev.node``; runc comes from the host):
``scripts/test.sh`` builds them, the demo does not."""
VERSION_CHECK_TOOLS: Final[tuple[Component, ...]] = ("pulumi_old", "pulumi_mid")
"""Older Pulumi CLIs the tests put first on a run's ``PATH``: one older than ``config set-all
--json`` (the ``PulumiVersionTooLow`` check) and one between that flag and ``pulumi``'s
version (config on an older CLI that has it): ``scripts/test.sh`` builds them, the demo
does not."""
_VERSION_KEYS: Final[dict[Component, str]] = {
    "etcd": "ETCD_VERSION",
    "kubernetes": "KUBERNETES_VERSION",
    "pulumi": "PULUMI_VERSION",
    "yaml": "PULUMI_YAML_VERSION",
    "kubernetes_provider": "KUBERNETES_PROVIDER_MODULE_VERSION",
    "helm": "HELM_VERSION",
    "promtool": "PROMETHEUS_MODULE_VERSION",
    "prometheus_operator": "PROMETHEUS_OPERATOR_VERSION",
    "source_controller": "SOURCE_CONTROLLER_VERSION",
    "argocd_health": "ARGOCD_VERSION",
    "kstatus": "CLI_UTILS_VERSION",
    "registry": "DISTRIBUTION_VERSION",
    "node": "KUBERNETES_VERSION",
    "containerd": "CONTAINERD_VERSION",
    "cni_plugins": "CNI_PLUGINS_VERSION",
    "crictl": "CRI_TOOLS_VERSION",
    "pulumi_old": "PULUMI_OLD_VERSION",
    "pulumi_mid": "PULUMI_MID_VERSION",
}
_BINARIES: Final[dict[Component, tuple[str, ...]]] = {
    "etcd": ("etcd",),
    "kubernetes": ("kube-apiserver", "kube-controller-manager"),
    "pulumi": ("pulumi", "pulumi-resource-pulumi-python"),
    "yaml": ("pulumi-language-yaml",),
    "kubernetes_provider": ("pulumi-resource-kubernetes",),
    "helm": ("helm",),
    "promtool": ("promtool",),
    # Not a binary: the directory holds the operator's CRDs (crds/*.yaml).
    "prometheus_operator": (),
    # Flux's source-controller; its CRDs are in crd/ next to it.
    "source_controller": ("source-controller",),
    # Argo CD's health checks are Lua files, not programs (see ARGOCD_STACK_HEALTH).
    "argocd_health": (),
    "kstatus": ("kstatus",),
    # The CNCF distribution registry, serving the OCI artefacts `helm push` stores.
    "registry": ("registry",),
    # The real node (pkobatch.dev.node): pause is the pod sandbox's process; kubectl goes
    # into the tests' images.
    "node": ("kubelet", "kube-proxy", "kube-scheduler", "kubectl", "pause"),
    "containerd": ("containerd", "containerd-shim-runc-v2", "ctr"),
    "cni_plugins": ("bridge", "host-local", "loopback", "portmap"),
    "crictl": ("crictl",),
    # A Pulumi CLI older than `config set-all --json`, for the PulumiVersionTooLow tests.
    "pulumi_old": ("pulumi",),
    # The first CLI the module proxy serves with `config set-all --json`.
    "pulumi_mid": ("pulumi",),
}
ARGOCD_STACK_HEALTH: Final = Path("pulumi.com", "Stack", "health.lua")
"""Argo CD's built-in health check for Stacks, inside the ``argocd_health`` directory."""


class ToolsMissing(Exception):
    """A component has not been built (yet); the message says how to build it."""


def versions() -> dict[str, str]:
    """The pinned versions from ``versions.env`` (KEY=value lines)."""
    text = resources.files("pkobatch.dev").joinpath("versions.env").read_text(encoding="utf-8")
    pinned: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            pinned[key.strip()] = value.strip().strip("\"'")
    return pinned


def tools_root() -> Path:
    override = os.environ.get("PKOBATCH_TOOLS_DIR")
    return Path(override) if override else Path.home() / ".cache" / "pkobatch" / "tools"


def tools_script() -> Path | None:
    """``scripts/tools.sh`` of the source checkout this package runs from, if any."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "tools.sh"
    return script if script.is_file() else None


@dataclass(frozen=True)
class Tools:
    """Bin directories of the built components (only the ones that were asked for)."""

    etcd: Path | None = None
    kubernetes: Path | None = None
    pulumi: Path | None = None
    yaml: Path | None = None
    kubernetes_provider: Path | None = None
    helm: Path | None = None
    promtool: Path | None = None
    prometheus_operator: Path | None = None
    source_controller: Path | None = None
    argocd_health: Path | None = None
    kstatus: Path | None = None
    registry: Path | None = None
    node: Path | None = None
    containerd: Path | None = None
    cni_plugins: Path | None = None
    crictl: Path | None = None
    pulumi_old: Path | None = None
    pulumi_mid: Path | None = None

    def bin_dir(self, component: Component) -> Path:
        found: Path | None = getattr(self, component)
        if found is None:
            raise ToolsMissing(f"{component} was not located")
        return found

    def binary(self, component: Component, name: str) -> str:
        return str(self.bin_dir(component) / name)

    def pulumi_path(self) -> list[str]:
        """``PATH`` entries for a Pulumi run: the CLI and the plugins that were located."""
        located = (getattr(self, c) for c in ("pulumi", *PULUMI_PLUGINS))
        return [str(directory) for directory in located if directory is not None]


def component_dir(component: Component) -> Path:
    version = versions()[_VERSION_KEYS[component]]
    return tools_root() / f"{component}-{version}"


def missing_components(components: tuple[Component, ...] = COMPONENTS) -> list[Component]:
    return [c for c in components if not (component_dir(c) / ".stamp").is_file()]


def available_tools(components: tuple[Component, ...] = COMPONENTS) -> Tools:
    """The components among ``components`` that are built (no error for the others)."""
    found: dict[str, Path] = {}
    for component in components:
        with contextlib.suppress(ToolsMissing):
            found[component] = find_tools((component,)).bin_dir(component)
    return Tools(**found)


def find_tools(components: tuple[Component, ...] = COMPONENTS) -> Tools:
    """Locate the built components; ``ToolsMissing`` names what to run when one is absent."""
    found: dict[str, Path] = {}
    problems: list[str] = []
    for component in components:
        directory = component_dir(component)
        if not (directory / ".stamp").is_file():
            problems.append(f"{component}: {directory} is not built")
            continue
        absent = [b for b in _BINARIES[component] if not os.access(directory / b, os.X_OK)]
        if absent:
            problems.append(f"{component}: {directory} lacks {', '.join(absent)}")
            continue
        found[component] = directory
    if problems:
        script = tools_script()
        how = f"run {script}" if script else "run scripts/tools.sh from a pkobatch checkout"
        names = " ".join(c for c in components if c not in found)
        raise ToolsMissing(
            "real test components are missing:\n  "
            + "\n  ".join(problems)
            + f"\nBuild them with: {how} {names} (set PKOBATCH_TOOLS_DIR to use another cache)"
        )
    return Tools(**found)
