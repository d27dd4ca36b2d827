"""The read API the web view stands on, on SQLite: counts per status, the replayable filter,
progress after a seq (the live view), one event, diff and lineage through the async reader, and
the timeline layout (calls paired as replay pairs them, the stop of an incomplete execution)."""

from __future__ import annotations

import asyncio

import pytest

import tracedb
from tracedb.config import load_config
from tracedb.reads.reader import AsyncReader, Filter, Reader
from tracedb.web.timeline import layout


def _cfg(data_dir):
    return load_config(overrides={"data_dir": data_dir})


def test_counts_per_status_leave_the_status_filter_out_and_keep_the_others(web_store):
    data_dir, ids = web_store
    with Reader.open(_cfg(data_dir)) as r:
        every = r.status_counts()
        assert every == {"running": 0, "completed": 6, "incomplete": 1, "invalidated": 1}
        # The status filter is left out: a listing shows every status next to the one chosen.
        assert r.status_counts(Filter(status="completed")) == every
        assert r.status_counts(Filter(intent="AnswerQuestion")) == {
            "running": 0, "completed": 3, "incomplete": 1, "invalidated": 0}
        assert r.status_counts(Filter(search="summar")) == {
            "running": 0, "completed": 0, "incomplete": 0, "invalidated": 1}
        assert sum(r.status_counts(Filter(replayable=False)).values()) == r.count(Filter(replayable=False)) == 2
        # Bounded counts stop one past the bound ("more than"), and agree below it.
        assert r.status_counts(at_most=2) == {"running": 0, "completed": 3, "incomplete": 1, "invalidated": 1}
        assert r.status_counts(Filter(intent="AnswerQuestion"), at_most=100) == r.status_counts(
            Filter(intent="AnswerQuestion"))


def test_the_replayable_filter(web_store):
    data_dir, ids = web_store
    with Reader.open(_cfg(data_dir)) as r:
        no = {s.execution_id for s in r.page(Filter(replayable=False)).items}
        yes = {s.execution_id for s in r.page(Filter(replayable=True)).items}
    assert no == {ids["crashed"], ids["invalidated"]}
    # A failure recorded in full replays: the failed execution and the OTel trace with a failed call too.
    assert yes == {ids["ok"], ids["other"], ids["fork"], ids["xss"], ids["failed"], ids["otel"]}
    with pytest.raises(tracedb.TraceDBError):
        Filter(replayable="yes").apply(None)


def test_progress_gives_the_status_and_the_events_after_a_seq(web_store):
    data_dir, ids = web_store
    with Reader.open(_cfg(data_dir)) as r:
        p = r.progress(ids["crashed"], 2)
        assert (p.status, p.replayable, p.replayable_reason, p.last_seq) == (
            "incomplete", False, "execution_incomplete", 4)
        assert [(e.seq, e.type) for e in p.events] == [(3, "llm.responded"), (4, "tool.requested")]
        assert p.events[1].payload == {"name": "fx_rate", "arguments": {"pair": "EUR/USD"}}
        assert r.progress(ids["crashed"], 4).events == ()
        assert len(r.progress(ids["ok"], 0, limit=2).events) == 2
        with pytest.raises(tracedb.ExecutionNotFoundError):
            r.progress("exec-nope", 0)
        ev = r.event(ids["crashed"], 4)
        assert (ev.seq, ev.type) == (4, "tool.requested") and ev.recorded_at_ns > 0
        with pytest.raises(tracedb.ExecutionNotFoundError):
            r.event(ids["crashed"], 99)


