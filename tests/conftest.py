"""Shared pytest configuration: hypothesis profiles and the --runslow switch."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# Deadlines are meaningless on a loaded CI machine (the first zstd context of a
# thread takes milliseconds to build); shrinking still works without them.
settings.register_profile(
    "default", deadline=None, max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "ci", parent=settings.get_profile("default"), derandomize=True, print_blob=True)
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
