"""The bundle's entry point gives the programs the runner starts the image's own
``LD_LIBRARY_PATH``, never the one its launcher set for the bundle's C library."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ENTRY = Path(__file__).resolve().parents[2] / "jobs" / "runner_bundle_entry.py"
BUNDLE_LIBRARIES = "/pkobatch/runner/lib:/pkobatch/runner/app/_internal"


@pytest.fixture(scope="module")
def entry() -> ModuleType:
    spec = importlib.util.spec_from_file_location("runner_bundle_entry", ENTRY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_images_value_comes_back(entry: ModuleType) -> None:
    environ = {
        "LD_LIBRARY_PATH": f"/pkobatch/runner/app/_internal:{BUNDLE_LIBRARIES}",
        "LD_LIBRARY_PATH_ORIG": BUNDLE_LIBRARIES,
        "PKOBATCH_IMAGE_LD_LIBRARY_PATH": "/opt/vendor/lib",
        "PATH": "/usr/bin",
    }
    entry.restore_image_library_path(environ)
    assert environ == {"LD_LIBRARY_PATH": "/opt/vendor/lib", "PATH": "/usr/bin"}


def test_an_image_without_one_gets_none(entry: ModuleType) -> None:
    environ = {
        "LD_LIBRARY_PATH": f"/pkobatch/runner/app/_internal:{BUNDLE_LIBRARIES}",
        "LD_LIBRARY_PATH_ORIG": BUNDLE_LIBRARIES,
        "PKOBATCH_IMAGE_LD_LIBRARY_PATH": "",
    }
    entry.restore_image_library_path(environ)
    assert environ == {}


def test_without_the_launcher_nothing_changes(entry: ModuleType) -> None:
    environ = {"LD_LIBRARY_PATH": "/usr/local/lib"}
    entry.restore_image_library_path(environ)
    assert environ == {"LD_LIBRARY_PATH": "/usr/local/lib"}
