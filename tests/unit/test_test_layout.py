"""The test tree itself: pytest's default import mode needs unique test module names."""

import re
from collections import Counter
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_names_are_unique_across_tiers() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    duplicates = sorted(name for name, count in names.items() if count > 1)
    assert duplicates == [], f"rename these so unit/integration/e2e do not collide: {duplicates}"


def test_tier_markers_come_from_the_folder() -> None:
    """tests/conftest.py marks every test with its folder's tier; a module marking itself could
    contradict its folder."""
    tier_mark = re.compile(r"pytest\.mark\.(unit|integration|node|e2e)\b")
    marked = sorted(
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("test_*.py")
        if tier_mark.search(path.read_text())
    )
    assert marked == [], f"drop the tier marker of these modules (their folder sets it): {marked}"


def test_a_test_carries_the_marker_of_its_folder(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("integration") is None
    assert request.node.get_closest_marker("node") is None
    assert request.node.get_closest_marker("e2e") is None


def test_unit_tests_of_controller_modules_carry_the_controller_prefix() -> None:
    """One prefix scheme: the unit tests of ``pkobatch/controller/<module>.py`` (and of its
    ``steps/``) are ``test_controller_<module>*.py``, as the runner's are ``test_runner_*``."""
    controller = TESTS.parent / "pkobatch" / "controller"
    modules = {p.stem for p in controller.rglob("*.py") if not p.stem.startswith("_")} | {"steps"}
    unprefixed = sorted(
        path.name
        for path in (TESTS / "unit").glob("test_*.py")
        if any(re.fullmatch(rf"test_{m}(_\w+)?", path.stem) for m in modules)
        and not path.stem.startswith("test_controller_")
    )
    assert unprefixed == [], f"name these test_controller_<module>...: {unprefixed}"


def test_shared_test_helpers_live_in_the_helpers_package() -> None:
    """Code the tiers share is in ``tests/helpers`` (plain modules) or ``tests/fixture_plugins``
    (pytest plugins), so that ``tests/`` itself holds only the tiers and conftest.py."""
    loose = sorted(path.name for path in TESTS.glob("*.py") if path.name != "conftest.py")
    assert loose == [], f"move these into tests/helpers/ (or fixture_plugins/): {loose}"
