"""Event-log replay and fork (seed 004) on the real store: strict replay of a stored run, permissive
replay recording into a new execution, byte-identical double replay, fork lineage and live
continuation, and forks pinning their parent against prune."""

from __future__ import annotations

import pytest

import tracedb
from tracedb.errors import InvalidInputError, ReplayDivergenceError
from tracedb.records.record import FINAL_RESPONSE, LLM_REQUESTED, TOOL_REQUESTED
from tracedb.replay.eventlog import ReplaySession, live_session, replay_log
from tracedb.replay.forking import fork

from replay_helpers import World, agent
from tests.conftest import FakeClock

ENVELOPE = {"intent": "dice", "table": 7}


def record_live(store, world=None, **kwargs):
    world = world or World()
    ex = store.start("dice", ENVELOPE)
    ex.event("INTENT_RECEIVED", {"intent": "dice"})
    response = agent(live_session(ex, llm=world.llm, tools={"roll_die": world.roll}), **kwargs)
    return ex.execution_id, response


def refuse(*_):
    raise AssertionError("replay must not call the model or a tool")


def replay_agent(session, **kwargs):
    session.event("INTENT_RECEIVED", {"intent": "dice"})
    return agent(session, **kwargs)


# -- replaying a stored log -----------------------------------------------------------------------


def test_strict_replay_of_a_stored_run(store):
    exec_id, response = record_live(store)
    session = ReplaySession.from_store(store, exec_id, llm=refuse, tools={"roll_die": refuse})
    assert replay_agent(session) == response
    assert session.consumed and session.new_execution_id is None


def test_strict_divergence_names_the_stored_seq(store):
    exec_id, _ = record_live(store)
    record = store.get(exec_id)
    first_tool_seq = next(e.seq for e in record.events if e.type == TOOL_REQUESTED)
    session = ReplaySession.from_store(store, exec_id, llm=refuse, tools={"roll_die": refuse})
    with pytest.raises(ReplayDivergenceError) as info:
        replay_agent(session, sides=8)
    assert info.value.seq == first_tool_seq


def test_permissive_replay_records_live_calls_into_a_new_linked_execution(store):
    exec_id, _ = record_live(store)
    before = store.get(exec_id).to_dict()
    world = World(start=40)
    session = ReplaySession.from_store(store, exec_id, strict=False, llm=world.llm, tools={"roll_die": world.roll})
    response = replay_agent(session, sides=12)
    assert response["payload"]["rolls"] == [41, 42, 43]
    new = store.get(session.new_execution_id)
    assert new.parentExecutionId == exec_id
    assert new.status == "completed" and new.finalResponse == response
    # The new run's log is whole: the served first prompt, then the live calls.
    types = [e.type for e in new.events]
    assert types[:3] == ["INTENT_RECEIVED", "llm.requested", "llm.responded"]
    assert types.count(TOOL_REQUESTED) == 3 and types[-1] == FINAL_RESPONSE
    for e in new.events:
        if e.type.endswith(".responded"):
            assert new.events[e.payload["request_seq"] - 1].type.endswith(".requested")
    # The new run replays strictly on its own, and the parent is untouched.
    strict = ReplaySession.from_store(store, new.execution_id, llm=refuse, tools={"roll_die": refuse})
    assert replay_agent(strict, sides=12) == response
    assert store.get(exec_id).to_dict() == before


def test_permissive_replay_that_matches_everything_records_nothing(store):
    exec_id, _ = record_live(store)
    before = len(store.list())
    session = ReplaySession.from_store(store, exec_id, strict=False)
    replay_agent(session)
    assert session.new_execution_id is None and len(store.list()) == before


def test_two_replays_of_the_same_stored_log_are_byte_identical(tmp_path):
    data = str(tmp_path / "d")
    with tracedb.open(data) as s:
        exec_id, _ = record_live(s)
        first = replay_log(s.get(exec_id)).to_bytes()
        session = ReplaySession.from_store(s, exec_id)
        replay_agent(session)
        via_session = session.state_bytes()
    with tracedb.open(data) as s:  # a reopened store: the log read back from SQLite
        second = replay_log(s.get(exec_id)).to_bytes()
        again = ReplaySession.from_store(s, exec_id)
        replay_agent(again)
    assert first == second == via_session == again.state_bytes()


# -- fork ---------------------------------------------------------------------------------------------


def test_fork_shares_the_prefix_and_records_its_lineage(store):
    exec_id, _ = record_live(store)
    parent = store.get(exec_id)
    at = next(e.seq for e in parent.events if e.type == TOOL_REQUESTED)  # the first roll's request
    f = fork(store, exec_id, at)
    child = store.get(f.execution_id)
    assert [(e.seq, e.type, e.payload) for e in child.events] == [
        (e.seq, e.type, e.payload) for e in parent.events if e.seq <= at
    ]
    assert child.parentExecutionId == exec_id and child.forkedAtSeq == at
    assert child.to_dict()["lineage"] == {"parentExecutionId": exec_id, "forkedAtSeq": at}
    assert child.status == "running"
    assert f.to_dict()["copied_events"] == at


