"""LangGraph on tracedb's log: `TraceDBSaver` against LangGraph's own conformance suite (embedded,
asyncio and through `tracedb serve`), each run of a real graph as an execution, a graph SIGKILLed
inside a node and resumed with LangGraph's own resume, time travel and `update_state` as forks,
and a thread read back after a restart and across processes.

The graphs are plain Python nodes (tests/integrations/langgraph_graph.py): no model is needed.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import subprocess
import sys
from typing import Annotated, TypedDict

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import tracedb
from tests.children import kill_when
from tests.integrations.langgraph_graph import build, ran
from tests.serving import Serve, serving
from tests.waiting import wait_until
from tracedb.client import connect, connect_async
from tracedb.config import load_config
from tracedb.errors import ExecutionNotFoundError, IntegrityError, InvalidInputError, UsageError
from tracedb.integrations.langgraph import CHECKPOINT, WRITES, TraceDBSaver, intent_of, thread_prefix
from tracedb.reads.reader import Filter, Reader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALL_CAPABILITIES = {"put", "put_writes", "get_tuple", "list", "delete_thread",
                    "delete_for_runs", "copy_thread", "prune"}


def cli(data_dir: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", data_dir, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def runs_of(data_dir: str, thread: str) -> list:
    """The thread's executions in the store, oldest first (records, judged by the read API)."""
    with Reader.open(load_config(overrides={"data_dir": data_dir})) as reader:
        rows = sorted(reader.each(Filter(intent=intent_of(thread))), key=lambda r: r.created_at_ns)
        return [reader.get(r.execution_id) for r in rows]


def assert_conformant(report) -> None:
    assert report.passed_all_base()
    detected = {name for name, r in report.results.items() if r.detected}
    assert detected == ALL_CAPABILITIES
    failed = {name: r.failures for name, r in report.results.items() if r.passed is not True}
    assert not failed, failed
    assert sum(r.tests_passed for r in report.results.values()) == 81


# -- LangGraph's conformance suite -------------------------------------------------------------


def test_the_conformance_suite_passes_on_the_embedded_store(tmp_path):
    @checkpointer_test(name="TraceDBSaver(tracedb.open)")
    async def saver():
        store = tracedb.open(str(tmp_path / "data"))
        s = TraceDBSaver(store)
        yield s
        await asyncio.to_thread(s.close)
        store.close()

    assert_conformant(asyncio.run(validate(saver)))


def test_the_conformance_suite_passes_on_the_asyncio_store(tmp_path):
    @checkpointer_test(name="TraceDBSaver(tracedb.open_async)")
    async def saver():
        store = await tracedb.open_async(str(tmp_path / "data"))
        s = TraceDBSaver(store)
        yield s
        await s.aclose()
        await store.close()

    assert_conformant(asyncio.run(validate(saver)))


def test_the_conformance_suite_passes_through_tracedb_serve(tmp_path):
    data_dir = str(tmp_path / ".tracedb")
    cfg = load_config(overrides={"data_dir": data_dir})
    with serving(data_dir) as serve:
        @checkpointer_test(name="TraceDBSaver(connect_async)")
        async def saver():
            client = await connect_async(serve.socket)
            assert not client.embedded
            s = TraceDBSaver(client, config=cfg)
            yield s
            await s.aclose()
            await client.close()

        assert_conformant(asyncio.run(validate(saver)))


# -- a graph's runs as executions --------------------------------------------------------------


