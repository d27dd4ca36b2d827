"""Fixtures for the IntentusNet interop tests: the real `intentusnet` package, a router whose
record store is tracedb, and IntentusNet envelopes."""

from __future__ import annotations

import copy

import pytest

import tracedb

intentusnet = pytest.importorskip(
    "intentusnet", reason="the intentusnet package is not installed (pip install intentusnet)"
)
from intentusnet import (  # noqa: E402
    AgentDefinition,
    AgentRegistry,
    AgentResponse,
    BaseAgent,
    Capability,
    IntentContext,
    IntentEnvelope,
    IntentMetadata,
    IntentRef,
    IntentRouter,
    RoutingOptions,
)
from intentusnet.protocol.intent import RoutingMetadata  # noqa: E402


class Upper(BaseAgent):
    """Answers with the text upper-cased."""

    def handle_intent(self, env):
        return AgentResponse.success(
            {"text": env.payload["text"].upper()}, agent=self.definition.name, trace_id=env.metadata.traceId
        )


class Broken(BaseAgent):
    """Always fails: its failure is an ErrorInfo object in the response."""

    def handle_intent(self, env):
        raise RuntimeError("tool backend down")


def make_router(record_store, *agents):
    """An IntentRouter with `record_store`, and agents given as (class, name, intent name)."""
    registry = AgentRegistry()
    router = IntentRouter(registry, record_store=record_store)
    for cls, name, intent in agents:
        registry.register(cls(AgentDefinition(name=name, capabilities=[Capability(intent=IntentRef(name=intent))]), router))
    return router


def envelope(intent: str = "UpperIntent", text: str = "hello", strategy=None):
    """An IntentusNet envelope, and a deep copy of it as it is recorded (routing mutates the
    live one: agents append to routingMetadata.decisionPath)."""
    env = IntentEnvelope(
        version="1.0",
        intent=IntentRef(name=intent),
        payload={"text": text},
        context=IntentContext(sourceAgent="test", timestamp="2024-01-15T10:30:00+00:00"),
        metadata=IntentMetadata(
            requestId="req-1", source="test", createdAt="2024-01-15T10:30:00+00:00",
            traceId="trace-1", identityChain=[],
        ),
        routing=RoutingOptions() if strategy is None else RoutingOptions(strategy=strategy),
        routingMetadata=RoutingMetadata(),
    )
    return env, copy.deepcopy(env)


@pytest.fixture
def store(data_dir):
    s = tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0})
    yield s
    s.close()
