"""The OpenAI Agents SDK: a run recorded live by the tracing processor, replayed offline by the
replay model provider, and a run SIGKILLed in the middle.

The agent (tests/integrations/weather_agent.py) has two function tools and a handoff; its model
is the fake OpenAI server on 127.0.0.1, reached through the SDK's own OpenAIProvider. A replay
must reach the same final output with the fake server's request count unchanged.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from agents import RunConfig, Runner

import tracedb
from tests.children import kill_when
from tests.integrations import weather_agent as wa
from tests.integrations.weather_agent import replay_run
from tracedb.config import load_config
from tracedb.errors import NotReplayableError, ReplayDivergenceError, UsageError
from tracedb.integrations.agents import ReplayModelProvider, TraceDBProcessor
from tracedb.reads.reader import Reader
from tracedb.records.spans import span_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def fresh_tools():
    wa.TOOL_CALLS.clear()
    wa.WEATHER["Paris"] = "sunny"
    yield
    wa.WEATHER["Paris"] = "sunny"


def live_run(store, fake):
    result = wa.run_live(fake)
    [row] = store.list()
    return row.execution_id, result


def reader_of(data_dir):
    return Reader.open(load_config(overrides={"data_dir": data_dir}))


def test_a_live_run_is_recorded_span_by_span(store, fake, processor):
    eid, result = live_run(store, fake)
    assert result.final_output == wa.FINAL and fake.request_count == 4
    rec = store.get(eid)
    assert rec.status == "completed" and rec.header.replayable is True
    assert rec.intent == "Agent workflow"
    types = [e.type for e in rec.events]
    assert types.count("llm.requested") == 4 and types.count("llm.responded") == 4
    tools = [e.payload["name"] for e in rec.events if e.type == "tool.requested"]
    assert tools == ["get_weather", "get_time"]
    outputs = [e.payload["response"] for e in rec.events if e.type == "tool.responded"]
    assert outputs == ["sunny in Paris", "noon in Paris"]
    [handoff] = [e.payload for e in rec.events if e.type == "agents.handoff"]
    assert (handoff["from_agent"], handoff["to_agent"]) == ("triage", "specialist")
    agents_started = [e.payload["name"] for e in rec.events
                      if e.type == "agents.span.started" and e.payload["type"] == "agent"]
    assert agents_started == ["triage", "specialist"]
    first = next(e.payload for e in rec.events if e.type == "llm.requested")
    assert first["request"]["input"] == [{"content": wa.QUESTION, "role": "user"}]
    assert first["request"]["instructions"] == wa.triage.instructions
    assert rec.finalResponse == {
        "status": "success", "payload": {"final_output": wa.FINAL, "last_agent": "specialist"},
    }
    # exact replay gives back what the run answered
    out = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", store.config.data_dir, "replay", eid,
                          "--json"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    replayed = json.loads(out.stdout)
    assert replayed["payload"]["final_output"] == wa.FINAL and replayed["fromReplay"] is True


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_a_recorded_run_replays_offline_to_the_recorded_output(data_dir, fake, streamed):
    with tracedb.open(data_dir) as store:
        with wa.processing(store):
            eid, live = live_run(store, fake)
    assert wa.TOOL_CALLS == ["get_weather(Paris)", "get_time(Paris)"]
    requests = fake.request_count

    with reader_of(data_dir) as reader:  # the public read API, the recorder closed
        provider = ReplayModelProvider(reader, eid)
    wa.TOOL_CALLS.clear()
    result = replay_run(provider, streamed=streamed)
    assert result.final_output == live.final_output == wa.FINAL
    assert result.last_agent.name == "specialist"
    assert fake.request_count == requests  # no request reached the model server
    assert wa.TOOL_CALLS == ["get_weather(Paris)", "get_time(Paris)"]  # the tools ran again
    assert provider.served == 4 and provider.consumed


def test_a_replay_traced_by_the_processor_is_recorded_and_replays_in_its_turn(store, fake, processor):
    eid, _ = live_run(store, fake)
    requests = fake.request_count
    result = replay_run(ReplayModelProvider(store, eid), tracing=True)
    assert result.final_output == wa.FINAL
    [again] = [r.execution_id for r in store.list() if r.execution_id != eid]
    original, replayed = store.get(eid), store.get(again)
    ids = [[e.payload["response"]["id"] for e in r.events if e.type == "llm.responded"] for r in (original, replayed)]
    assert ids[0] == ids[1] and len(ids[0]) == 4
    assert replay_run(ReplayModelProvider(store, again)).final_output == wa.FINAL
    assert fake.request_count == requests


def test_a_tool_that_answers_differently_makes_a_strict_replay_diverge(store, fake, processor):
    eid, _ = live_run(store, fake)
    second_call = [e.seq for e in store.get(eid).events if e.type == "llm.requested"][1]
    requests = fake.request_count
    wa.WEATHER["Paris"] = "raining"
    with pytest.raises(ReplayDivergenceError) as e:
        replay_run(ReplayModelProvider(store, eid))
    assert e.value.seq == second_call  # pinned to the model call whose input changed
    assert fake.request_count == requests


def test_permissive_replay_calls_the_model_for_what_diverged_into_a_linked_execution(store, fake, processor):
    eid, _ = live_run(store, fake)
    requests = fake.request_count
    wa.WEATHER["Paris"] = "raining"
    fake.push_response(tool_calls=[{"name": "transfer_to_specialist", "arguments": {}}])
    fake.push_response(tool_calls=[{"name": "get_time", "arguments": {"city": "Paris"}}])
    fake.push_response("It is raining and it is noon in Paris.")
    provider = ReplayModelProvider(store, eid, strict=False, live=wa.live_provider(fake.base_url))

    async def main():
        try:
            return await Runner.run(wa.triage, wa.QUESTION,
                                    run_config=RunConfig(model_provider=provider, tracing_disabled=True))
        finally:
            await provider.aclose()

    result = asyncio.run(main())
    assert result.final_output == "It is raining and it is noon in Paris."
    assert provider.served == 1 and fake.request_count == requests + 3
    linked = store.get(provider.new_execution_id)
    assert linked.to_dict()["lineage"]["parentExecutionId"] == eid
    assert [e.type for e in linked.events].count("llm.responded") == 4
    assert linked.status == "completed"
    assert linked.finalResponse["payload"]["final_output"] == result.final_output


def test_the_processor_refuses_an_asyncio_recorder(data_dir):
    async def main():
        astore = await tracedb.open_async(data_dir)
        try:
            with pytest.raises(UsageError, match="synchronously"):
                TraceDBProcessor(astore)
        finally:
            await astore.close()

    asyncio.run(main())


def test_a_run_killed_mid_way_is_incomplete_and_not_replayable(data_dir, fake):
    wa.script(fake, stall_at_specialist=True)
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.integrations.agent_child", data_dir, fake.base_url],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )

    def stalled():
        # The child is held inside the specialist's first model call: kill it there.
        assert fake.stalled.wait(60), child.stderr.read().decode() if child.poll() is not None else "no stall"

    kill_when(child, stalled)

    tracedb_cli = [sys.executable, "-m", "tracedb", "--data-dir", data_dir]
    recover = subprocess.run([*tracedb_cli, "recover"], cwd=ROOT, capture_output=True, text=True)
    assert recover.returncode == 0, recover.stderr
    with reader_of(data_dir) as reader:
        [row] = reader.page().items
        rec = reader.get(row.execution_id)
        with pytest.raises(NotReplayableError) as e:
            ReplayModelProvider(reader, row.execution_id)
    assert e.value.reason == "execution_incomplete"
    assert rec.status == "incomplete" and rec.header.replayable is False
    assert rec.header.replayableReason == "execution_incomplete"
    # Everything recorded before the kill is there: each callback returned once durable.
    types = [e.type for e in rec.events]
    assert types.count("llm.responded") == 2
    assert [e.payload["name"] for e in rec.events if e.type == "tool.responded"] == ["get_weather"]
    assert "agents.handoff" in types
    last = rec.events[-1].payload
    assert rec.events[-1].type == "agents.span.started" and last["type"] == "response"

    replay = subprocess.run([*tracedb_cli, "replay", row.execution_id], cwd=ROOT, capture_output=True, text=True)
    assert replay.returncode == 6, replay.stderr
    assert "error:" in replay.stderr and "not replayable" in replay.stderr and "hint:" in replay.stderr


def test_a_run_that_fails_records_its_error_as_the_final_response(store, fake, processor):
    from agents.exceptions import MaxTurnsExceeded

    wa.script(fake)
    with pytest.raises(MaxTurnsExceeded):
        asyncio.run(Runner.run(wa.triage, wa.QUESTION, run_config=wa.live_config(fake.base_url), max_turns=1))
    [row] = store.list()
    rec = store.get(row.execution_id)
    assert rec.finalResponse["status"] == "error"
    assert rec.finalResponse["error"]["message"] == "Max turns exceeded"
    assert rec.finalResponse["payload"] == {"final_output": None, "last_agent": "triage"}


def test_each_callback_returns_once_its_events_are_in_the_wal_and_fdatasynced(store, data_dir, processor):
    import wal
    from agents.tracing import custom_span, function_span, trace

    from tracedb.records.codec import decode_record

    def on_disk():
        """Every event of the WAL's segment files as read back from them, with its LSN."""
        docs = [(r.lsn, decode_record(r.payload)) for r in wal.read_records(os.path.join(data_dir, "wal"))]
        return [(lsn, d) for lsn, d in docs if d.get("op") == "event"]

    with trace("Durable workflow"):
        with function_span("lookup", input='{"q": 1}') as span:
            span.span_data.output = "found"
        # function_span's end returned: its tool events are in the files, under the durable LSN
        events = on_disk()
        [(lsn, requested)] = [(lsn, d) for lsn, d in events if d["type"] == "tool.requested"]
        [(lsn2, responded)] = [(lsn, d) for lsn, d in events if d["type"] == "tool.responded"]
        assert requested["payload"]["arguments"] == {"q": 1} and responded["payload"]["response"] == "found"
        assert max(lsn, lsn2) <= store.durable_lsn
        with custom_span("checkpoint", {"step": 2}):
            started = [d for _, d in on_disk() if d["type"] == "agents.span.started"]
            assert started[-1]["payload"]["name"] == "checkpoint"
        assert any(d["type"] == "agents.span.ended" and d["payload"]["name"] == "checkpoint" for _, d in on_disk())
    [row] = store.list()
    assert store.get(row.execution_id).finalResponse["status"] == "success"


