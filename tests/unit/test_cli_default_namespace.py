"""The default namespace, picked as kubectl picks it."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from pkobatch.cli.default_namespace import default_namespace, kubeconfig_paths


def write(path: Path, current: str, contexts: dict[str, str | None]) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "contexts": [
            {"name": name, "context": {"cluster": "c", "user": "u", "namespace": namespace}}
            for name, namespace in contexts.items()
        ],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_current_context_namespace(tmp_path: Path) -> None:
    config = write(tmp_path / "config", "a", {"a": "team-a", "b": "team-b"})

    assert default_namespace(str(config), None, {}) == "team-a"
    assert default_namespace(str(config), "b", {}) == "team-b"


def test_default_when_the_context_names_no_namespace(tmp_path: Path) -> None:
    config = write(tmp_path / "config", "a", {"a": None})

    assert default_namespace(str(config), None, {}) == "default"
    assert default_namespace(str(config), "missing", {}) == "default"


def test_kubeconfig_list_merges_first_wins(tmp_path: Path) -> None:
    first = write(tmp_path / "one", "b", {"a": "from-one"})
    second = write(tmp_path / "two", "a", {"b": "from-two", "a": "from-two"})
    env = {"KUBECONFIG": os.pathsep.join([str(first), str(tmp_path / "absent"), str(second)])}

    assert default_namespace(None, None, env) == "from-two"
    assert default_namespace(None, "a", env) == "from-one"


def test_paths(tmp_path: Path) -> None:
    assert kubeconfig_paths("~/x", {"KUBECONFIG": "/y"}) == [Path("~/x").expanduser()]
    assert kubeconfig_paths(None, {}) == [Path("~/.kube/config").expanduser()]


def test_unreadable_kubeconfig_falls_back_to_default(tmp_path: Path) -> None:
    broken = tmp_path / "config"
    broken.write_text(": not yaml : [")

    assert default_namespace(str(broken), None, {}) == "default"
