"""Event-log replay (seed 004) without a store: the response cache keyed by content hash, repeated
calls in recorded order, strict divergence pinned to the first divergent event, permissive live
calls, and byte-identical reconstructed state."""

from __future__ import annotations

import pytest

from tracedb.errors import InvalidInputError, RecordedCallError, ReplayDivergenceError
from tracedb.records.record import FINAL_RESPONSE, LLM_REQUESTED, TOOL_REQUESTED, ExecutionEvent
from tracedb.replay.eventlog import (
    ReplaySession,
    args_hash,
    live_session,
    prompt_hash,
    reconstruct_state,
    replay_log,
)

from replay_helpers import World, agent, build_record, question

def recorded_run(world=None, **kwargs):
    """Run the agent live, return (record, response) as the store would give it back."""
    world = world or World()
    live = live_session(None, llm=world.llm, tools={"roll_die": world.roll})
    response = agent(live, **kwargs)
    return build_record(events=live.events, final=response), response


def strict_session(record):
    def refuse(*_):
        raise AssertionError("replay must not call the model or a tool")

    return ReplaySession(record, strict=True, llm=refuse, tools={"roll_die": refuse})


# -- hashing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"system": "other"},
        {"messages": [{"role": "user", "content": "other"}]},
        {"model": "model-b"},
        {"tools": []},
        {"output_schema": {"type": "string"}},
    ],
)
def test_prompt_hash_covers_every_part_of_the_prompt(change):
    assert prompt_hash({**question("q"), **change}) != prompt_hash(question("q"))


def test_prompt_hash_ignores_what_is_not_prompt_content():
    assert prompt_hash({**question("q"), "request_id": "r-9", "sent_at": 12}) == prompt_hash(question("q"))


def test_args_hash_is_independent_of_key_order():
    assert args_hash({"a": 1, "b": 2}) == args_hash({"b": 2, "a": 1})
    assert args_hash({"a": 1}) != args_hash({"a": 2})


# -- serving the log ---------------------------------------------------------------------------------


def test_live_session_records_request_and_response_pairs():
    record, _ = recorded_run()
    types = [e.type for e in record.events]
    assert types == [
        "llm.requested", "llm.responded",
        "tool.requested", "tool.responded",
        "tool.requested", "tool.responded",
        "tool.requested", "tool.responded",
        "ROUTER_DECISION",
        "llm.requested", "llm.responded",
        FINAL_RESPONSE,
    ]
    first = record.events[0].payload
    assert first["prompt_hash"] == prompt_hash(question("roll three dice"))
    assert record.events[1].payload["request_seq"] == 1


def test_strict_replay_serves_every_call_from_the_log():
    record, response = recorded_run()
    session = strict_session(record)
    assert agent(session) == response
    assert session.consumed
    assert (session.served, session.live) == (5, 0)


def test_repeated_identical_calls_replay_in_recorded_order():
    # Three identical roll_die calls answered 1, 2, 3: a cache keyed on the call alone would give 1, 1, 1.
    record, response = recorded_run()
    assert response["payload"]["rolls"] == [1, 2, 3]
    for strict in (True, False):
        session = ReplaySession(record, strict=strict)
        assert agent(session)["payload"]["rolls"] == [1, 2, 3]


def test_recorded_error_replays_as_that_error():
    def broken(_request):
        raise TimeoutError("model timed out")

    live = live_session(None, llm=broken)
    with pytest.raises(TimeoutError):
        live.llm(question("q"))
    record = build_record(events=live.events, final=None, replayable=False, reason="execution_incomplete")
    assert record.events[1].payload["error"] == {"type": "TimeoutError", "message": "model timed out"}
    with pytest.raises(RecordedCallError) as info:
        ReplaySession(record).llm(question("q"))
    assert info.value.seq == 1 and info.value.error_type == "TimeoutError"


# -- strict mode: divergence pinned to the first divergent event -------------------------------------


def _seq_of(record, type_, n=1):
    return [e.seq for e in record.events if e.type == type_][n - 1]


def test_strict_divergence_on_a_changed_prompt_is_pinned_to_that_request():
    record, _ = recorded_run()
    with pytest.raises(ReplayDivergenceError) as info:
        agent(strict_session(record), ask="roll two dice")
    err = info.value
    assert err.seq == _seq_of(record, LLM_REQUESTED, 1) == 1
    assert prompt_hash(question("roll three dice")) in err.expected
    assert prompt_hash(question("roll two dice")) in err.got


def test_strict_divergence_on_changed_tool_arguments_is_the_first_one_only():
    # All three rolls differ; the error names the first of them.
    record, _ = recorded_run()
    with pytest.raises(ReplayDivergenceError) as info:
        agent(strict_session(record), sides=20)
    err = info.value
    assert err.seq == _seq_of(record, TOOL_REQUESTED, 1) == 3
    assert args_hash({"sides": 6}) in err.expected
    assert args_hash({"sides": 20}) in err.got and "roll_die" in err.got


def test_strict_divergence_on_a_different_kind_of_call():
    record, _ = recorded_run()
    session = strict_session(record)
    session.llm(question("roll three dice"))
    with pytest.raises(ReplayDivergenceError) as info:
        session.llm(question("roll three dice"))  # the log has a tool call next
    assert info.value.seq == 3
    assert "tool.requested" in info.value.expected and "llm.requested" in info.value.got


def _replayed_to_the_dice():
    """A recorded run, and a strict replay of it that asked the question and rolled the three
    dice as recorded."""
    record, _ = recorded_run()
    session = strict_session(record)
    session.llm(question("roll three dice"))
    for _ in range(3):
        session.tool("roll_die", {"sides": 6})
    return record, session


