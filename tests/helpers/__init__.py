"""Helpers the test tiers share (fixtures live in tests/fixture_plugins)."""
