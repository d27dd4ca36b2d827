"""Builders shared by the replay tests (a module with a unique name, not conftest)."""

from __future__ import annotations

from tracedb.records.record import (
    FINAL_RESPONSE,
    INTENT_RECEIVED,
    ExecutionEvent,
    ExecutionHeader,
    ExecutionRecord,
    compute_envelope_hash,
)

ENVELOPE = {
    "intent": "lookup_capital",
    "payload": {"country": "France"},
    "routingMetadata": {"host": "worker-1", "attempt": 1},
}


def build_record(
    *,
    execution_id: str = "exec-1",
    final=None,
    replayable: bool = True,
    reason=None,
    envelope=None,
    events=None,
    envelope_hash=None,
) -> ExecutionRecord:
    """A record in seed 000's shape; `final=None` leaves the final response out."""
    envelope = dict(ENVELOPE if envelope is None else envelope)
    if events is None:
        events = [ExecutionEvent(1, INTENT_RECEIVED, {"intent": envelope.get("intent")})]
        if final is not None:
            events.append(ExecutionEvent(2, FINAL_RESPONSE, final))
    return ExecutionRecord(
        header=ExecutionHeader(
            executionId=execution_id,
            createdUtcIso="2026-01-02T03:04:05Z",
            envelopeHash=envelope_hash or compute_envelope_hash(envelope),
            replayable=replayable,
            replayableReason=reason,
        ),
        envelope=envelope,
        events=events,
        finalResponse=final,
        status="completed" if final is not None else "incomplete",
        intent=envelope.get("intent"),
    )


# -- an agent for event-log replay tests (seed 004) ---------------------------------------------

TOOLS = [{"name": "roll_die", "parameters": {"sides": "int"}}]


def question(text: str, model: str = "model-a") -> dict:
    return {
        "system": "You are a dice referee.",
        "messages": [{"role": "user", "content": text}],
        "model": model,
        "tools": TOOLS,
        "output_schema": {"type": "object"},
    }


class World:
    """The live side: an LLM and a die whose answers change on every call, and call counters."""

    def __init__(self, start: int = 0):
        self.llm_calls = 0
        self.tool_calls = 0
        self.rolls = start

    def llm(self, request):
        self.llm_calls += 1
        return {"text": f"answer {self.llm_calls} to {request['messages'][-1]['content']}"}

    def roll(self, arguments):
        self.tool_calls += 1
        self.rolls += 1
        return {"value": self.rolls}


def agent(session, ask: str = "roll three dice", sides: int = 6):
    """Deterministic agent code: everything non-deterministic goes through the session."""
    plan = session.llm(question(ask))
    rolls = [session.tool("roll_die", {"sides": sides})["value"] for _ in range(3)]
    session.event("ROUTER_DECISION", {"agent": "referee", "rolls": len(rolls)})
    verdict = session.llm(question(f"total of {rolls}"))
    response = {"status": "success", "payload": {"plan": plan["text"], "rolls": rolls, "verdict": verdict["text"]}}
    session.finish(response)
    return response
