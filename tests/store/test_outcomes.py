"""What each execution came to and cost, folded by compaction (tracedb.records.outcomes): the embedded
API, across compaction batches, from the WAL before compaction, and by migration 0005's backfill."""

from __future__ import annotations

import sqlalchemy as sa

from tests.store.test_row_checksums import downgrade
from tracedb.projection import db
from tracedb.records import outcomes

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


def test_the_cached_per_token_price_equals_genai_prices_own_calculation():
    from genai_prices import Usage, calc_price

    at = T0
    from datetime import datetime, timezone

    when = datetime.fromtimestamp(at / 1e9, tz=timezone.utc)
    for model in ("gpt-4o-mini", "gpt-4o", "claude-sonnet-4-5", "gemini-2.5-pro"):
        for n_in, n_out, cached in ((1000, 500, 0), (300_000, 2_000, 1_000), (5_000, 100, 4_000)):
            table = calc_price(Usage(input_tokens=n_in, output_tokens=n_out, cache_read_tokens=cached or None),
                               model_ref=model, genai_request_timestamp=when)
            assert abs(outcomes.price_usd(model, n_in, n_out, cached, at) - float(table.total_price)) < 1e-9, model
    assert outcomes.price_usd("a-model-no-table-knows", 10, 10, 0, at) is None


def check_filters_and_stats(reader, ids: dict) -> None:
    """The listing's outcome filters and `stats` over `record_mix`'s executions (closed store)."""
    from tracedb.reads.reader import Filter

    def found(**kw):
        return {r.execution_id for r in reader.page(Filter(**kw)).items}

    assert found(outcome="failed") == {ids["failed"]}
    assert found(model="gpt-4o") == {ids["failed"]}
    assert found(model="gpt") == set()
    assert found(error="TOOL_TIMEOUT") == {ids["failed"]}
    assert found(min_cost=0.001) == {ids["failed"]}
    assert ids["running"] not in found(slower_than=0)
    s = reader.stats(by="model")
    assert s["total"]["executions"] == 4 and s["total"]["failed"] == 1
    assert s["total"]["failure_rate"] == round(1 / 3, 6)  # of the three that finished, one failed
    assert s["total"]["cost_unknown"] == 1
    by_model = {g["key"]: g for g in s["groups"]}
    assert set(by_model) == {"gpt-4o-mini", "gpt-4o", "my-own-model"}
    assert by_model["gpt-4o"]["failed"] == 1 and by_model["my-own-model"]["succeeded"] == 1
    assert by_model["gpt-4o-mini"]["input_tokens"] == 1100  # the execution's, under each model it called
    # Costs as shown: the float sum rounded to 1e-10 USD, in the listing's JSON and in stats.
    failed_row = next(r for r in reader.page(Filter(outcome="failed")).items)
    assert failed_row.to_dict()["cost_usd"] == 0.0012 and by_model["gpt-4o"]["cost_usd"] == 0.0012
    days = reader.stats(by="day")["groups"]
    assert len(days) == 1 and days[0]["key"].endswith("T00:00:00Z") and days[0]["executions"] == 4
    assert reader.stats(by="outcome")["groups"][0] == {**reader.stats(by="outcome")["groups"][0], "key": "succeeded", "executions": 2}


def test_filters_and_stats_in_sql_on_sqlite(data_dir):
    import tracedb
    from tracedb.config import load_config
    from tracedb.reads.reader import Reader

    with tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
        ids = record_mix(store)
    with Reader.open(load_config(overrides={"data_dir": data_dir})) as reader:
        check_filters_and_stats(reader, ids)


