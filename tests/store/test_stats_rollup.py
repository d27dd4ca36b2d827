"""stats_rollup (migrations 0007 and 0008): `stats` over all time summed from the rollup that
compaction and prune keep a batch at a time, and triggers on `traces` for every other write,
equals `stats` read off `traces` (counts and tokens exactly, cost to the nano-USD an execution,
percentiles within the histogram's 3.1%, 11.8% by hour), through every path that writes `traces`."""

from __future__ import annotations

import os
import random

import sqlalchemy as sa

from tests.store.test_row_checksums import downgrade
from tracedb.maintenance import retention
from tracedb.projection import db
from tracedb.reads.stats import BY, stats

_EXACT = ("executions", "succeeded", "failed", "incomplete", "running", "failure_rate", "input_tokens",
          "output_tokens", "cost_unknown")


def check_rollup_equals_exact(engine) -> int:
    """Every grouping: the rollup's answer against the exact one. Returns the executions counted."""
    for by in (None, *BY):
        fast, exact = stats(engine, by=by), stats(engine, by=by, exact=True)
        pairs = [(fast["total"], exact["total"])]
        assert [g["key"] for g in fast["groups"]] == [g["key"] for g in exact["groups"]], by
        pairs += list(zip(fast["groups"], exact["groups"]))
        for f, e in pairs:
            assert {k: f[k] for k in _EXACT} == {k: e[k] for k in _EXACT}, (by, f["key"])
            assert abs(f["cost_usd"] - e["cost_usd"]) <= 1e-9 * max(1, e["executions"]), (by, f, e)
            for p in ("p50_ms", "p95_ms", "p99_ms"):
                if e[p] is None:
                    assert f[p] is None, (by, f["key"], p)
                else:
                    bound = 0.118 if by == "hour" else 0.031  # by hour the buckets are 4 times as wide
                    assert abs(f[p] - e[p]) <= bound * e[p] + 0.001, (by, f["key"], p, f[p], e[p])
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT COUNT(*) FROM traces")).scalar_one()
    assert stats(engine)["total"]["executions"] == stored
    return stored


def _models(rng) -> list:
    return rng.sample(["gpt-4o", "gpt-4o-mini", "my-own-model", "claude-sonnet-4-5"], rng.randint(0, 2))


def _play(store, clock, rng, steps: int) -> dict:
    """A random mix: starts, model calls with usage (priced and not), tool errors, successes and
    failures, compaction of new and continued executions, idle executions marked incomplete,
    prune, ids started again after their prune, and finished executions flagged or invalidated
    (compaction changes a row it rolled up already)."""
    live, done, free = [], [], []
    seen = {"reused": 0, "marked_incomplete": 0, "pruned": 0, "failed": 0, "flagged_finished": 0,
            "invalidated_finished": 0, "invalidated_running": 0}
    for step in range(steps):
        roll = rng.random()
        if roll < 0.2 or not live:
            intent = rng.choice(["Ask", "Route", "Book"])
            # An id whose execution prune deleted, started again: compaction replaces the row.
            reuse = rng.random() < 0.5 and free
            ex = store.start(intent, {"intent": intent}, free.pop() if reuse else None)
            seen["reused"] += bool(reuse)
            live.append(ex)
        elif roll < 0.5:
            ex = rng.choice(live)
            for model in _models(rng):
                ex.event("llm.responded", {"response": {"model": model, "usage": {
                    "input_tokens": rng.randint(1, 5000), "output_tokens": rng.randint(1, 900)}}})
            if rng.random() < 0.3:
                ex.event("tool.responded", {"name": "search", "error": {"code": "TOOL_TIMEOUT", "message": "slow"}})
        elif roll < 0.7:
            ex = live.pop(rng.randrange(len(live)))
            ok = rng.random() < 0.7
            ex.finish({"status": "success", "payload": {}} if ok else {"status": "error", "error": {"code": "X"}})
            done.append(ex.execution_id)
            seen["failed"] += not ok
        elif roll < 0.8:
            store.compact()
        elif roll < 0.86:
            marked = store.sweep_idle()
            seen["marked_incomplete"] += marked
            if marked:
                store.compact()
                live = [ex for ex in live if store.get(ex.execution_id).status == "running"]
        elif roll < 0.88:
            store.compact()
            seen["pruned"] += retention.prune(
                store.engine, older_than_s=rng.choice((300, 3000)), now_ns=clock()).deleted_traces
            store.compact()
            with store.engine.connect() as conn:
                kept = {r[0] for r in conn.execute(sa.text("SELECT execution_id FROM traces")).all()}
            free += [i for i in done if i not in kept]
            done = [i for i in done if i in kept]
        elif roll < 0.91 and done:
            # A finished execution changed again by compaction: its row is rolled up already.
            eid = rng.choice(done)
            if rng.random() < 0.5 and store.get(eid).status != "invalidated":
                store.mark_recording_failure(eid, "a record was lost")
                seen["flagged_finished"] += 1
            else:
                store.invalidate(eid, "wrong answer")
                seen["invalidated_finished"] += 1
        elif roll < 0.92:
            # Invalidated while running: closed as incomplete.
            ex = live.pop(rng.randrange(len(live)))
            ex.invalidate("stopped by hand")
            done.append(ex.execution_id)
            seen["invalidated_running"] += 1
        clock.advance(rng.choice((0.001, 0.5, 3, 40, 200)))
        if step % 25 == 0:
            store.compact()
            check_rollup_equals_exact(store.engine)
    store.compact()
    return seen


