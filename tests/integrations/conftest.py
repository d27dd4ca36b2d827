"""Fixtures for the integration tests: the fake OpenAI and Anthropic servers on 127.0.0.1 and a
real store."""

from __future__ import annotations

import pytest

import tracedb
from tests.fake_anthropic import FakeAnthropic
from tests.fake_openai import FakeOpenAI


@pytest.fixture
def fake():
    """A fake OpenAI-compatible server, counting every request it receives."""
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def fake_anthropic():
    """A fake Anthropic Messages API, counting every request it receives."""
    with FakeAnthropic() as server:
        yield server


@pytest.fixture
def data_dir(tmp_path):
    return str(tmp_path / "data")


@pytest.fixture
def store(data_dir):
    """A real tracedb store (WAL, SQLite) in a temporary directory."""
    s = tracedb.open(data_dir)
    try:
        yield s
    finally:
        s.close()