def check_percentiles(engine) -> None:
    """`stats` percentiles, over all time (the index walk) and in a window or a grouping (the
    window functions), equal nearest-rank percentiles computed here, ties and odd counts
    included; running executions and those without an event are left out."""
    import random

    from tracedb.reads.stats import stats

    db.migrate(engine)
    rng = random.Random(3)
    rows_, finished = [], []
    for n in range(1003):
        created = T0 + n * 10**9
        outcome = ("running", "succeeded", "failed", "incomplete")[n % 7 % 4]
        dur = rng.choice((rng.randint(1, 10**10), 5 * 10**6, 7 * 10**6))  # ties on purpose
        last = None if n % 50 == 0 else created + dur
        intent = ("book", "search", "book", None)[n % 4]  # NULL too: an intent is optional
        rows_.append({"id": f"p-{n:05d}", "created": created, "outcome": outcome, "last": last, "intent": intent})
        if outcome != "running" and last is not None:
            finished.append((created, outcome, dur, intent))
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO traces (execution_id, recorder_id, intent, status, replayable, envelope, envelope_hash, "
            "last_seq, created_at_ns, updated_at_ns, pinned, outcome, models, input_tokens, output_tokens, "
            "cost_usd, last_event_ns) VALUES (:id, 'p', :intent, 'completed', false, '{}', 'sha256:x', 1, :created, "
            ":created, false, 'running', '[]', 0, 0, 0.0, :last)"), rows_)
        # The outcomes set by UPDATE, whose trigger keeps stats_rollup on SQLite (tracedb inserts
        # rows only by compaction, which keeps it itself).
        conn.execute(sa.text("UPDATE traces SET outcome = :outcome WHERE execution_id = :id"), rows_)

    def nearest_rank(durs) -> list:
        durs = sorted(durs)
        return [round(durs[(p * len(durs) + 99) // 100 - 1] / 1e6, 3) for p in (50, 95, 99)]

    def got(g) -> list:
        return [g["p50_ms"], g["p95_ms"], g["p99_ms"]]

    assert got(stats(engine, exact=True)["total"]) == nearest_rank(d for _, _, d, _ in finished)
    # Over all time on SQLite, summed from stats_rollup: within the histogram's bound (3.1%,
    # plus the rounding to the microsecond).
    for p_got, p_exact in zip(got(stats(engine)["total"]), nearest_rank(d for _, _, d, _ in finished)):
        assert abs(p_got - p_exact) <= 0.031 * p_exact + 0.001, (p_got, p_exact)
    since = T0 + 400 * 10**9
    assert got(stats(engine, since)["total"]) == nearest_rank(d for c, _, d, _ in finished if c >= since)
    for g in stats(engine, by="outcome", exact=True)["groups"]:
        expected = [d for _, o, d, _ in finished if o == g["key"]]
        assert got(g) == (nearest_rank(expected) if expected else [None] * 3), g["key"]
    # By intent over all time (the walk of ix_traces_intent_duration; NULL ranked apart) and in
    # a window (window functions): the same nearest ranks.
    for window in (None, since):
        groups = stats(engine, window, by="intent", exact=True)["groups"]
        assert {g["key"] for g in groups} == {"book", "search", None}
        for g in groups:
            expected = [d for c, _, d, i in finished if i == g["key"] and (window is None or c >= window)]
            assert got(g) == nearest_rank(expected), (window, g["key"])


def test_stats_percentiles_are_exact_on_sqlite(tmp_path):
    from tracedb.reads import stats

    engine = db.create_engine(str(tmp_path / "traces.db"), write=True)
    try:
        check_percentiles(engine)
        # The walk reads the partial index (its predicate matched word for word), not the table:
        # the schema comparison cannot see an expression index on SQLite.
        with engine.connect() as conn:
            plan = conn.exec_driver_sql(
                f"EXPLAIN QUERY PLAN SELECT {stats._DURATION} FROM traces WHERE {stats._FINISHED} "
                f"ORDER BY {stats._DURATION} LIMIT 1 OFFSET 3").all()
        assert "ix_traces_duration" in str(plan)
        with engine.connect() as conn:
            plan = conn.exec_driver_sql(
                f"EXPLAIN QUERY PLAN SELECT {stats._DURATION} FROM traces WHERE traces.intent = 'book' AND "
                f"{stats._FINISHED} ORDER BY {stats._DURATION} DESC LIMIT 1 OFFSET 3").all()
        assert "ix_traces_intent_duration" in str(plan) and "TEMP B-TREE" not in str(plan)
        with engine.connect() as conn:
            plan = conn.exec_driver_sql(
                f"EXPLAIN QUERY PLAN SELECT {stats._DURATION} FROM traces WHERE +traces.outcome = 'failed' AND "
                f"{stats._FINISHED} ORDER BY {stats._DURATION} LIMIT 1 OFFSET 3").all()
        assert "COVERING INDEX ix_traces_duration" in str(plan) and "TEMP B-TREE" not in str(plan)
    finally:
        engine.dispose()


def test_a_call_priced_when_recorded_costs_what_the_price_table_says():
    from tracedb.records.outcomes import call_price, price_usd

    day = 1_764_000_000 * 10**9
    # Alternating models and days: the rates kept at hand are those of the call being priced.
    for model, n_in, n_out, cached, t in [("gpt-4o-mini", 1000, 100, 0, day), ("gpt-4o", 1000, 100, 400, day),
                                          ("gpt-4o-mini", 900, 10, 2000, day), ("gpt-4o", 5, 5, 0, day - 400 * 86_400 * 10**9),
                                          ("claude-sonnet-4-5", 20_000, 800, 5_000, day)]:
        assert call_price((model, n_in, n_out, cached), t) == price_usd(model, n_in, n_out, cached, t) is not None
    assert call_price(("a-model-nobody-prices", 10, 10, 0), day) is None  # cost unknown, never a guess
    assert call_price((None, 10, 10, 0), day) is None
    assert call_price(("gpt-4o", 0, 0, 0), day) == 0.0