def test_strict_divergence_on_a_changed_event_payload():
    record, session = _replayed_to_the_dice()
    with pytest.raises(ReplayDivergenceError) as info:
        session.event("ROUTER_DECISION", {"agent": "someone else", "rolls": 3})
    assert info.value.seq == _seq_of(record, "ROUTER_DECISION")


def test_strict_divergence_when_the_code_stops_early():
    record, _ = recorded_run()
    session = strict_session(record)
    session.llm(question("roll three dice"))
    with pytest.raises(ReplayDivergenceError) as info:
        session.finish({"status": "success", "payload": None})
    assert info.value.seq == 3  # the first recorded call that never came
    assert "FINAL_RESPONSE" in info.value.got


def test_strict_divergence_on_a_different_final_response():
    record, response = recorded_run()

    class Tweaked:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def finish(self, r):
            self.inner.finish({**r, "status": "partial"})

    with pytest.raises(ReplayDivergenceError) as info:
        agent(Tweaked(strict_session(record)))
    assert info.value.seq == _seq_of(record, FINAL_RESPONSE)


def _divergence_of_a_log_cut_after(n_events: int) -> ReplayDivergenceError:
    """A strict replay of the run's first `n_events` events only (an incomplete record): the
    question, then a tool call; the divergence it raises."""
    record, _ = recorded_run()
    cut = build_record(events=record.events[:n_events], final=None, replayable=False, reason="execution_incomplete")
    session = strict_session(cut)
    session.llm(question("roll three dice"))
    with pytest.raises(ReplayDivergenceError) as info:
        session.tool("roll_die", {"sides": 6})
    return info.value


def test_strict_divergence_past_the_end_of_the_log():
    err = _divergence_of_a_log_cut_after(2)
    assert err.seq == 3
    assert err.expected == "end of log"


def test_extra_call_before_the_final_response_diverges_at_it():
    record, session = _replayed_to_the_dice()
    session.event("ROUTER_DECISION", {"agent": "referee", "rolls": 3})
    session.llm(question("total of [1, 2, 3]"))
    with pytest.raises(ReplayDivergenceError) as info:
        session.tool("roll_die", {"sides": 6})
    assert info.value.seq == _seq_of(record, FINAL_RESPONSE)


def test_a_finished_session_refuses_more_calls():
    record, _ = recorded_run()
    session = strict_session(record)
    agent(session)
    with pytest.raises(InvalidInputError, match="finished"):
        session.tool("roll_die", {"sides": 6})


def test_strict_replay_of_a_log_cut_inside_a_call_diverges_there():
    assert _divergence_of_a_log_cut_after(3).seq == 3


# -- permissive mode ---------------------------------------------------------------------------------


def test_permissive_replay_runs_unmatched_calls_live_and_serves_the_rest():
    record, _ = recorded_run()
    world = World(start=100)
    session = ReplaySession(record, strict=False, llm=world.llm, tools={"roll_die": world.roll})
    response = agent(session, sides=20)
    # The first prompt is the same: served. The rolls changed arguments: live. The last prompt
    # mentions the new rolls: live.
    assert response["payload"]["plan"] == "answer 1 to roll three dice"
    assert response["payload"]["rolls"] == [101, 102, 103]
    assert (world.llm_calls, world.tool_calls) == (1, 3)
    assert (session.served, session.live) == (1, 4)


def test_permissive_replay_without_a_live_callable_says_what_to_pass():
    record, _ = recorded_run()
    with pytest.raises(InvalidInputError, match="no live tool"):
        agent(ReplaySession(record, strict=False), sides=20)


def test_permissive_replay_runs_live_where_the_log_was_cut():
    record, _ = recorded_run()
    cut = build_record(events=record.events[:3], final=None, replayable=False, reason="execution_incomplete")
    world = World(start=50)
    session = ReplaySession(cut, strict=False, llm=world.llm, tools={"roll_die": world.roll})
    assert agent(session)["payload"]["rolls"] == [51, 52, 53]
    assert world.llm_calls == 1  # only the second prompt; the first was served


# -- reconstructed state -----------------------------------------------------------------------------


def test_two_replays_of_the_same_log_give_byte_identical_state():
    record, _ = recorded_run()
    one, two = strict_session(record), ReplaySession(record, strict=False)
    agent(one)
    agent(two)
    assert one.state_bytes() == two.state_bytes()
    assert one.state_bytes() == reconstruct_state(record).to_bytes()
    assert replay_log(record).to_bytes() == replay_log(record).to_bytes()
    assert replay_log(record).digest == one.state().digest


def test_state_differs_when_the_log_differs():
    a, _ = recorded_run(World(0))
    b, _ = recorded_run(World(10))
    assert replay_log(a).to_bytes() != replay_log(b).to_bytes()


def test_state_holds_calls_with_their_answers():
    record, response = recorded_run()
    state = replay_log(record).data
    assert state["llm_calls"] == 2 and state["tool_calls"] == 3
    assert [i["response"]["value"] for i in state["timeline"] if i["kind"] == "tool"] == [1, 2, 3]
    assert state["final_response"] == response


def test_foreign_log_without_request_seq_pairs_answers_in_order():
    # A log written by another recorder: hashes and request_seq left out.
    events = [
        ExecutionEvent(1, "tool.requested", {"name": "roll_die", "arguments": {"sides": 6}}),
        ExecutionEvent(2, "tool.responded", {"name": "roll_die", "response": {"value": 4}}),
        ExecutionEvent(3, "tool.requested", {"name": "roll_die", "arguments": {"sides": 6}}),
        ExecutionEvent(4, "tool.responded", {"name": "roll_die", "response": {"value": 2}}),
    ]
    session = ReplaySession(events)
    assert [session.tool("roll_die", {"sides": 6})["value"] for _ in range(2)] == [4, 2]
