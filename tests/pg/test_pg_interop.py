"""IntentusNet on a fleet: a router records into a PostgreSQL-backed store, and a reader on
another machine (the database URL alone) hands the record to IntentusNet's ReplayEngine."""

from __future__ import annotations

import copy

import pytest

from tracedb.projection import db
from tracedb.interop.intentusnet import TraceDBExecutionStore, to_plain

pytestmark = pytest.mark.postgres
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
    ReplayEngine,
)


class Upper(BaseAgent):
    def handle_intent(self, env):
        return AgentResponse.success({"text": env.payload["text"].upper()}, agent=self.definition.name)


def test_a_router_records_into_postgresql_and_intentusnet_replays_from_the_database(open_pg_store, pg_url):
    store = open_pg_store()
    registry = AgentRegistry()
    router = IntentRouter(registry, record_store=TraceDBExecutionStore(store))
    registry.register(Upper(AgentDefinition(name="upper", capabilities=[Capability(intent=IntentRef(name="Up"))]), router))
    env = IntentEnvelope(
        version="1.0", intent=IntentRef(name="Up"), payload={"text": "fleet"},
        context=IntentContext(sourceAgent="t", timestamp="2024-01-15T10:30:00+00:00"),
        metadata=IntentMetadata(requestId="r", source="t", createdAt="2024-01-15T10:30:00+00:00",
                                traceId="tr", identityChain=[]),
    )
    as_recorded = copy.deepcopy(env)
    response = router.route_intent(env)
    store.compact()
    engine = db.create_engine(pg_url)
    try:
        reader = TraceDBExecutionStore.reader(engine)
        (eid,) = reader.list_ids()
        result = ReplayEngine(reader.load(eid)).replay(env=as_recorded)
    finally:
        engine.dispose()
    assert result.envelope_hash_ok and result.response == to_plain(response)
