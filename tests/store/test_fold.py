"""One fold of WAL records into rows (tracedb.records.fold), two consumers: the compactor, which writes the
rows, and the read of what only the WAL holds (tracedb.reads.wal_tail), which shows them. The same WAL
through both gives the same rows and steps: a second start of an id, router decisions, finishes,
status changes, error outcomes, usage and cost, a row another recorder owns; whether the database
holds none of it yet or the first part of it, whether the event frames carry the payloads' facts
(as the store writes them) or not (a WAL written before they did), and whether the compactor
splits the frames itself or is handed them (the live store's hints)."""

from __future__ import annotations

import os

import orjson
import pytest
import sqlalchemy as sa

import wal
from tracedb.projection import db
from tracedb.reads import wal_tail as pending
from tracedb.records.codec import (
    OP_INCOMPLETE,
    OP_INVALIDATE,
    OP_RECORDING_FAILURE,
    encode_event,
    encode_finish,
    encode_start,
    encode_status,
    is_event,
    split_event,
)
from tracedb.projection.compactor import Compactor
from tracedb.config import load_config
from tracedb.records.fold import STEP_COLUMNS, close_left_running, fold, new_row, read_record
from tracedb.projection.models import trace_steps, traces
from tracedb.records.outcomes import event_facts
from tracedb.records.record import compute_envelope_hash

RECORDER = "rec-fold"
OTHER = "rec-other"
FOLD_COLUMNS = tuple(new_row({"id": "x", "envelope": {}, "hash": "h", "t": 0}, RECORDER))


class Log:
    """WAL records of a made-up recording, each event at a time of its own; `framed`: event
    frames carry their payload's facts, as the store writes them."""

    def __init__(self, framed: bool = False):
        self.framed = framed
        self.records: list[bytes] = []
        self.t = 1_700_000_000 * 10**9
        self.seqs: dict = {}

    def tick(self) -> int:
        self.t += 1_000_000
        return self.t

    def start(self, eid: str, envelope: dict, **kw) -> None:
        self.seqs[eid] = 1
        self.records.append(encode_start(eid, "Ask", envelope, compute_envelope_hash(envelope), self.tick(), **kw))

    def event(self, eid: str, type_: str, payload) -> None:
        seq = self.seqs[eid]
        self.seqs[eid] = seq + 1
        pj = orjson.dumps(payload)
        facts = event_facts(type_, pj, payload) if self.framed else None
        self.records.append(encode_event(eid, seq, type_, pj, self.tick(), facts))

    def finish(self, eid: str, response: dict) -> None:
        self.records.append(encode_finish(eid, self.seqs[eid], response, self.tick()))

    def status(self, op: str, eid: str, text: str) -> None:
        self.records.append(encode_status(op, eid, text, self.tick()))


