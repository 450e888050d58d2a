"""The offline Pulumi environment of docs/development.md, per test.

Function scope
--------------
``pulumi_env`` ``PulumiEnv``: per-test PULUMI_HOME and ``file://`` backend, the offline
               environment of docs/development.md (``.env`` dict, ``.backend_url``,
               ``.passphrase``, ``.home``, ``.files_dir`` = where the programs write files).

"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.sentinels import register

from pkobatch.dev.tools import PULUMI_PLUGINS, available_tools


@dataclass
class PulumiEnv:
    env: dict[str, str]
    home: Path
    backend_url: str
    passphrase: str
    files_dir: Path


@pytest.fixture
def pulumi_env(pulumi_bin: Path, tmp_path: Path) -> PulumiEnv:
    home = tmp_path / "pulumi-home"
    backend = tmp_path / "pulumi-backend"
    files = tmp_path / "managed-files"
    for directory in (home, backend, files):
        directory.mkdir()
    passphrase = register(secrets.token_urlsafe(16), "pulumi-passphrase")
    # The CLI first, then the plugins that are built (a test needing one requires it).
    plugins = available_tools(PULUMI_PLUGINS).pulumi_path()
    path = os.pathsep.join(
        [str(pulumi_bin), *plugins, str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    )
    env = {
        "PATH": path,
        "PULUMI_HOME": str(home),
        "PULUMI_BACKEND_URL": backend.as_uri(),
        "PULUMI_CONFIG_PASSPHRASE": passphrase,
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_PYTHON_CMD": sys.executable,
    }
    return PulumiEnv(env, home, backend.as_uri(), passphrase, files)
