"""stats_rollup on PostgreSQL (migration 0009): `stats` over all time summed from the shards that
compaction and prune keep a batch at a time, and the triggers for every other write, equals
`stats` read off `traces`; one recorder's compaction never writes another's shard."""

from __future__ import annotations

import random

import pytest
import sqlalchemy as sa

from tests.store.test_row_checksums import downgrade
from tests.store.test_stats_rollup import _play, check_rollup_equals_exact
from tracedb.projection import db
from tracedb.reads.stats import stats

pytestmark = pytest.mark.postgres

_ROLLED = "SELECT * FROM stats_rollup WHERE executions <> 0 ORDER BY 1, 2, 3, 4"


def test_stats_from_the_rollup_equal_stats_from_traces_on_postgresql(open_pg_store, clock):
    store = open_pg_store(clock=clock, idle_timeout_s=600)
    seen = _play(store, clock, random.Random(29), 400)
    assert all(seen.values()), seen  # every path was taken
    assert check_rollup_equals_exact(store.engine) > 10
    with store.engine.connect() as conn:
        kept = conn.execute(sa.text(_ROLLED)).all()
        shards = {r[0] for r in conn.execute(sa.text("SELECT DISTINCT recorder_id FROM stats_rollup")).all()}
    assert shards == {store.recorder_id}
    assert {r[0] for r in kept} == {"intent", "outcome", "model", "day", "hour"}
    engine = db.create_engine(store.engine.url.render_as_string(hide_password=False))
    store.close()
    with engine.connect() as conn:
        kept = conn.execute(sa.text(_ROLLED)).all()  # closing may have compacted more
    # The migration's backfill sums the same rows that compaction, prune and the triggers kept
    # (the backfill keeps no merged shard: the merged rows are compared by key and bucket).
    downgrade(engine, "0008")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT to_regclass('stats_rollup')").scalar() is None
        assert conn.exec_driver_sql(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = current_schema()::regnamespace "
            "AND starts_with(proname, 'tracedb_rollup')").scalar() == 0
    db.migrate(engine)
    with engine.connect() as conn:
        assert _by_bucket(conn.execute(sa.text(_ROLLED)).all()) == _by_bucket(kept)
    check_rollup_equals_exact(engine)
    engine.dispose()


def _by_bucket(rows) -> dict:
    """(dim, key, bucket) -> the sums of its shards, without those that sum to nothing."""
    out: dict = {}
    for dim, key, bucket, _, *counts in rows:
        have = out.get((dim, key, bucket), [0] * len(counts))
        out[(dim, key, bucket)] = [a + b for a, b in zip(have, counts)]
    return {k: v for k, v in out.items() if any(v)}


def test_two_recorders_keep_a_shard_each_and_stats_sums_them(open_pg_store, clock):
    a, b = open_pg_store("a", clock=clock), open_pg_store("b", clock=clock)
    for k, store in enumerate((a, b, a)):
        ex = store.start("Ask", {"intent": "Ask", "k": k})
        ex.event("llm.responded", {"response": {"model": "gpt-4o", "usage": {"input_tokens": 10, "output_tokens": 2}}})
        clock.advance(1 + k)
        ex.finish({"status": "success", "payload": {}} if k < 2 else {"status": "error", "error": {"code": "E"}})
        store.compact()
    with a.engine.connect() as conn:
        by_shard = dict(conn.execute(sa.text(
            "SELECT recorder_id, SUM(executions) FROM stats_rollup WHERE dim = 'outcome' GROUP BY 1")).all())
    assert by_shard == {a.recorder_id: 2, b.recorder_id: 1}
    total = stats(a.engine)["total"]
    assert (total["executions"], total["succeeded"], total["failed"], total["input_tokens"]) == (3, 2, 1, 30)
    assert check_rollup_equals_exact(a.engine) == 3