def recording(framed: bool = False) -> list[bytes]:
    log = Log(framed)
    log.start("ex-failed", {"n": 1})
    log.event("ex-failed", "ROUTER_DECISION", {"agent": "planner", "reason": "first"})
    log.event("ex-failed", "llm.responded",
              {"response": {"model": "gpt-4o-mini", "usage": {"input_tokens": 1000, "output_tokens": 500}}})
    log.start("ex-reused", {"run": "first"})  # interleaved with the others
    log.event("ex-reused", "tool.requested", {"run": "first"})
    log.event("ex-failed", "tool.responded", {"name": "search", "error": {"code": "TOOL_TIMEOUT", "message": "took 30 s"}})
    log.event("ex-failed", "ROUTER_DECISION", {"agent": "writer", "reason": "second"})
    log.event("ex-reused", "llm.responded",
              {"response": {"model": "gpt-4o", "usage": {"prompt_tokens": 10, "completion_tokens": 20}}})
    log.finish("ex-reused", {"answer": "first"})
    log.finish("ex-failed", {"status": "error", "error": {"code": "TOOL_TIMEOUT"}})
    log.start("ex-unpriced", {"n": 2})
    log.event("ex-unpriced", "llm.responded",
              {"response": {"model": "my-own-model", "usage": {"input_tokens": 7, "output_tokens": 3}}})
    log.event("ex-unpriced", "llm.responded",
              {"response": {"model": "gpt-4o-mini", "usage": {"input_tokens": 5, "output_tokens": 5}}})
    log.status(OP_INCOMPLETE, "ex-unpriced", "stopped")
    log.start("ex-flagged", {"n": 3}, meta={"source": "test"})
    log.event("ex-flagged", "http.responded", {"response": {"status": 503, "body": {"error": {"message": "busy"}}}})
    log.status(OP_RECORDING_FAILURE, "ex-flagged", "a write was lost")
    log.finish("ex-flagged", {"status": "success"})  # finishes, stays flagged
    log.start("ex-invalid", {"n": 4})
    log.event("ex-invalid", "tool.requested", {"q": 1})
    log.status(OP_INVALIDATE, "ex-invalid", "bad data")
    log.status(OP_INCOMPLETE, "ex-invalid", "too late")  # changes nothing now
    # The id used again (its first execution pruned before): the newer start replaces it.
    log.start("ex-reused", {"run": "second"})
    log.event("ex-reused", "ROUTER_DECISION", {"agent": "again"})
    log.event("ex-reused", "llm.responded",
              {"response": {"model": "gpt-4o-mini", "usage": {"input_tokens": 3, "output_tokens": 4}}})
    log.finish("ex-reused", {"answer": "second"})
    log.start("ex-fork", {"n": 5}, parent_execution_id="ex-failed", forked_at_seq=2)
    log.event("ex-fork", "tool.responded", {"status": "failed", "message": "no"})
    # Another recorder's execution: invalidation and recording_failure cross recorders.
    log.status(OP_RECORDING_FAILURE, "ex-theirs", "flagged by this recorder")
    log.start("ex-left", {"n": 6})  # left running: the read shows it as recovery will close it
    log.event("ex-left", "llm.responded",
              {"response": {"model": "gpt-4o-mini", "usage": {"input_tokens": 11, "output_tokens": 1}}})
    return log.records


def write_wal(wal_dir: str, records: list[bytes]) -> None:
    log = wal.open_wal(wal_dir, preallocate=False)
    try:
        log.append_many(records)
    finally:
        log.close()


def compact(engine, wal_dir: str, recorder: str, from_lsn: int, to_lsn: int, hinted: bool, records=None) -> None:
    source = None
    if hinted:
        def source(first: int, n: int, to: int):
            out = []
            for lsn in range(first, min(to, first + n - 1) + 1):
                raw = records[lsn - 1]
                frame = None
                if is_event(raw):  # as the store hands it over: frame and derived facts
                    frame = split_event(raw)
                    body = raw[frame.payload_offset :]
                    frame = frame._replace(facts=event_facts(frame.type, body, orjson.loads(body)))
                out.append((lsn, raw, frame))
            return out
    comp = Compactor(engine, wal_dir, recorder, from_lsn, batch_records=4, source=source)
    try:
        assert comp.compact(to_lsn).applied_lsn == to_lsn
    finally:
        comp.close()


def db_rows(engine) -> dict:
    with engine.connect() as conn:
        return {r.execution_id: {k: getattr(r, k) for k in FOLD_COLUMNS} for r in conn.execute(sa.select(traces))}


def db_steps(engine) -> dict:
    out: dict = {}
    cols = [trace_steps.c[k] for k in STEP_COLUMNS]
    with engine.connect() as conn:
        for r in conn.execute(sa.select(*cols).order_by(trace_steps.c.lsn)):
            out.setdefault(r[0], []).append((r[1], r[2], r[3], r[4], r[5]))
    return out


def comparable(row: dict) -> dict:
    out = {k: row[k] for k in FOLD_COLUMNS}
    if out["cost_usd"] is not None:
        out["cost_usd"] = pytest.approx(out["cost_usd"], rel=1e-12)
    return out


@pytest.fixture
def store_dir(tmp_path):
    d = str(tmp_path / "data")
    os.makedirs(d)
    with open(os.path.join(d, "RECORDER_ID"), "w", encoding="ascii") as f:
        f.write(RECORDER)
    engine = db.create_engine(os.path.join(d, "traces.db"), write=True)
    db.migrate(engine)
    db.ensure_checkpoint(engine, RECORDER, 0)
    # ex-theirs, started by another recorder into the same database.
    db.ensure_checkpoint(engine, OTHER, 0)
    theirs = str(tmp_path / "other-wal")
    write_wal(theirs, [encode_start("ex-theirs", "Theirs", {}, compute_envelope_hash({}), 5)])
    compact(engine, theirs, OTHER, 0, 1, False)
    yield d, engine
    engine.dispose()