def test_a_run_recorded_without_model_data_is_refused_with_a_hint(store, fake, processor):
    from tracedb.errors import InvalidInputError

    wa.script(fake)
    config = wa.live_config(fake.base_url)
    config.trace_include_sensitive_data = False
    asyncio.run(Runner.run(wa.triage, wa.QUESTION, run_config=config))
    [row] = store.list()
    rec = store.get(row.execution_id)
    assert "llm.requested" not in [e.type for e in rec.events]
    with pytest.raises(InvalidInputError, match="without their input and output") as e:
        ReplayModelProvider(store, row.execution_id)
    assert "trace_include_sensitive_data" in e.value.hint


def test_a_run_on_the_chat_completions_model_is_recorded_but_not_replayed(store, fake, processor):
    import openai
    from agents import Agent, OpenAIChatCompletionsModel

    from tracedb.errors import InvalidInputError

    fake.push_chat("answered through chat completions")
    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0)
    agent = Agent(name="chatty", instructions="Answer.", model=OpenAIChatCompletionsModel("m", client))
    result = asyncio.run(Runner.run(agent, "hello"))
    [row] = store.list()
    rec = store.get(row.execution_id)
    [generation] = [e.payload for e in rec.events
                    if e.type == "agents.span.ended" and e.payload["type"] == "generation"]
    assert generation["data"]["output"][0]["content"] == result.final_output == "answered through chat completions"
    assert rec.finalResponse["payload"] == {"final_output": result.final_output, "last_agent": "chatty"}
    with pytest.raises(InvalidInputError, match="chat completions model"):
        ReplayModelProvider(store, row.execution_id)