def test_each_run_of_a_graph_is_an_execution_with_its_supersteps_and_final_state(tmp_path):
    data_dir, log = str(tmp_path / "data"), str(tmp_path / "log")
    config = {"configurable": {"thread_id": "chat-1"}}
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        graph = build(log).compile(checkpointer=saver)
        first = graph.invoke({"steps": ["in"]}, config)
        second = graph.invoke({"steps": ["again"]}, config)
    assert first == {"steps": ["in", "a", "b", "slow", "c"]}
    assert second["steps"] == first["steps"] + ["again", "a", "b", "slow", "c"]

    one, two = runs_of(data_dir, "chat-1")
    for rec, out in ((one, first), (two, second)):
        assert rec.execution_id.startswith("lg-chat-1.") and len(rec.execution_id) == len("lg-chat-1.") + 32
        assert rec.status == "completed" and rec.header.replayable is True
        assert rec.intent == "langgraph:chat-1" and rec.envelope["thread_id"] == "chat-1"
        assert rec.envelope["reason"] == "input"
        types = [e.type for e in rec.events]
        # the input checkpoint, one per superstep (__start__, a, b, slow, c), each step's writes
        assert types.count(CHECKPOINT) == 6 and types.count(WRITES) == 5
        assert types[-1] == "FINAL_RESPONSE"
        nodes = [e.payload["node"] for e in rec.events if e.type == WRITES]
        assert sorted(nodes) == sorted(["__start__", "a", "b", "slow", "c"])
        steps = [e.payload["step"] for e in rec.events if e.type == CHECKPOINT]
        assert sorted(steps) == list(range(steps[0], steps[0] + 6))
        assert rec.finalResponse["status"] == "success"
        assert rec.finalResponse["payload"]["values"] == out
        assert rec.finalResponse["payload"]["next"] == []
    # A new input on the thread's latest checkpoint is a new run, not a fork of the last one.
    assert two.parentExecutionId is None
    assert two.envelope["previous_execution"] == one.execution_id

    # The CLI replays a run's recorded answer: the graph's final state.
    r = cli(data_dir, "replay", two.execution_id)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["payload"]["values"] == second


def test_a_thread_reads_back_the_same_after_a_restart(tmp_path):
    data_dir, log = str(tmp_path / "data"), str(tmp_path / "log")
    config = {"configurable": {"thread_id": "t"}}
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        graph = build(log).compile(checkpointer=saver)
        graph.invoke({"steps": []}, config)
        graph.invoke({"steps": ["more"]}, config)
        before = list(saver.list(config))
        latest = saver.get_tuple(config)
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        after = list(saver.list(config))
        assert saver.get_tuple(config) == latest
        graph = build(log).compile(checkpointer=saver)
        assert graph.get_state(config).values["steps"][-1] == "c"
    assert len(before) == 12
    assert after == before  # configs, checkpoints with their values, metadata, parents, writes


def test_what_the_recorder_has_not_compacted_is_read_back_by_another_process(tmp_path):
    data_dir, log = str(tmp_path / ".tracedb"), str(tmp_path / "log")
    config = {"configurable": {"thread_id": "t"}}
    cfg = load_config(overrides={"data_dir": data_dir})
    with serving(data_dir, env={"TRACEDB_COMPACT_INTERVAL_MS": "3600000"}) as serve:
        with connect(serve.socket) as client, TraceDBSaver(client, config=cfg) as saver:
            graph = build(log).compile(checkpointer=saver)
            out = graph.invoke({"steps": []}, config)
            latest = saver.get_tuple(config)
            history = list(saver.list(config))
        # Nothing of it is in the database yet: only the recorder's WAL holds it.
        with Reader.open(cfg) as reader:
            assert list(reader.each(Filter(intent=intent_of("t")))) == []
        with connect(serve.socket) as client, TraceDBSaver(client, config=cfg) as other:
            assert other.get_tuple(config) == latest
            assert list(other.list(config)) == history
            assert other.get_tuple(config).checkpoint["channel_values"]["steps"] == out["steps"]


