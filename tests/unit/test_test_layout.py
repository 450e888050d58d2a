"""The test tree itself: pytest's default import mode needs unique test module names."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_names_are_unique_across_tiers() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    duplicates = sorted(name for name, count in names.items() if count > 1)
    assert duplicates == [], f"rename these so unit/integration/e2e do not collide: {duplicates}"