def test_runs_inside_one_trace_are_one_execution_and_replay_run_after_run(store, fake, processor):
    from agents import trace

    wa.script(fake)
    wa.script(fake)
    questions = [wa.QUESTION, "And tomorrow? " + wa.QUESTION]

    async def live():
        with trace("Two questions"):
            return [(await Runner.run(wa.triage, q, run_config=wa.live_config(fake.base_url))).final_output
                    for q in questions]

    answers = asyncio.run(live())
    [row] = store.list()
    assert row.intent == "Two questions" and fake.request_count == 8
    provider = ReplayModelProvider(store, row.execution_id)

    async def offline():
        config = RunConfig(model_provider=provider, tracing_disabled=True)
        return [(await Runner.run(wa.triage, q, run_config=config)).final_output for q in questions]

    assert asyncio.run(offline()) == answers
    assert fake.request_count == 8 and provider.served == 8 and provider.consumed


def test_a_live_run_nests_as_a_span_tree_with_the_parent_on_every_event(store, fake, processor):
    eid, _ = live_run(store, fake)
    rec = store.get(eid)
    for e in rec.events:
        if e.type != "FINAL_RESPONSE":
            assert "span_id" in e.payload and "parent_id" in e.payload, (e.seq, e.type)
    tree = span_tree(rec.events)
    nodes = tree.walk()
    assert len(tree.roots) == 1 and not any(n.error for n in nodes)
    assert [n.name for n in nodes if n.kind == "agent"] == ["triage", "specialist"]
    # Each call sits under its agent (the SDK puts a turn span between the two), and holds
    # every event of the call: its start, request and response.
    def agent_of(n):
        while n.kind != "agent":
            n = tree.nodes[n.parent_id]
        return n.name
    calls = [(agent_of(n), n.kind, n.name, len(n.seqs)) for n in nodes if n.kind in ("llm", "tool", "handoff")]
    model = next(e.payload["request"]["model"] for e in rec.events if e.type == "llm.requested")
    assert calls == [("triage", "llm", model, 3), ("triage", "tool", "get_weather", 3),
                     ("triage", "llm", model, 3), ("triage", "handoff", "handoff → specialist", 2),
                     ("specialist", "llm", model, 3), ("specialist", "tool", "get_time", 3),
                     ("specialist", "llm", model, 3)]
    assert sorted(tree.span_of_seq) == [e.seq for e in rec.events if e.type != "FINAL_RESPONSE"]