def test_the_async_reader_answers_what_the_sync_one_does(web_store):
    data_dir, ids = web_store
    cfg = _cfg(data_dir)

    async def read():
        async with await AsyncReader.open(cfg) as r:
            return (
                await r.status_counts(Filter(intent="AnswerQuestion")),
                await r.count(Filter(replayable=False)),
                await r.progress(ids["crashed"], 1),
                await r.event(ids["ok"], 2),
                await r.diff(ids["ok"], ids["other"]),
                await r.lineage(ids["fork"]),
                await r.lineage(ids["ok"]),
            )

    counts, n, progress, event, diff, fork_lineage, parent_lineage = asyncio.run(read())
    with Reader.open(cfg) as s:
        assert counts == s.status_counts(Filter(intent="AnswerQuestion"))
        assert n == s.count(Filter(replayable=False)) == 2
        assert progress == s.progress(ids["crashed"], 1)
        assert event == s.event(ids["ok"], 2)
        assert diff.to_dict() == s.diff(ids["ok"], ids["other"]).to_dict()
        assert fork_lineage == s.lineage(ids["fork"])
    assert not diff.identical
    assert fork_lineage.ancestors == ((ids["ok"], 3),)
    assert parent_lineage.forks == ((ids["fork"], 3),)


def test_the_layout_pairs_calls_and_marks_where_an_incomplete_execution_stopped(web_store):
    data_dir, ids = web_store
    with Reader.open(_cfg(data_dir)) as r:
        done = layout(r.timeline(ids["ok"]))
        crashed = layout(r.timeline(ids["crashed"]))
        running_like = r.timeline(ids["xss"])
    # INTENT_RECEIVED, llm.req, llm.resp, tool.req, tool.resp, llm.req, llm.resp, FINAL_RESPONSE
    assert [(b.kind, b.request_seq, b.response_seq) for b in done.bars] == [
        ("llm", 2, 3), ("tool", 4, 5), ("llm", 6, 7)]
    assert all(b.duration_ns == 7_000_000 for b in done.bars)  # the clock steps 7 ms per event
    assert done.bars[1].label == "calculator" and done.bars[0].label == "demo-llm-1"
    assert done.stopped_at is None
    assert crashed.stopped_at is not None and (crashed.stopped_at.seq, crashed.stopped_at.type) == (4, "tool.requested")
    open_bar = [b for b in crashed.bars if b.response_seq is None]
    assert [(b.kind, b.request_seq, b.end_ns) for b in open_bar] == [("tool", 4, None)]
    assert crashed.t1 > crashed.stopped_at.at_ns  # room after the stop for the open bar
    assert layout(running_like).stopped_at is None


def test_calls_pair_as_event_log_replay_pairs_them():
    from tracedb.records.record import ExecutionEvent
    from tracedb.replay import EventLog, args_hash
    from tracedb.web.timeline import pair_calls

    def ev(seq, type_, payload):
        return ExecutionEvent(seq=seq, type=type_, payload=payload)

    events = [
        ev(1, "tool.requested", {"name": "a", "arguments": {"x": 1}}),
        ev(2, "tool.requested", {"name": "b", "arguments": {"x": 2}}),
        ev(3, "llm.requested", {"request": {"model": "m", "messages": []}}),
        # No request_seq: paired by key (b's arguments), not by order.
        ev(4, "tool.responded", {"name": "b", "args_hash": args_hash({"x": 2}), "response": 2}),
        ev(5, "llm.responded", {"request_seq": 3, "response": {}}),
        ev(6, "tool.responded", {"name": "zzz", "response": 1}),  # no key match: the first unanswered
        ev(7, "tool.requested", {"name": "c", "args_hash": "h"}),
        ev(8, "llm.responded", {"request_seq": 3}),  # nothing left to answer
        ev(9, "tool.requested", {"name": "d"}),
        ev(10, "tool.responded", {"name": "d", "request_seq": 9}),
    ]
    ours = [(c.kind, c.request_seq, c.response_seq) for c in pair_calls(events)]
    theirs = [(c.kind, c.request_seq, c.response_seq) for c in EventLog(events).calls]
    assert ours == theirs
    assert ours == [("tool", 1, 6), ("tool", 2, 4), ("llm", 3, 5), ("tool", 7, None), ("tool", 9, 10)]