def test_writes_other_than_compaction_and_prune_keep_the_rollup_on_postgresql(open_pg_store, clock):
    store = open_pg_store(clock=clock)
    for k in range(4):
        ex = store.start("Ask", {"intent": "Ask", "k": k})
        ex.event("llm.responded", {"response": {"model": "gpt-4o", "usage": {"input_tokens": 10, "output_tokens": 2}}})
        ex.event("llm.responded", {"response": {"model": "gpt-4o-mini", "usage": {"input_tokens": 1, "output_tokens": 1}}})
        clock.advance(1 + k)
        ex.finish({"status": "success", "payload": {}})
    store.compact()
    with store.engine.connect() as conn:
        # Compaction's deferral ended with its transaction.
        assert conn.exec_driver_sql("SELECT current_setting('tracedb.rollup_deferred', true)").scalar() in (None, "", "off")
    with store.engine.begin() as conn:
        # An operator's own statements: the triggers keep the rollup (a model listed twice
        # counts twice, as the exact read's join counts it).
        conn.execute(sa.text("UPDATE traces SET input_tokens = input_tokens + 5, intent = 'Asked' "
                             "WHERE execution_id IN (SELECT execution_id FROM traces ORDER BY created_at_ns LIMIT 2)"))
        conn.execute(sa.text("UPDATE traces SET models = '[\"gpt-4o\", \"gpt-4o\"]'::json WHERE execution_id = "
                             "(SELECT execution_id FROM traces ORDER BY created_at_ns LIMIT 1)"))
        conn.execute(sa.text("DELETE FROM traces WHERE execution_id = "
                             "(SELECT execution_id FROM traces ORDER BY created_at_ns DESC LIMIT 1)"))
        # A running execution's change costs the rollup nothing.
        conn.execute(sa.text("UPDATE traces SET outcome = NULL, intent = NULL WHERE execution_id = "
                             "(SELECT execution_id FROM traces ORDER BY created_at_ns LIMIT 1 OFFSET 1)"))
    assert check_rollup_equals_exact(store.engine) == 3
    total = stats(store.engine)["total"]
    assert (total["executions"], total["input_tokens"]) == (3, 16 + 16 + 11)
    assert {g["key"]: g["executions"] for g in stats(store.engine, by="intent")["groups"]} == {None: 1, "Asked": 1, "Ask": 1}
    assert {g["key"]: g["executions"] for g in stats(store.engine, by="model")["groups"]} == {
        "gpt-4o": 4, "gpt-4o-mini": 2}


def test_the_bucket_function_puts_a_duration_where_the_compactor_does(pg_engine):
    from tracedb.projection.rollup import Delta

    db.migrate(pg_engine)
    start = 10**18
    durations = [None, -5, 0, 1, 2, 3, 15, 16, 17, 31, 32, 33, 10**9, 2**40 + 12345, 2**58 - 1, 2**58, 2**62]
    with pg_engine.connect() as conn:
        for d in durations:
            last = None if d is None else start + d
            delta = Delta()
            delta.add("I", "succeeded", None, 0, 0, 0.0, start, last)
            (key,) = delta.groups
            assert conn.exec_driver_sql("SELECT tracedb_rollup_bucket(%s, %s)", (start, last)).scalar() == key[4], d


def test_prune_merges_the_shards_of_the_hours_that_are_over_and_drops_what_it_emptied(open_pg_store, clock):
    from tracedb.maintenance import retention
    from tracedb.projection.rollup import MERGED

    a, b = open_pg_store("a", clock=clock), open_pg_store("b", clock=clock)

    def run(store, k, fail=False):
        ex = store.start("Ask", {"intent": "Ask", "k": k})
        ex.event("llm.responded", {"response": {"model": "gpt-4o", "usage": {"input_tokens": 10, "output_tokens": 2}}})
        clock.advance(1 + k % 5)
        ex.finish({"status": "error", "error": {"code": "E"}} if fail else {"status": "success", "payload": {}})
        store.compact()

    for k in range(6):  # two recorders, in the same hours and buckets
        run(a if k % 2 else b, k, fail=k == 3)
    clock.advance(3 * 86_400)  # days later: those days and hours are over
    run(a, 6)
    shards = ("SELECT dim, recorder_id, SUM(executions)::bigint FROM stats_rollup WHERE dim IN ('day', 'hour') "
              "AND executions <> 0 GROUP BY 1, 2 ORDER BY 1, 2")
    with a.engine.connect() as conn:
        before = conn.execute(sa.text(shards)).all()
    assert {r[1] for r in before} == {a.recorder_id, b.recorder_id}
    exact = stats(a.engine, by="hour", exact=True)
    assert retention.prune(a.engine, older_than_s=30 * 86_400, now_ns=clock()).deleted_traces == 0
    with a.engine.connect() as conn:
        after = conn.execute(sa.text(shards)).all()
        merged = conn.execute(sa.text("SELECT dim, key, bucket, executions FROM stats_rollup WHERE recorder_id = :m "
                                      "AND dim = 'hour'"), {"m": MERGED}).all()
    # The old hours and days: one merged row a key and bucket. Today's stays recorder a's.
    assert [tuple(r[1:]) for r in after if r[0] == "day"] == [(MERGED, 6), (a.recorder_id, 1)]
    assert [tuple(r[1:]) for r in after if r[0] == "hour"] == [(MERGED, 6), (a.recorder_id, 1)]
    assert sum(r[3] for r in merged) == 6 and len(merged) == len({r[:3] for r in merged})
    check_rollup_equals_exact(a.engine)
    assert [(g["key"], g["executions"], g["failed"]) for g in stats(a.engine, by="hour")["groups"]] == [
        (g["key"], g["executions"], g["failed"]) for g in exact["groups"]]
    # Prune deletes the old executions: what they summed to is gone, row and all.
    assert retention.prune(a.engine, older_than_s=86_400, now_ns=clock()).deleted_traces == 6
    with a.engine.connect() as conn:
        left = conn.execute(sa.text("SELECT recorder_id, executions FROM stats_rollup WHERE dim = 'day'")).all()
    assert [tuple(r) for r in left] == [(a.recorder_id, 1)]
    assert check_rollup_equals_exact(a.engine) == 1