def test_fork_continues_live(store):
    exec_id, _ = record_live(store)
    f = fork(store, exec_id, 3)
    assert f.event("ROUTER_DECISION", {"agent": "override"}) == 4
    f.finish({"status": "success", "payload": "forked"})
    child = store.get(f.execution_id)
    assert child.status == "completed" and child.header.replayable
    assert [e.type for e in child.events][-2:] == ["ROUTER_DECISION", FINAL_RESPONSE]
    assert store.get(exec_id).finalResponse["payload"]["rolls"] == [1, 2, 3]


def test_fork_session_replays_the_prefix_strictly_then_runs_live(store):
    exec_id, original = record_live(store)
    parent = store.get(exec_id)
    # Fork after the first roll's answer: the plan and roll 1 are shared, rolls 2-3 and the verdict are new.
    at = [e.seq for e in parent.events if e.type == "tool.responded"][0]
    world = World(start=60)
    f = fork(store, exec_id, at)
    session = f.session(llm=world.llm, tools={"roll_die": world.roll})
    response = replay_agent(session)
    assert response["payload"]["plan"] == original["payload"]["plan"]
    assert response["payload"]["rolls"] == [1, 61, 62]
    assert (world.llm_calls, world.tool_calls) == (1, 2)
    child = store.get(f.execution_id)
    assert child.status == "completed" and child.finalResponse == response
    assert [e.payload for e in child.events if e.seq <= at] == [e.payload for e in parent.events if e.seq <= at]
    assert len([e for e in child.events if e.type == TOOL_REQUESTED]) == 3  # no duplicated prefix


def test_fork_session_is_strict_about_the_shared_prefix(store):
    exec_id, _ = record_live(store)
    f = fork(store, exec_id, 5)
    world = World()
    with pytest.raises(ReplayDivergenceError) as info:
        replay_agent(f.session(llm=world.llm, tools={"roll_die": world.roll}), ask="roll four dice")
    first_llm = next(e.seq for e in store.get(exec_id).events if e.type == LLM_REQUESTED)
    assert info.value.seq == first_llm
    assert world.llm_calls == 0


def test_fork_cut_inside_a_call_answers_it_live(store):
    exec_id, _ = record_live(store)
    parent = store.get(exec_id)
    request_seq = next(e.seq for e in parent.events if e.type == TOOL_REQUESTED)
    world = World(start=90)
    f = fork(store, exec_id, request_seq)
    assert replay_agent(f.session(llm=world.llm, tools={"roll_die": world.roll}))["payload"]["rolls"] == [91, 92, 93]
    child = store.get(f.execution_id)
    answer = next(e for e in child.events if e.type == "tool.responded")
    assert answer.payload["request_seq"] == request_seq
    assert [e.type for e in child.events].count(TOOL_REQUESTED) == 3


def test_fork_of_a_crashed_execution(tmp_path):
    data = str(tmp_path / "d")
    with tracedb.open(data) as s:
        ex = s.start("dice", ENVELOPE)
        ex.event("INTENT_RECEIVED", {"intent": "dice"})
        ex.event("ROUTER_DECISION", {"agent": "referee"})
        crashed = ex.execution_id
    with tracedb.open(data) as s:
        assert s.get(crashed).status == "incomplete"
        f = fork(s, crashed, 2)
        f.finish({"status": "success", "payload": "resumed"})
        assert s.get(f.execution_id).header.replayable


@pytest.mark.parametrize("at", [-1, 999, "3"])
def test_fork_point_must_be_an_event_of_the_parent(store, at):
    exec_id, _ = record_live(store)
    with pytest.raises(InvalidInputError):
        fork(store, exec_id, at)


def test_fork_at_or_after_the_final_response_is_refused(store):
    exec_id, _ = record_live(store)
    final_seq = store.get(exec_id).events[-1].seq
    with pytest.raises(InvalidInputError, match="final response"):
        fork(store, exec_id, final_seq)


def test_fork_at_zero_shares_nothing(store):
    exec_id, _ = record_live(store)
    f = fork(store, exec_id, 0)
    child = store.get(f.execution_id)
    assert child.events == [] and child.forkedAtSeq == 0 and child.envelope == ENVELOPE


# -- forks pin their parent against prune -----------------------------------------------------------


def test_parent_with_a_fork_is_not_pruned(tmp_path):
    clock = FakeClock(1_767_225_600 * 10**9)  # 2026-01-01
    with tracedb.open(str(tmp_path / "d"), clock=clock) as s:
        parent, _ = record_live(s)
        lonely, _ = record_live(s)
        clock.advance(35 * 86400)
        f = fork(s, parent, 3)
        f.finish({"status": "success", "payload": "forked"})
        clock.advance(5 * 86400)
        s.prune(older_than_s=30 * 86400)
        assert s.get(parent).execution_id == parent  # 40 days old, but its fork lives
        assert s.get(f.execution_id).parentExecutionId == parent
        with pytest.raises(tracedb.errors.ExecutionNotFoundError):
            s.get(lonely)
        clock.advance(40 * 86400)  # now the fork is old too: once it goes, the parent may go
        s.prune(older_than_s=30 * 86400)
        s.prune(older_than_s=30 * 86400)
        for gone in (f.execution_id, parent):
            with pytest.raises(tracedb.errors.ExecutionNotFoundError):
                s.get(gone)
