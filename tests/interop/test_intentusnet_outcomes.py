"""IntentusNet's error responses, routed live by the real package into tracedb: a route whose
agents all fail is `failed` with the router's error code; a fallback that recovers is
`succeeded`, its failed attempt kept as the first error (tracedb.records.outcomes)."""

from __future__ import annotations

from intentusnet import AgentDefinition, AgentRegistry, Capability, IntentRef, RoutingStrategy

from tracedb.interop.intentusnet_live import LiveRouter

from .conftest import Broken, Upper, envelope


def live_router(store, *agents):
    registry = AgentRegistry()
    router = LiveRouter(registry, store)
    for cls, name in agents:
        registry.register(cls(AgentDefinition(name=name, capabilities=[Capability(intent=IntentRef(name="UpperIntent"))]), router))
    return router


def the_row(store):
    store.compact()
    [row] = store.list()
    return row, store.get(row.execution_id)


def test_a_route_whose_agent_fails_is_failed_with_intentusnets_error_code(store):
    router = live_router(store, (Broken, "broken"))
    response = router.route_intent(envelope(text="x")[0])
    assert response.status == "error"
    row, rec = the_row(store)
    assert rec.finalResponse["status"] == "error"
    code = rec.finalResponse["error"]["code"]
    assert row.outcome == "failed" and row.status == "completed" and row.replayable  # recorded in full
    attempt = next(e for e in rec.events if e.type == "AGENT_ATTEMPT_END")
    assert attempt.error is not None  # the attempt's status is error
    assert (row.error["seq"], row.error["type"]) == (attempt.seq, "AGENT_ATTEMPT_END")
    assert rec.events[-1].error == {"code": code, "message": rec.finalResponse["error"]["message"]}


def test_a_fallback_that_recovers_succeeds_and_keeps_its_failed_attempt(store):
    router = live_router(store, (Broken, "broken"), (Upper, "upper"))
    response = router.route_intent(envelope(text="x", strategy=RoutingStrategy.FALLBACK)[0])
    assert response.status == "success"
    row, rec = the_row(store)
    assert row.outcome == "succeeded"
    failed = [e for e in rec.events if e.error is not None]
    assert [e.type for e in failed] == ["AGENT_ATTEMPT_END"]
    # The agent turned the exception into an error response: the attempt records only its status.
    assert (row.error["seq"], row.error["code"]) == (failed[0].seq, "error")