# Where the database stops before the read: nothing applied; inside the first ex-reused; right
# before its second start; right after it; all but the last record.
@pytest.mark.parametrize("applied", [0, 6, 22, 23, len(recording()) - 1])
@pytest.mark.parametrize("frames", ["bare", "framed", "hinted"])
def test_the_pending_read_and_compaction_fold_the_same_rows(store_dir, applied, frames):
    data_dir, engine = store_dir
    records = recording(framed=frames != "bare")
    hinted = frames == "hinted"
    wal_dir = os.path.join(data_dir, "wal")
    write_wal(wal_dir, records)
    compact(engine, wal_dir, RECORDER, 0, applied, hinted, records)
    steps_before = db_steps(engine)

    view = pending.load(load_config(overrides={"data_dir": data_dir}), engine)
    assert view.applied_lsn == applied and view.uncompacted_records == len(records) - applied

    compact(engine, wal_dir, RECORDER, applied, len(records), hinted, records)
    rows = db_rows(engine)
    steps = db_steps(engine)

    assert view.left_running == ("ex-fork", "ex-left")
    for eid in view.left_running:
        close_left_running(rows[eid], pending.NO_RECORDER_NOTE)  # what `recover` does
    changed = {eid for eid in rows if eid in view.rows}
    for eid in changed:
        assert comparable(view.rows[eid]) == comparable(rows[eid]), eid
        # The read's steps are the WAL's; the database's earlier steps stay unless replaced.
        kept = [] if eid in view.replaced else steps_before.get(eid, [])
        shown = [(s.seq, s.type, s.payload, s.recorded_at_ns, s.lsn) for s in view.steps.get(eid, ())]
        assert kept + shown == steps.get(eid, []), eid
    for eid in set(rows) - changed:  # what the read does not show did not change
        assert steps.get(eid, []) == steps_before.get(eid, []), eid

    # The contract of both, checked once on the compacted rows.
    reused = rows["ex-reused"]
    assert reused["envelope"] == {"run": "second"} and reused["final_response"] == {"answer": "second"}
    assert [s[0] for s in steps["ex-reused"]] == [1, 2, 3]
    assert reused["router_decision"] == {"agent": "again"} and reused["models"] == ["gpt-4o-mini"]
    assert (reused["input_tokens"], reused["output_tokens"]) == (3, 4)
    assert view.replaced == (("ex-reused",) if 4 <= applied <= 22 else ())
    failed = rows["ex-failed"]
    assert (failed["outcome"], failed["error_seq"], failed["error_code"]) == ("failed", 3, "TOOL_TIMEOUT")
    assert failed["router_decision"] == {"agent": "writer", "reason": "second"}
    assert failed["cost_usd"] > 0 and failed["prices_version"]
    unpriced = rows["ex-unpriced"]
    assert (unpriced["outcome"], unpriced["cost_usd"], unpriced["input_tokens"]) == ("incomplete", None, 12)
    assert unpriced["models"] == ["my-own-model", "gpt-4o-mini"]
    flagged = rows["ex-flagged"]
    assert (flagged["status"], flagged["replayable_reason"], flagged["outcome"]) == ("completed", "recording_failure", "succeeded")
    assert flagged["error_code"] == "http_503"
    assert (rows["ex-invalid"]["status"], rows["ex-invalid"]["outcome"]) == ("invalidated", "incomplete")
    assert rows["ex-fork"]["error_code"] == "failed" and rows["ex-fork"]["parent_execution_id"] == "ex-failed"
    theirs = rows["ex-theirs"]
    assert (theirs["recorder_id"], theirs["envelope"], theirs["last_seq"]) == (OTHER, {}, 0)
    assert (theirs["status"], theirs["replayable_reason"]) == ("running", "recording_failure")
    assert "ex-theirs" not in steps


