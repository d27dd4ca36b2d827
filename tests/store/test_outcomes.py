"""What each execution came to and cost, folded by compaction (tracedb.outcomes): the embedded
API, across compaction batches, from the WAL before compaction, and by migration 0005's backfill."""

from __future__ import annotations

import sqlalchemy as sa

from tests.store.test_row_checksums import downgrade
from tracedb import db, outcomes

DERIVED = (*outcomes.COLUMNS, "last_event_ns")
T0 = 1_705_314_600_000_000_000


def record_mix(store) -> dict:
    """Executions of every outcome; their ids by what they should come to."""
    ids = {}
    ex = store.start("Ask", {"intent": "Ask"})
    ex.event("llm.responded", {"response": {"model": "gpt-4o-mini", "usage": {"input_tokens": 1000, "output_tokens": 500}}})
    ex.event("tool.responded", {"name": "search", "error": {"code": "TOOL_TIMEOUT", "message": "took 30 s"}})
    ex.event("llm.responded", {"response": {"model": "gpt-4o", "usage": {"input_tokens": 100, "output_tokens": 50}}})
    ex.finish({"status": "error", "error": {"code": "TOOL_TIMEOUT", "message": "gave up"}})
    ids["failed"] = ex.execution_id
    ex = store.start("Ask", {"intent": "Ask"})
    ex.event("llm.responded", {"response": {"status": 200, "body": {"model": "my-own-model", "usage": {"prompt_tokens": 7, "completion_tokens": 3}}}})
    ex.finish({"status": "success", "payload": {"answer": 42}})
    ids["unknown_cost"] = ex.execution_id
    ex = store.start("Route", {"intent": "Route"})
    ex.event("AGENT_ATTEMPT_END", {"agent": "a", "status": "error", "exception": "crashed"})
    ex.event("AGENT_ATTEMPT_END", {"agent": "b", "status": "ok"})
    ex.finish({"status": "success", "payload": {}})
    ids["succeeded_after_error"] = ex.execution_id
    ids["running"] = store.start("Ask", {"intent": "Ask"}).execution_id
    return ids


def rows(engine) -> dict:
    with engine.connect() as conn:
        got = conn.execute(sa.text(f"SELECT execution_id, {', '.join(DERIVED)} FROM traces")).all()
    out = {}
    for r in got:
        d = dict(zip(DERIVED, r[1:]))
        if isinstance(d["models"], str):
            import orjson

            d["models"] = orjson.loads(d["models"])
        out[r[0]] = d
    return out


def check_mix(got: dict, ids: dict) -> None:
    f = got[ids["failed"]]
    assert f["outcome"] == "failed"
    assert (f["error_seq"], f["error_type"], f["error_code"], f["error_message"]) == (
        2, "tool.responded", "TOOL_TIMEOUT", "took 30 s")
    assert f["models"] == ["gpt-4o-mini", "gpt-4o"]
    assert (f["input_tokens"], f["output_tokens"]) == (1100, 550)
    # gpt-4o-mini: $0.15/$0.60 per M tokens; gpt-4o: $2.50/$10 per M tokens.
    assert abs(f["cost_usd"] - (0.00015 + 0.0003 + 0.00025 + 0.0005)) < 1e-9
    assert f["prices_version"] == outcomes.prices_version()
    u = got[ids["unknown_cost"]]
    assert (u["outcome"], u["models"], u["input_tokens"], u["output_tokens"], u["cost_usd"]) == (
        "succeeded", ["my-own-model"], 7, 3, None)
    s = got[ids["succeeded_after_error"]]
    assert (s["outcome"], s["error_seq"], s["error_code"], s["error_message"]) == ("succeeded", 1, "error", "crashed")
    r = got[ids["running"]]
    assert (r["outcome"], r["error_seq"], r["models"], r["cost_usd"], r["prices_version"]) == (
        "running", None, [], 0.0, None)


def test_the_fold_derives_outcome_error_models_tokens_and_cost(open_store):
    store = open_store()
    ids = record_mix(store)
    store.compact()
    check_mix(rows(store._engine), ids)


def test_the_fold_is_the_same_in_batches_of_one_record(open_store):
    store = open_store(compact_batch_records=1)
    ids = record_mix(store)
    result = store.compact()
    assert result.batches > 10
    check_mix(rows(store._engine), ids)


def test_an_execution_closed_unfinished_is_incomplete_and_a_late_incomplete_keeps_a_finish(open_store):
    store = open_store(compact_batch_records=1)
    ex = store.start("Ask", {"intent": "Ask"})
    ex.finish({"status": "failure", "message": "no"})
    left = store.start("Ask", {"intent": "Ask"}).execution_id
    store.compact()
    store.close()
    # Reopened, the recorder marks what was left running incomplete (recovery).
    again = open_store()
    again.compact()
    got = rows(again._engine)
    assert got[ex.execution_id]["outcome"] == "failed"
    assert got[ex.execution_id]["error_code"] == "failure"
    assert got[left]["outcome"] == "incomplete"


def test_a_store_at_revision_0004_gets_the_derived_columns_from_its_steps(open_store, data_dir):
    store = open_store(compact_batch_records=3)
    ids = record_mix(store)
    store.close()
    engine = db.create_engine(f"{data_dir}/traces.db", write=True)
    try:
        live = rows(engine)
        downgrade(engine, "0004")
        with engine.connect() as conn:
            assert "outcome" not in {c["name"] for c in sa.inspect(conn).get_columns("traces")}
        db.migrate(engine)
        backfilled = rows(engine)
    finally:
        engine.dispose()
    # The recorder's close marked the running one incomplete: the backfill agrees.
    assert backfilled == live
    assert live[ids["running"]]["outcome"] == "incomplete"
    check_mix({**live, ids["running"]: {**live[ids["running"]], "outcome": "running"}}, ids)
