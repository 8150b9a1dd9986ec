"""Shared test configuration: Hypothesis profiles (bounded, no deadline on shared machines),
and no log ids carried from one test to the next."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tradecore.log_fields import LogFields, start_log_fields

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def no_bound_ids() -> Iterator[None]:
    """Nothing bound before or after a test: synchronous tests share the main context, and
    ids left bound there would reach the orders later tests queue."""
    start_log_fields(LogFields())
    yield
    start_log_fields(LogFields())