def test_facts_in_the_frame_fold_as_the_payloads_do_without_decoding_one(monkeypatch):
    """Events framed with their payload's facts (as the store writes them) fold into the rows
    and steps the payloads fold into, and no payload is decoded for them; a WAL written before
    the facts were framed is still decoded (the monkeypatch below would stop it)."""
    from tracedb.records import fold as fold_module

    def numbered(records):
        return list(enumerate(records, 1))

    bare = fold(numbered(recording()), RECORDER)

    def refuse(*_a):
        raise AssertionError("a payload was looked into")

    monkeypatch.setattr(fold_module, "may_matter", refuse)
    monkeypatch.setattr(fold_module, "fold_event", refuse)
    with pytest.raises(AssertionError, match="looked into"):
        fold(numbered(recording()), RECORDER)
    framed = fold(numbered(recording(framed=True)), RECORDER)
    assert {e: comparable(r) for e, r in framed.new.items()} == {e: comparable(r) for e, r in bare.new.items()}
    assert framed.upd == bare.upd and framed.steps == bare.steps
    assert framed.new["ex-failed"]["cost_usd"] > 0 and framed.new["ex-unpriced"]["cost_usd"] is None


def test_the_store_frames_each_event_with_the_facts_of_its_stored_payload(tmp_path):
    """What the frame says is what the payload as stored says, after redaction: an error's
    message with its secret redacted, a model call's usage; [] for an event that adds nothing."""
    import tracedb
    from tests.store.redaction_config import SECRET_PATTERN, write_config

    data = str(tmp_path / "data")
    store = tracedb.open(data, config=load_config(write_config(str(tmp_path))))
    try:
        ex = store.start("Research", {"q": 1})
        ex.event("tool.responded", {"name": "search", "error": {"code": "E1", "message": f"bad {SECRET_PATTERN}"}})
        ex.event("llm.responded", {"response": {"model": "gpt-4o-mini", "usage": {"input_tokens": 7, "output_tokens": 2}}})
        ex.event("tool.requested", {"name": "search"})
    finally:
        store.close()
    frames = {}
    for r in wal.WalReader(os.path.join(data, "wal")).records():
        if is_event(r.payload):
            f = split_event(r.payload)
            body = r.payload[f.payload_offset :]
            assert f.facts == list(orjson.loads(orjson.dumps(event_facts(f.type, body, orjson.loads(body)))))
            frames[f.type] = f.facts
    err, used = frames["tool.responded"]
    assert used is None and err["code"] == "E1"
    assert SECRET_PATTERN not in err["message"] and "[REDACTED]" in err["message"]
    assert frames["llm.responded"] == [None, ["gpt-4o-mini", 7, 2, 0]]
    assert frames["tool.requested"] == []


def test_read_record_names_every_record():
    records = recording()
    ops = [read_record(r)[0] for r in records]
    assert ops.count("start") == 8 and ops.count("finish") == 4 and "event" in ops
    assert read_record(records[1])[1:3] == ("ex-failed", 1)


def test_a_fold_of_an_unknown_op_raises_unless_told_to_skip():
    from tracedb.errors import IntegrityError

    recs = [(1, orjson.dumps({"op": "from-the-future", "id": "x", "t": 1}))]
    with pytest.raises(IntegrityError):
        fold(recs, RECORDER)
    assert fold(recs, RECORDER, {}, skip_unknown=True).skipped == 1


def test_the_facts_the_store_hands_over_are_of_the_redacted_payload(tmp_path):
    """In-process, the store hands the compactor each event's derived facts with its frame: they
    are taken from the payload as stored, after redaction."""
    import tracedb
    from tests.store.redaction_config import SECRET_PATTERN, files_holding, write_config

    data = str(tmp_path / "data")
    store = tracedb.open(data, config=load_config(write_config(str(tmp_path))))
    try:
        assert store.staging.hinting
        ex = store.start("Research", {"q": 1})
        ex.event("tool.responded", {"name": "search", "error": {"code": "E1", "message": f"bad {SECRET_PATTERN}"}})
        ex.finish({"status": "success"})
        store.compact()
        with store.engine.connect() as conn:
            code, message = conn.execute(
                sa.select(traces.c.error_code, traces.c.error_message).where(traces.c.execution_id == ex.execution_id)
            ).one()
        assert code == "E1" and SECRET_PATTERN not in message and "[REDACTED]" in message
        assert files_holding(data, SECRET_PATTERN) == {}
    finally:
        store.close()