def test_stats_from_the_rollup_equal_stats_from_traces_through_every_write(open_store, data_dir, clock):
    store = open_store(idle_timeout_s=600)
    seen = _play(store, clock, random.Random(29), 400)
    assert all(seen.values()), seen  # every path was taken
    assert check_rollup_equals_exact(store.engine) > 10
    # Nothing more to count: every grouping's rows hold the finished executions' histogram.
    with store.engine.connect() as conn:
        dims = {r[0] for r in conn.execute(sa.text("SELECT dim FROM stats_rollup WHERE executions > 0")).all()}
    assert dims == {"intent", "outcome", "model", "day", "hour"}  # the total sums the outcomes
    # The migrations' backfill gives what compaction, prune and the triggers kept; the total that
    # 0008's downgrade puts back (summed from the outcomes) is 0007's backfilled one.
    rolled = "SELECT * FROM stats_rollup WHERE executions <> 0 ORDER BY 1, 2, 3"
    with store.engine.connect() as conn:
        kept = conn.execute(sa.text(rolled)).all()
    downgrade(store.engine, "0007")
    with store.engine.connect() as conn:
        summed = conn.execute(sa.text(rolled)).all()
    downgrade(store.engine, "0006")
    db.migrate(store.engine, "0007")
    with store.engine.connect() as conn:
        assert conn.execute(sa.text(rolled)).all() == summed
    assert [r for r in summed if r[0] != "*"] == kept and any(r[0] == "*" for r in summed)
    db.migrate(store.engine)
    with store.engine.connect() as conn:
        assert conn.execute(sa.text(rolled)).all() == kept
    store.close()
    # A rebuild from the WAL into a new database: compaction fills it as it inserts.
    for suffix in ("", "-wal", "-shm"):
        path = os.path.join(data_dir, "traces.db" + suffix)
        if os.path.exists(path):
            os.remove(path)
    rebuilt = open_store()
    assert check_rollup_equals_exact(rebuilt.engine) > 10


