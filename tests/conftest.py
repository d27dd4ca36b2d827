"""Fixtures every test folder shares: a clock that moves when told, a data directory, a real
store, the fake model servers. A folder's own conftest.py adds what only it needs (and may
override one of these by name)."""

from __future__ import annotations

import os
from typing import Union

import pytest

import tracedb
from tests.fake_anthropic import FakeAnthropic
from tests.fake_openai import FakeOpenAI

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout the tests run from
T0_NS = 1_705_314_600_000_000_000  # 2024-01-15T10:30:00Z
# Seed 002's example events (type, payload), up to the router's decision; the FINAL_RESPONSE
# ({"status": "success"}) is what finish() records.
SEED_002 = [
    ("INTENT_RECEIVED", {"intent": "ProcessIntent"}),
    ("AGENT_ATTEMPT_START", {"agent": "processor-a"}),
    ("AGENT_ATTEMPT_END", {"agent": "processor-a", "status": "error"}),
    ("FALLBACK_TRIGGERED", {"from": "processor-a", "to": "processor-b"}),
    ("AGENT_ATTEMPT_START", {"agent": "processor-b"}),
    ("AGENT_ATTEMPT_END", {"agent": "processor-b", "status": "success"}),
    ("ROUTER_DECISION", {"agent": "processor-b"}),
]
QUIET = {"compact_interval_ms": 0, "idle_timeout_s": 0}  # no background compaction, no idle close


class FakeClock:
    """A clock that moves only when a test says so. `now` is its reading (`ns` the same value):
    nanoseconds since the epoch by default, or any unit with `per_second` (1.0: seconds, as the
    WAL writer's monotonic clock and the replay cache read)."""

    def __init__(self, start: Union[int, float] = T0_NS, per_second: Union[int, float] = 1_000_000_000):
        self.now = start
        self.per_second = per_second

    @property
    def ns(self) -> Union[int, float]:
        return self.now

    @ns.setter
    def ns(self, value: Union[int, float]) -> None:
        self.now = value

    def __call__(self) -> Union[int, float]:
        return self.now

    def advance(self, seconds: float) -> None:
        step = seconds * self.per_second
        self.now += int(step) if isinstance(self.now, int) else step


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def data_dir(tmp_path) -> str:
    return str(tmp_path / "data")


@pytest.fixture
def store(data_dir):
    """A real tracedb store (WAL, SQLite) in a temporary directory, default settings."""
    s = tracedb.open(data_dir)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def fake():
    """A fake OpenAI-compatible server on 127.0.0.1, counting every request it receives."""
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def fake_anthropic():
    """A fake Anthropic Messages API on 127.0.0.1, counting every request it receives."""
    with FakeAnthropic() as server:
        yield server
