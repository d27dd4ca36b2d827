"""Fixtures of the framework integrations' tests (the shared ones are in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def processor(store):
    """tracedb's processor as the Agents SDK's only one: nothing is exported to OpenAI."""
    from agents import set_trace_processors

    from tracedb.integrations.agents import TraceDBProcessor

    p = TraceDBProcessor(store)
    set_trace_processors([p])
    try:
        yield p
    finally:
        set_trace_processors([])
        p.shutdown()