def test_a_running_execution_is_counted_from_traces_and_rolled_up_once_it_finishes(open_store, clock):
    store = open_store()
    ex = store.start("Ask", {"intent": "Ask"})
    ex.event("llm.responded", {"response": {"model": "gpt-4o", "usage": {"input_tokens": 10, "output_tokens": 2}}})
    store.compact()
    rolled = "SELECT dim, bucket, executions, succeeded, input_tokens FROM stats_rollup WHERE executions <> 0 ORDER BY 1"
    with store.engine.begin() as conn:
        # Running: nothing in the rollup, whatever compaction changes of it.
        assert conn.execute(sa.text(rolled)).all() == []
        conn.execute(sa.text("UPDATE traces SET last_event_ns = last_event_ns + 5, input_tokens = 11"))
        assert conn.execute(sa.text(rolled)).all() == []
    total = stats(store.engine)["total"]
    assert (total["executions"], total["running"], total["input_tokens"], total["p50_ms"]) == (1, 1, 11, None)
    clock.advance(2)
    ex.finish({"status": "success", "payload": {}})
    store.compact()
    with store.engine.connect() as conn:
        got = conn.execute(sa.text(rolled)).all()
    # Finished: once in each grouping (one model), in the bucket of its duration, with its tokens.
    assert sorted(r[0] for r in got) == ["day", "hour", "intent", "model", "outcome"]
    bucket = got[0][1]
    assert bucket >= 0 and {tuple(r[1:]) for r in got if r[0] != "hour"} == {(bucket, 1, 1, 11)}
    assert [tuple(r[1:]) for r in got if r[0] == "hour"] == [(bucket // 4 * 4, 1, 1, 11)]  # 4 times as wide
    total = stats(store.engine)["total"]
    assert (total["executions"], total["running"], total["succeeded"], total["input_tokens"]) == (1, 0, 1, 11)
    assert abs(total["p50_ms"] - 2000) <= 0.025 * 2000
    check_rollup_equals_exact(store.engine)


def test_the_running_executions_are_found_by_the_outcome_index(tmp_path):
    """What stats over all time reads of `traces` on SQLite: the running executions (and those
    without an outcome) alone, each a search of ix_traces_outcome_created_id, never a scan,
    whatever the grouping, even where ANALYZE saw none running."""
    from tracedb.reads import stats as module

    engine = db.create_engine(str(tmp_path / "traces.db"), write=True)
    try:
        db.migrate(engine)
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO traces (execution_id, recorder_id, intent, status, replayable, envelope, envelope_hash, "
                "last_seq, created_at_ns, updated_at_ns, pinned, outcome, models, last_event_ns) VALUES "
                "(:id, 'r', 'I', 'running', 0, '{}', 'h', 1, :t, :t, 0, 'running', '[\"m\"]', :t)"),
                [{"id": f"e{i}", "t": 10**18 + i} for i in range(300)])
            # Finished by an UPDATE of the operator's: the update trigger rolls them up (tracedb
            # itself inserts rows only by compaction, which keeps the rollup a batch at a time).
            conn.execute(sa.text("UPDATE traces SET status = 'completed', outcome = 'succeeded'"))
            conn.exec_driver_sql("ANALYZE")
        with engine.connect() as conn:
            for by in (None, *BY):
                source, key = module._source("sqlite", by)
                source = source.replace("traces", module._INDEXED, 1)
                for where in module._NOT_ROLLED_UP:
                    plan = str(conn.exec_driver_sql(
                        f"EXPLAIN QUERY PLAN SELECT {key}, COUNT(*) FROM {source} WHERE {where}"
                        + (f" GROUP BY {key}" if by else "")).all())
                    assert "SEARCH traces USING INDEX ix_traces_outcome_created_id (outcome=?)" in plan or \
                        "SEARCH traces USING COVERING INDEX ix_traces_outcome_created_id (outcome=?)" in plan, (by, plan)
        assert stats(engine, by="model")["groups"][0]["executions"] == 300
    finally:
        engine.dispose()


def test_writes_other_than_compaction_and_prune_keep_the_rollup_through_the_triggers(open_store, clock):
    store = open_store()
    for k in range(4):
        ex = store.start("Ask", {"intent": "Ask", "k": k})
        ex.event("llm.responded", {"response": {"model": "gpt-4o", "usage": {"input_tokens": 10, "output_tokens": 2}}})
        clock.advance(1 + k)
        ex.finish({"status": "success", "payload": {}})
    store.compact()
    with store.engine.connect() as conn:
        # Compaction's deferral never outlives its transaction.
        assert conn.execute(sa.text("SELECT COUNT(*) FROM stats_rollup_deferred")).scalar_one() == 0
    with store.engine.begin() as conn:
        # An operator's own statements: the triggers keep the rollup.
        conn.execute(sa.text("UPDATE traces SET input_tokens = input_tokens + 5, intent = 'Asked' "
                             "WHERE execution_id IN (SELECT execution_id FROM traces ORDER BY created_at_ns LIMIT 2)"))
        conn.execute(sa.text("DELETE FROM traces WHERE execution_id = "
                             "(SELECT execution_id FROM traces ORDER BY created_at_ns DESC LIMIT 1)"))
    assert check_rollup_equals_exact(store.engine) == 3
    total = stats(store.engine)["total"]
    assert (total["executions"], total["input_tokens"]) == (3, 40)
    assert {g["key"]: g["executions"] for g in stats(store.engine, by="intent")["groups"]} == {"Asked": 2, "Ask": 1}
