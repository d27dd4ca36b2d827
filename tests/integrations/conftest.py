"""Fixtures of the framework integrations' tests (the shared ones are in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def processor(store):
    """tracedb's processor as the Agents SDK's only one: nothing is exported to OpenAI."""
    from tests.integrations.weather_agent import processing

    with processing(store) as p:
        yield p
