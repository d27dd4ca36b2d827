"""IntentusNet routes recorded as they happen (LiveRouter), with the real package: an agent
process SIGKILLed mid-call leaves an incomplete, non-replayable execution holding every event up
to the kill, where IntentusNet's own FileExecutionStore is left with nothing."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

import tracedb
from tracedb.cli import main
from tracedb.interop.intentusnet import to_plain
from tracedb.interop.intentusnet_live import LiveRouter

from .conftest import Upper, envelope

from intentusnet import (  # noqa: E402
    AgentDefinition, AgentRegistry, AgentResponse, BaseAgent, Capability, IntentRef, IntentRouter, ReplayEngine,
)

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "live_child.py")


def run_until_in_agent(mode: str, where: str) -> None:
    """Start the child, wait until its second route is inside the agent, SIGKILL it."""
    proc = subprocess.Popen([sys.executable, CHILD, mode, where], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ROUTED"
        assert proc.stdout.readline().strip() == "IN_AGENT"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()


def test_an_agent_killed_mid_call_leaves_an_incomplete_execution_with_its_events(tmp_path):
    data = str(tmp_path / "data")
    run_until_in_agent("tracedb", data)
    check_the_killed_route(data)


def check_the_killed_route(data: str) -> None:
    """The data directory (opened now, which recovers) holds the completed route and the one
    killed in its agent: incomplete, not replayable, its events up to the kill."""
    with tracedb.open(data, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
        rows = sorted(store.list(), key=lambda r: r.created_at_ns)
        assert [r.status for r in rows] == ["completed", "incomplete"]
        crashed = store.get(rows[1].execution_id)
        assert (crashed.header.replayable, crashed.header.replayableReason) == (False, "execution_incomplete")
        assert [e.type for e in crashed.events] == ["INTENT_RECEIVED", "AGENT_ATTEMPT_START"]
        assert crashed.events[1].payload == {"agent": "slow", "strategy": "DIRECT"}
        done = store.get(rows[0].execution_id)
        assert done.header.replayable and done.finalResponse["payload"] == {"text": "DONE"}
    result = CliRunner().invoke(main, ["--data-dir", data, "replay", rows[1].execution_id])
    assert result.exit_code == 6


def test_intentusnets_own_store_keeps_nothing_of_the_same_crash(tmp_path):
    records = str(tmp_path / "records")
    run_until_in_agent("file", records)
    assert len(os.listdir(records)) == 1  # the route that completed; the killed one is gone


def make_live_router(store, agent_cls):
    registry = AgentRegistry()
    router = LiveRouter(registry, store)
    registry.register(agent_cls(AgentDefinition(name="a", capabilities=[Capability(intent=IntentRef(name="UpperIntent"))]), router))
    return router


def test_a_finished_live_route_is_intentusnets_own_record_and_replays(store):
    router = make_live_router(store, Upper)
    env, as_recorded = envelope(text="hi")
    response = router.route_intent(env)
    (eid,) = router.records.list_ids()
    record = router.records.load(eid)
    assert [e.type for e in record.events] == [
        "INTENT_RECEIVED", "AGENT_ATTEMPT_START", "AGENT_ATTEMPT_END", "ROUTER_DECISION", "FINAL_RESPONSE",
    ]
    result = ReplayEngine(record).replay(env=as_recorded)
    assert result.envelope_hash_ok and result.response == to_plain(response)
    # Saving the same record again (as the router's store would be asked) is a no-op.
    assert router.records.save(record) == eid
    assert len(store.get(eid).events) == 5


def test_other_routers_in_the_process_are_not_recorded_live(store, tmp_path):
    make_live_router(store, Upper)  # installs the live recorder factory
    from intentusnet import FileExecutionStore

    registry = AgentRegistry()
    plain = IntentRouter(registry, record_store=FileExecutionStore(str(tmp_path / "files")))
    registry.register(Upper(AgentDefinition(name="u", capabilities=[Capability(intent=IntentRef(name="UpperIntent"))]), plain))
    plain.route_intent(envelope(text="x")[0])
    assert store.list() == []
    assert len(os.listdir(tmp_path / "files")) == 1


class NaNScore(BaseAgent):
    def handle_intent(self, env):
        return AgentResponse.success({"score": math.nan}, agent=self.definition.name)


def test_a_value_tracedb_refuses_mid_route_flags_the_execution_and_routing_goes_on(store):
    router = make_live_router(store, NaNScore)
    response = router.route_intent(envelope(text="x")[0])
    assert response.status == "success"  # recording is passive: the route answers as it would
    (row,) = store.list()
    rec = store.get(row.execution_id)
    assert rec.status == "completed"  # closed, not left running
    assert (rec.header.replayable, rec.header.replayableReason) == (False, "recording_failure")
    assert "NaN or infinity" in rec.finalResponse["tracedb.refused"]
    shown = json.loads(CliRunner().invoke(main, ["--data-dir", store.data_dir, "inspect", rec.execution_id, "--json"]).stdout)
    assert shown["replayable"] is False


class Counting(BaseAgent):
    calls = 0

    def handle_intent(self, env):
        Counting.calls += 1
        return AgentResponse.success({"ok": True}, agent=self.definition.name)


def test_an_envelope_tracedb_refuses_fails_the_route_before_any_agent_runs(store):
    router = make_live_router(store, Counting)
    env, _ = envelope(text="x")
    env.payload["threshold"] = math.nan
    Counting.calls = 0
    lsn = store.durable_lsn
    with pytest.raises(tracedb.InvalidInputError) as err:
        router.route_intent(env)
    assert "NaN or infinity" in err.value.message
    assert Counting.calls == 0 and store.durable_lsn == lsn and store.list() == []
    assert router.records.live == {}