def test_runs_of_many_threads_at_once_on_the_asyncio_store(tmp_path):
    data_dir, log = str(tmp_path / "data"), str(tmp_path / "log")

    async def main():
        store = await tracedb.open_async(data_dir)
        async with TraceDBSaver(store) as saver:
            graph = build(log).compile(checkpointer=saver)
            outs = await asyncio.gather(*[
                graph.ainvoke({"steps": [f"t{i}"]}, {"configurable": {"thread_id": f"t{i}"}})
                for i in range(16)
            ])
            states = [await graph.aget_state({"configurable": {"thread_id": f"t{i}"}}) for i in range(16)]
        await store.close()
        return outs, states

    outs, states = asyncio.run(main())
    for i, (out, state) in enumerate(zip(outs, states)):
        assert out == {"steps": [f"t{i}", "a", "b", "slow", "c"]} == state.values
        [rec] = runs_of(data_dir, f"t{i}")
        assert rec.status == "completed" and rec.finalResponse["payload"]["values"] == out


# -- crashes, interrupts, time travel ----------------------------------------------------------


@pytest.mark.parametrize("through", ["embedded", "serve"])
def test_a_graph_killed_inside_a_node_resumes_from_its_last_durable_checkpoint(tmp_path, through):
    data_dir, log = str(tmp_path / ".tracedb"), str(tmp_path / "log")
    open(log + ".block", "w").close()
    serve = Serve(data_dir) if through == "serve" else None
    try:
        args = [data_dir, log, "job-7"] + ([serve.socket] if serve else [])
        child = subprocess.Popen([sys.executable, "-m", "tests.integrations.langgraph_graph", *args],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

        def in_slow():
            if child.poll() is not None:
                raise AssertionError(child.stderr.read().decode())
            return ran(log) == ["a", "b", "slow"]

        kill_when(child, lambda: wait_until(in_slow, 60, "the graph to enter its slow node"))
        os.remove(log + ".block")

        config = {"configurable": {"thread_id": "job-7"}}
        cfg = load_config(overrides={"data_dir": data_dir})
        recorder = connect(serve.socket) if serve else tracedb.open(data_dir)
        with recorder, TraceDBSaver(recorder, config=cfg) as saver:
            graph = build(log).compile(checkpointer=saver)
            assert graph.get_state(config).next == ("slow",)
            out = graph.invoke(None, config)  # LangGraph's own resume
            # Before the recorder closes (which would mark anything left running incomplete):
            # the resume itself marked the killed run incomplete.
            with pytest.raises(ExecutionNotFoundError):
                recorder.get("no-such-execution")  # a get compacts everything durable first
            killed_now = runs_of(data_dir, "job-7")[0]
            assert killed_now.status == "incomplete" and killed_now.header.replayable is False
        assert out == {"steps": ["a", "b", "slow", "c"]}
        # a and b ran once: no completed superstep was lost; only the killed node ran again.
        assert ran(log) == ["a", "b", "slow", "slow", "c"]
    finally:
        if serve is not None:
            code, err = serve.terminate()
            assert code == 0, err

    killed, resumed = runs_of(data_dir, "job-7")
    assert killed.status == "incomplete" and killed.header.replayable is False
    assert killed.header.replayableReason == "execution_incomplete"
    assert resumed.status == "completed" and resumed.envelope["reason"] == "resume"
    # The fork point is the killed run's last checkpoint: the one the resume started from.
    last = [e for e in killed.events if e.type == CHECKPOINT][-1]
    assert last.payload["next"] == ["slow"]
    assert (resumed.parentExecutionId, resumed.forkedAtSeq) == (killed.execution_id, last.seq)
    assert cli(data_dir, "replay", killed.execution_id).returncode == 6
    lineage = cli(data_dir, "trace", "lineage", resumed.execution_id)
    assert lineage.returncode == 0, lineage.stderr
    assert f"forked at seq {last.seq} from {killed.execution_id}" in lineage.stdout


def test_time_travel_and_update_state_are_forks_in_the_lineage(tmp_path):
    data_dir, log = str(tmp_path / "data"), str(tmp_path / "log")
    config = {"configurable": {"thread_id": "tt"}}
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        graph = build(log).compile(checkpointer=saver)
        graph.invoke({"steps": []}, config)
        after_a = next(s for s in graph.get_state_history(config) if s.next == ("b",))
        again = graph.invoke(None, after_a.config)  # from an earlier checkpoint
        updated = graph.update_state(config, {"steps": ["edited"]})
    assert again == {"steps": ["a", "b", "slow", "c"]}

    first, travelled, update = runs_of(data_dir, "tt")
    cid = after_a.config["configurable"]["checkpoint_id"]
    # The fork point: the last record of that checkpoint in the first run (it, or b's writes on it).
    at = max(e.seq for e in first.events if e.type in (CHECKPOINT, WRITES) and e.payload["checkpoint_id"] == cid)
    assert travelled.envelope["reason"] == "fork" and travelled.envelope["from_checkpoint"] == cid
    assert (travelled.parentExecutionId, travelled.forkedAtSeq) == (first.execution_id, at)
    assert update.envelope["reason"] == "update" and update.status == "completed"
    assert update.parentExecutionId == travelled.execution_id
    assert [e.payload["checkpoint_id"] for e in update.events if e.type == CHECKPOINT] == [
        updated["configurable"]["checkpoint_id"]]

    r = cli(data_dir, "trace", "lineage", first.execution_id, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["forks"] == [{"execution_id": travelled.execution_id, "forked_at_seq": at}]


class Ask(TypedDict):
    answers: Annotated[list, operator.add]


def asking_graph():
    def ask(state: Ask) -> dict:
        return {"answers": [interrupt("name?")]}

    g = StateGraph(Ask)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


def test_an_interrupted_run_is_finished_as_interrupted_and_its_resume_links_to_it(tmp_path):
    data_dir = str(tmp_path / "data")
    config = {"configurable": {"thread_id": "hitl"}}
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        graph = asking_graph().compile(checkpointer=saver)
        paused = graph.invoke({"answers": []}, config)
        assert paused["__interrupt__"][0].value == "name?"
        store.compact()
        [waiting] = runs_of(data_dir, "hitl")
        assert waiting.status == "running"  # until the thread's next run, or the saver closes
        done = graph.invoke(Command(resume="Ada"), config)
    assert done == {"answers": ["Ada"]}
    asked, answered = runs_of(data_dir, "hitl")
    assert asked.finalResponse["status"] == "interrupted" and asked.header.replayable is True
    assert asked.finalResponse["payload"]["interrupts"][0]["value"] == "name?"
    assert answered.finalResponse["status"] == "success"
    assert answered.parentExecutionId == asked.execution_id


def test_closing_the_saver_finishes_a_run_waiting_on_an_interrupt(tmp_path):
    data_dir = str(tmp_path / "data")
    config = {"configurable": {"thread_id": "wait"}}
    with tracedb.open(data_dir) as store:
        with TraceDBSaver(store) as saver:
            asking_graph().compile(checkpointer=saver).invoke({"answers": []}, config)
        store.compact()
        [rec] = runs_of(data_dir, "wait")
    assert rec.status == "completed" and rec.finalResponse["status"] == "interrupted"


# -- values, redaction, the extra --------------------------------------------------------------


class Secretive(TypedDict):
    password: str
    pair: tuple


def secretive_graph() -> StateGraph:
    """One node, whose output holds the state's password (a key the store's rules redact)."""
    g = StateGraph(Secretive)
    g.add_node("n", lambda s: {"pair": (s["password"], 2)})
    g.add_edge(START, "n")
    g.add_edge("n", END)
    return g


def test_state_the_store_would_redact_is_recorded_so_that_it_reads_back_exactly(tmp_path):
    data_dir = str(tmp_path / "data")
    g = secretive_graph()
    config = {"configurable": {"thread_id": "s"}}
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        graph = g.compile(checkpointer=saver)
        out = graph.invoke({"password": "hunter2", "pair": (1, 2)}, config)
        before = graph.get_state(config).values
    assert out == {"password": "hunter2", "pair": ("hunter2", 2)}
    assert before["password"] == "hunter2"
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        assert g.compile(checkpointer=saver).get_state(config).values == before
    [rec] = runs_of(data_dir, "s")
    # The key rule would rewrite the checkpoints' values: they are recorded in LangGraph's typed
    # form, with no channel name as a key, and read back exactly.
    text = json.dumps([e.payload for e in rec.events if e.type == CHECKPOINT])
    assert "hunter2" not in text and '"password":' not in text
    assert rec.redacted_paths() == {"finalResponse": ["$.payload.values.password"]}


def test_plain_values_are_readable_json_and_others_the_serializers_typed_form(tmp_path):
    data_dir, log = str(tmp_path / "data"), str(tmp_path / "log")
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        build(log).compile(checkpointer=saver).invoke({"steps": [("t", 1)]}, {"configurable": {"thread_id": "v"}})
    [rec] = runs_of(data_dir, "v")
    first = rec.events[0].payload
    assert first["source"] == "input" and first["next"] == ["__start__"]
    assert "__start__" in first["typed"]  # a tuple is not JSON: LangGraph's serializer writes it
    last = [e.payload for e in rec.events if e.type == CHECKPOINT][-1]
    assert "steps" in last["typed"] and "steps" not in last["values"]
    writes = [e.payload for e in rec.events if e.type == WRITES and e.payload["node"] == "a"][0]
    assert writes["writes"][0][1:] == ["steps", ["a"]]


def test_importing_the_integration_without_the_extra_names_it():
    code = ("import sys; sys.modules['langgraph'] = None\n"
            "from tracedb.errors import ExtraNotInstalledError\n"
            "try:\n"
            "    import tracedb.integrations.langgraph\n"
            "except ExtraNotInstalledError as e:\n"
            "    print(e.message); print(e.hint)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    message, hint = r.stdout.splitlines()
    assert message.startswith("tracedb.integrations.langgraph needs the langgraph extra (langgraph")
    assert message.endswith(" is not installed)")
    assert hint.startswith("install the langgraph extra: `scripts/setup langgraph`")


def test_a_client_reading_with_other_redaction_rules_than_the_recorders_refuses_the_thread(tmp_path):
    data_dir = str(tmp_path / "data")
    g = secretive_graph()
    config = {"configurable": {"thread_id": "s"}}
    # The saver is told of no redaction; the store records with its default rules (a key
    # named password), so what it recorded cannot be read back as LangGraph saved it.
    unaware = load_config(overrides={"data_dir": data_dir, "redact": False})
    with connect(data_dir=data_dir, embedded=True) as client:
        with TraceDBSaver(client, config=unaware) as saver:
            g.compile(checkpointer=saver).invoke({"password": "hunter2", "pair": (1, 2)}, config)
        with TraceDBSaver(client, config=unaware) as fresh:
            with pytest.raises(IntegrityError, match="rewritten by the store's \\[redaction\\] rules") as e:
                fresh.get_tuple(config)
    assert "EncryptedSerializer" in e.value.hint
    # Told of the same rules the store applies, a client's saver records so that it reads back.
    aware = load_config(overrides={"data_dir": data_dir})
    with connect(data_dir=data_dir, embedded=True) as client:
        with TraceDBSaver(client, config=aware) as saver:
            g.compile(checkpointer=saver).invoke({"password": "hunter2", "pair": (1, 2)}, {"configurable": {"thread_id": "s2"}})
        with TraceDBSaver(client, config=aware) as fresh:
            assert fresh.get_tuple({"configurable": {"thread_id": "s2"}}).checkpoint["channel_values"]["password"] == "hunter2"


# -- sync and async calls, memory, listing, thread operations ------------------------------------


def test_an_asyncio_recorder_serves_sync_calls_from_another_thread_and_refuses_its_own_loop(tmp_path):
    data_dir, log = str(tmp_path / "data"), str(tmp_path / "log")
    config = {"configurable": {"thread_id": "x"}}

    async def main():
        store = await tracedb.open_async(data_dir)
        async with TraceDBSaver(store) as saver:
            graph = build(log).compile(checkpointer=saver)
            out = await asyncio.to_thread(graph.invoke, {"steps": []}, config)  # sync, on a worker thread
            with pytest.raises(UsageError, match="would block it"):
                saver.get_tuple(config)
            state = await graph.aget_state(config)
        await store.close()
        return out, state

    out, state = asyncio.run(main())
    assert out == state.values == {"steps": ["a", "b", "slow", "c"]}
    [rec] = runs_of(data_dir, "x")
    assert rec.status == "completed"


def test_a_thread_dropped_from_memory_is_read_again_with_what_others_recorded_meanwhile(tmp_path):
    data_dir, log = str(tmp_path / "data"), str(tmp_path / "log")
    one, two = {"configurable": {"thread_id": "one"}}, {"configurable": {"thread_id": "two"}}
    with tracedb.open(data_dir) as store:
        small = TraceDBSaver(store, max_threads=1)
        other = TraceDBSaver(store)
        build(log).compile(checkpointer=small).invoke({"steps": []}, one)
        assert small.get_tuple(one).checkpoint["channel_values"]["steps"] == ["a", "b", "slow", "c"]
        build(log).compile(checkpointer=small).invoke({"steps": []}, two)  # "one" leaves memory
        build(log).compile(checkpointer=other).invoke({"steps": ["again"]}, one)
        steps = small.get_tuple(one).checkpoint["channel_values"]["steps"]
        big = TraceDBSaver(store)
        big.get_tuple(one)
        build(log).compile(checkpointer=other).invoke({"steps": ["third"]}, one)
        stale = big.get_tuple(one).checkpoint["channel_values"]["steps"]  # kept in memory: not re-read
    assert steps == ["a", "b", "slow", "c", "again", "a", "b", "slow", "c"]
    assert stale == steps


def test_listing_every_thread_and_deleting_a_thread_hold_after_a_restart(tmp_path):
    data_dir, log = str(tmp_path / "data"), str(tmp_path / "log")
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        graph = build(log).compile(checkpointer=saver)
        for t in ("p", "q", "r"):
            graph.invoke({"steps": []}, {"configurable": {"thread_id": t}})
        saver.delete_thread("q")
        saver.copy_thread("p", "p2")
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        threads = {tup.config["configurable"]["thread_id"] for tup in saver.list(None)}
        assert threads == {"p", "r", "p2"}
        assert saver.get_tuple({"configurable": {"thread_id": "q"}}) is None
        assert len(list(saver.list({"configurable": {"thread_id": "p2"}}))) == 6
    ran_q, deleted = runs_of(data_dir, "q")
    assert ran_q.status == "completed" and len(ran_q.events) == 12  # still in tracedb
    assert deleted.envelope["reason"] == "delete"
    assert [(e.type, e.payload) for e in deleted.events[:-1]] == [("langgraph.deleted", {"scope": "thread"})]
    [p] = runs_of(data_dir, "p")
    [copy] = runs_of(data_dir, "p2")
    assert copy.envelope["reason"] == "copy" and copy.envelope["from_thread"] == "p"
    assert (copy.parentExecutionId, copy.forkedAtSeq) == (p.execution_id, max(
        e.seq for e in p.events if e.type in (CHECKPOINT, WRITES)
        and e.payload["checkpoint_id"] == copy.events[-2].payload["checkpoint_id"]))


class Count(TypedDict):
    n: int


def test_a_run_stopped_by_an_error_or_a_breakpoint_is_finished_when_the_thread_goes_on(tmp_path):
    data_dir = str(tmp_path / "data")

    def flaky(state: Count) -> dict:
        if state["n"] == 0:
            raise ValueError("no zero")
        return {"n": state["n"] + 1}

    g = StateGraph(Count)
    g.add_node("flaky", flaky)
    g.add_node("after", lambda s: {"n": s["n"] * 10})
    g.add_edge(START, "flaky")
    g.add_edge("flaky", "after")
    g.add_edge("after", END)
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        graph = g.compile(checkpointer=saver)
        with pytest.raises(ValueError):
            graph.invoke({"n": 0}, {"configurable": {"thread_id": "e"}})
        assert graph.invoke({"n": 1}, {"configurable": {"thread_id": "e"}}) == {"n": 20}
        paused = g.compile(checkpointer=saver, interrupt_before=["after"])
        assert paused.invoke({"n": 1}, {"configurable": {"thread_id": "b"}}) == {"n": 2}
        assert paused.invoke(None, {"configurable": {"thread_id": "b"}}) == {"n": 20}
    failed, fixed = runs_of(data_dir, "e")
    assert failed.finalResponse["status"] == "error"
    assert "no zero" in json.dumps(failed.finalResponse["payload"]["error"])
    assert fixed.finalResponse["status"] == "success" and fixed.parentExecutionId is None
    stopped, resumed = runs_of(data_dir, "b")
    assert stopped.finalResponse["status"] == "stopped"
    assert stopped.finalResponse["payload"]["next"] == ["after"]
    assert resumed.parentExecutionId == stopped.execution_id


def test_writes_that_come_after_their_runs_last_checkpoint_go_into_a_new_run(tmp_path):
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

    data_dir = str(tmp_path / "data")
    base = {"configurable": {"thread_id": "late", "checkpoint_ns": ""}}
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        first = generate_checkpoint()
        first["updated_channels"] = ["branch:to:work"]
        c1 = saver.put(base, first, generate_metadata("input", -1), {})
        last = generate_checkpoint()
        last["updated_channels"] = ["result"]  # triggers no node: the run is over
        saver.put({"configurable": dict(base["configurable"], checkpoint_id=c1["configurable"]["checkpoint_id"])},
                  last, generate_metadata("loop", 0), {})
        saver.put_writes(c1, [("result", 1)], "task-1", "~__pregel_pull, work")
        assert saver.get_tuple(c1).pending_writes == [("task-1", "result", 1)]
    run, late = runs_of(data_dir, "late")
    assert run.status == "completed" and [e.type for e in run.events] == [CHECKPOINT, CHECKPOINT, "FINAL_RESPONSE"]
    assert late.envelope["reason"] == "update" and [e.type for e in late.events] == [WRITES, "FINAL_RESPONSE"]


@pytest.mark.parametrize("thread", ["user 7 / chät", "a", "a-b", "x" * 65])
def test_any_thread_id_names_its_runs_and_reads_back_alone(tmp_path, thread):
    data_dir, log = str(tmp_path / "data"), str(tmp_path / "log")
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        graph = build(log).compile(checkpointer=saver)
        for t in dict.fromkeys(("a", "a-b", thread)):  # threads whose ids prefix one another
            graph.invoke({"steps": [t]}, {"configurable": {"thread_id": t}})
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        state = build(log).compile(checkpointer=saver).get_state({"configurable": {"thread_id": thread}})
        assert state.values == {"steps": [thread, "a", "b", "slow", "c"]}
        assert len(list(saver.list({"configurable": {"thread_id": thread}}))) == 6
    runs = runs_of(data_dir, thread)
    prefix = thread_prefix(thread)
    assert len(runs) == 1
    assert all(r.execution_id.startswith(prefix) and r.envelope["thread_id"] == thread for r in runs)
    if thread in ("a", "a-b"):
        assert prefix == f"lg-{thread}."
    else:  # not a plain id: a digest names it
        assert prefix.startswith("lg-:") and len(prefix) == len("lg-:.") + 32


def test_a_run_waiting_past_the_idle_timeout_is_incomplete_and_its_resume_links_to_it(tmp_path):
    data_dir = str(tmp_path / "data")
    config = {"configurable": {"thread_id": "slowpoke"}}
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        graph = asking_graph().compile(checkpointer=saver)
        graph.invoke({"answers": []}, config)
        # The store's idle sweeper, an hour (its default idle_timeout_s) and more later.
        assert store.sweep_idle(now_ns=store.clock() + 2 * 3600 * 10**9) == 1
        assert graph.invoke(Command(resume="Ada"), config) == {"answers": ["Ada"]}
    asked, answered = runs_of(data_dir, "slowpoke")
    assert asked.status == "incomplete" and asked.header.replayable is False
    assert answered.status == "completed" and answered.parentExecutionId == asked.execution_id


def test_deleting_runs_reaches_threads_read_from_the_store(tmp_path):
    data_dir, log = str(tmp_path / "data"), str(tmp_path / "log")
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        graph = build(log).compile(checkpointer=saver)
        graph.invoke({"steps": []}, {"configurable": {"thread_id": "r"}, "metadata": {"run_id": "run-1"}})
        graph.invoke({"steps": []}, {"configurable": {"thread_id": "r"}, "metadata": {"run_id": "run-2"}})
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        saver.delete_for_runs(["run-1"])  # the thread is not in this saver's memory yet
        left = {t.metadata["run_id"] for t in saver.list({"configurable": {"thread_id": "r"}})}
    assert left == {"run-2"}
    one, two, deleted = runs_of(data_dir, "r")
    assert (one.envelope["run_id"], two.envelope["run_id"]) == ("run-1", "run-2")
    assert deleted.envelope["reason"] == "delete" and len(deleted.events[0].payload["checkpoints"]) == 6


def test_a_serializer_of_ones_own_writes_every_value(tmp_path):
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    data_dir, log = str(tmp_path / "data"), str(tmp_path / "log")
    config = {"configurable": {"thread_id": "own"}}
    with tracedb.open(data_dir) as store, TraceDBSaver(store, serde=JsonPlusSerializer()) as saver:
        out = build(log).compile(checkpointer=saver).invoke({"steps": []}, config)
    with tracedb.open(data_dir) as store, TraceDBSaver(store, serde=JsonPlusSerializer()) as saver:
        assert build(log).compile(checkpointer=saver).get_state(config).values == out
    [rec] = runs_of(data_dir, "own")
    for e in rec.events:
        if e.type == CHECKPOINT:
            assert e.payload["values"] == {} and "metadata_typed" in e.payload
        elif e.type == WRITES:
            assert all(value is None for _, _, value in e.payload["writes"])


def test_a_checkpoint_the_rules_would_rewrite_in_any_form_is_refused(tmp_path):
    data_dir, log = str(tmp_path / "data"), str(tmp_path / "log")
    cfg = tmp_path / "tracedb.toml"
    cfg.write_text("[redaction]\npatterns = ['[A-Za-z0-9]{3}']\n")  # matches base64 text too
    with tracedb.open(data_dir, config=str(cfg)) as store, TraceDBSaver(store) as saver:
        with pytest.raises(InvalidInputError, match="would rewrite"):
            build(log).compile(checkpointer=saver).invoke({"steps": []}, {"configurable": {"thread_id": "no"}})


def test_functional_api_runs_finish_with_their_return_value(tmp_path):
    from langgraph.func import entrypoint, task

    data_dir = str(tmp_path / "data")
    with tracedb.open(data_dir) as store, TraceDBSaver(store) as saver:
        @task
        def double(x: int) -> int:
            return 2 * x

        @entrypoint(checkpointer=saver)
        def flow(x: int) -> int:
            return double(x).result() + 1

        assert flow.invoke(5, {"configurable": {"thread_id": "f"}}) == 11
        store.compact()
        [rec] = runs_of(data_dir, "f")
    assert rec.status == "completed" and rec.finalResponse["status"] == "success"
