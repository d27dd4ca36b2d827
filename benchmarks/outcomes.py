"""Outcomes: what deriving them costs live compaction, and how `stats` and the listing's new
filters scale from 100k to 1M executions.

Derivation: the recorder's own live compaction (the staging API, `store.compact()` timed, as
`bench_compaction_live` in run.py) of agent-shaped executions (model calls with usage, tool
calls, one execution in ten failing), with the fold on and with it replaced by no-ops, the two
arms taking turns chunk by chunk so that the machine's load falls on both alike; the row is their
ratio. Both arms collect garbage before each timed `compact()`: a full collection is owed to the
whole heap (the recording just done, the price table), and which call it falls in depends on
where the collector's counters stand (profiled: one of ~120k objects, 0.14 to 0.16 s, fell in the
fold-on arm's timed calls and the fold-off arm's in its untimed recording).

Scale: stores of 100k and 1M executions at a fixed rate of 10,000 a day (a fleet whose store
grows with its retention), built with direct inserts into `traces` and one step each (compacting
1M executions through the recorder would take longer than this machine's bench run); each query
timed best of 5 through the read API (`Reader.stats`, `Reader.page` with a `Filter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import shutil
import sqlite3
import tempfile
import time

import orjson

PER_DAY = 10_000
MODELS = ("gpt-4o-mini", "gpt-4o", "claude-sonnet-4-5", "local-llama")
CODES = ("TOOL_TIMEOUT", "RATE_LIMIT", "AGENT_ERROR", "ROUTING_ERROR", "ValueError")


# An agent's turn as the OpenAI SDK wrapper records it: the request with the conversation so far
# (~2 KB), the answer with its body and usage (~1 KB), then a tool call and its result.
_CONVERSATION = [{"role": "system", "content": "You are a careful travel assistant. " * 8}] + [
    {"role": "user" if k % 2 else "assistant", "content": f"turn {k}: " + "words of the conversation " * 6}
    for k in range(8)]


def _llm_request(i: int) -> dict:
    return {"prompt_hash": f"h{i}", "request": {"method": "POST", "path": "/v1/chat/completions",
            "model": "gpt-4o-mini", "body": {"model": "gpt-4o-mini", "messages": _CONVERSATION}}}


def _llm_answer(i: int) -> dict:
    usage = {"prompt_tokens": 900 + i, "completion_tokens": 120, "total_tokens": 1020 + i}
    return {"prompt_hash": f"h{i}", "request_seq": i, "response": {
        "status": 200, "headers": [["content-type", "application/json"], ["x-request-id", f"req_{i:024d}"]],
        "body": {"id": f"chatcmpl-{i:024d}", "object": "chat.completion", "created": 1700000000, "model": "gpt-4o-mini",
                 "choices": [{"index": 0, "finish_reason": "stop", "message": {
                     "role": "assistant", "content": "Paris is the capital of France. " * 12}}], "usage": usage},
        "usage": {"input_tokens": 900 + i, "output_tokens": 120, "total_tokens": 1020 + i}}}


def _tool_request(i: int) -> dict:
    return {"name": "web_search", "arguments": {"q": "capital of France"}, "args_hash": f"a{i}"}


def _tool_answer(i: int, failed: bool) -> dict:
    if failed:
        return {"name": "web_search", "request_seq": i, "error": {"code": "TOOL_TIMEOUT", "message": "took 30 s"}}
    return {"name": "web_search", "request_seq": i, "response": {"result": "Paris is the capital of France."}}


_TURN = (("tool.responded", None), ("llm.requested", _llm_request), ("llm.responded", _llm_answer),
         ("tool.requested", _tool_request))


class _Live:
    """A recorder whose live compaction is timed chunk by chunk: agent-shaped executions staged
    through the recorder's staging API, then `store.compact()` timed (as `bench_compaction_live`
    in run.py); `derive=False`: the fold off, while it records and while it compacts."""

    def __init__(self, workdir: str, derive: bool, events_per: int):
        import tracedb

        self.derive, self.events_per = derive, events_per
        self.dir = tempfile.mkdtemp(dir=workdir)
        with self.fold_set():
            self.store = tracedb.open(os.path.join(self.dir, "data"),
                                      config={"compact_interval_ms": 0, "idle_timeout_s": 0})
        self.timings: list = []  # per chunk: (steps, wall s, CPU s)

    @contextlib.contextmanager
    def fold_set(self):
        """The fold as this arm has it, put back on leaving."""
        from tracedb.records import fold
        from tracedb.records import outcomes
        from tracedb.recorder import staging as staging_module

        saved = (fold.may_matter, fold.fold_facts, staging_module.event_facts, outcomes.fold_finish,
                 outcomes.fold_closed)
        if not self.derive:
            # The fold's decoding, and the facts the store hands the compactor with each event.
            fold.may_matter = lambda type_, body: False
            fold.fold_facts = lambda *a: None
            staging_module.event_facts = lambda *a: outcomes.NO_FACTS
            outcomes.fold_finish = outcomes.fold_closed = lambda *a: None
        try:
            yield
        finally:
            (fold.may_matter, fold.fold_facts, staging_module.event_facts, outcomes.fold_finish,
             outcomes.fold_closed) = saved

    async def _record(self, lo: int, hi: int) -> None:
        from tracedb.recorder.state import StagedBatch

        staging = self.store.staging
        batch = StagedBatch()
        for e in range(lo, hi):
            start = staging.reserve_start("answer", {"intent": "answer", "n": e}, f"exec-{e:08d}")
            staging.check_new_in_db(start)
            staging.stage_start(batch, start)
            for i in range(1, self.events_per):
                type_, make = _TURN[i % 4]
                payload = make(i) if make is not None else _tool_answer(i, e % 10 == 0 and i == 4)
                staging.stage_event(batch, start.execution_id, type_, payload)
            failed = e % 10 == 0
            staging.stage_finish(batch, start.execution_id,
                                 {"status": "error", "error": {"code": "TOOL_TIMEOUT"}} if failed
                                 else {"status": "success", "payload": {"n": e}})
        await staging.append_staged(batch, asyncio.get_running_loop())

    def chunk(self, lo: int, hi: int) -> None:
        """Record executions lo..hi-1, then time their compaction."""
        with self.fold_set():
            asyncio.run(self._record(lo, hi))
            gc.collect()  # module doc
            t0, c0 = time.perf_counter(), time.process_time()
            steps = self.store.compact().steps
            self.timings.append((steps, time.perf_counter() - t0, time.process_time() - c0))

    def close(self) -> list:
        """The timings of its chunks."""
        try:
            self.store.close()
        finally:
            shutil.rmtree(self.dir)
        return self.timings


def derivation_cost(workdir: str, executions: int, rounds: int = 3, events_per: int = 20, chunk: int = 300) -> dict:
    """Live compaction throughput with and without the fold. In each round both arms record
    into stores of their own, `chunk` executions at a time, and take turns (which goes first
    alternates), so that a change in the machine's load falls on both alike; each chunk's
    compaction counts with its best time over the rounds (wall and CPU apart), which leaves out
    the moments another process took the machine.
    The price table is loaded first (once per process: its import and parse), and timed apart.
    The CPU-time ratio is the steadier one on a loaded machine (other processes' time slices do
    not count); the fold does no I/O, so it is what the fold costs."""
    from tracedb.records import outcomes

    t0 = time.perf_counter()
    outcomes.price_usd("gpt-4o-mini", 1, 1, 0, None)
    table_s = time.perf_counter() - t0
    on, off = [], []
    for _ in range(rounds):
        arms = {False: _Live(workdir, False, events_per), True: _Live(workdir, True, events_per)}
        try:
            for k, lo in enumerate(range(0, executions, chunk)):
                for derive in ((False, True) if k % 2 == 0 else (True, False)):
                    arms[derive].chunk(lo, min(executions, lo + chunk))
        finally:
            off.append(arms[False].close())
            on.append(arms[True].close())
    best_on, cpu_on = _best(on)
    best_off, cpu_off = _best(off)
    return {"events": executions * events_per, "with_fold_events_per_s": best_on,
            "without_fold_events_per_s": best_off, "ratio": best_on / best_off,
            "with_fold_events_per_cpu_s": cpu_on, "without_fold_events_per_cpu_s": cpu_off,
            "cpu_ratio": cpu_on / cpu_off, "price_table_load_s": table_s}


def _best(rounds: list) -> tuple[float, float]:
    """Events per second of wall time and of CPU time, each chunk at its best over the rounds."""
    steps = sum(t[0] for t in rounds[0])
    wall = sum(min(r[k][1] for r in rounds) for k in range(len(rounds[0])))
    cpu = sum(min(r[k][2] for r in rounds) for k in range(len(rounds[0])))
    return steps / wall, steps / cpu


def build_store(path: str, executions: int, now_ns: int, seed: int = 7) -> None:
    """A migrated SQLite store of `executions` rows with their derived columns and one step
    each, newest `now_ns`, PER_DAY a day back from it (direct inserts, not the recorder)."""
    from tracedb.projection import db
    from wal.format import crc32c

    engine = db.create_engine(path, write=True)
    # The rows go in before migration 0007, whose backfill then sums them into stats_rollup (as
    # an existing store's upgrade does): one GROUP BY a grouping, not a trigger a row.
    db.migrate(engine, "0006")
    engine.dispose()
    rng = random.Random(seed)
    gap = 86_400 * 10**9 // PER_DAY
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA synchronous = OFF")
    payload = orjson.dumps({"status": "success"})
    crc = crc32c(payload)
    trace_sql = (
        "INSERT INTO traces (execution_id, recorder_id, intent, status, replayable, envelope, envelope_hash, "
        "last_seq, created_at_ns, updated_at_ns, pinned, outcome, error_seq, error_type, error_code, "
        "error_message, models, input_tokens, output_tokens, cost_usd, prices_version, last_event_ns) "
        "VALUES (?, 'bench', ?, ?, 1, '{}', 'sha256:x', 1, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, '0.2.3', ?)"
    )
    step_sql = ("INSERT INTO trace_steps (execution_id, seq, type, payload, recorded_at_ns, lsn, payload_crc) "
                "VALUES (?, 1, 'FINAL_RESPONSE', ?, ?, 0, ?)")
    batch_t, batch_s = [], []
    for row in _rows(rng, executions, now_ns, gap):
        batch_t.append(row)
        batch_s.append((row[0], payload.decode(), row[-1], crc))
        if len(batch_t) == 20_000:
            conn.executemany(trace_sql, batch_t)
            conn.executemany(step_sql, batch_s)
            batch_t, batch_s = [], []
    conn.executemany(trace_sql, batch_t)
    conn.executemany(step_sql, batch_s)
    conn.commit()
    conn.close()
    engine = db.create_engine(path, write=True)
    db.migrate(engine)
    engine.dispose()
    conn = sqlite3.connect(path)
    conn.execute("ANALYZE")
    conn.close()


def build_pg_store(url: str, executions: int, now_ns: int, seed: int = 7) -> None:
    """`build_store`'s rows in the PostgreSQL schema of `url` (COPY), put in at revision 0008 so
    that migration 0009's backfill sums them into stats_rollup, as an existing store's upgrade
    does; then ANALYZE."""
    import psycopg

    from tracedb.projection import db

    engine = db.create_engine(url)
    db.migrate(engine, "0008")
    rng = random.Random(seed)
    gap = 86_400 * 10**9 // PER_DAY
    raw = engine.raw_connection()
    try:
        conn: psycopg.Connection = raw.driver_connection
        with conn.cursor() as cur:
            with cur.copy("COPY traces (execution_id, recorder_id, intent, status, replayable, envelope, "
                          "envelope_hash, last_seq, created_at_ns, updated_at_ns, pinned, outcome, error_seq, "
                          "error_type, error_code, error_message, models, input_tokens, output_tokens, cost_usd, "
                          "prices_version, last_event_ns) FROM STDIN") as copy:
                for n, row in enumerate(_rows(rng, executions, now_ns, gap)):
                    eid, intent, status, created, updated, outcome, err_seq, err_type, code, msg, models, t_in, \
                        t_out, cost, last = row
                    copy.write_row((eid, f"bench-{n % 4}", intent, status, True, "{}", "sha256:x", 1, created,
                                    updated, False, outcome, err_seq, err_type, code, msg, models, t_in, t_out,
                                    cost, "0.2.3", last))
            with cur.copy("COPY trace_steps (execution_id, seq, type, payload, recorded_at_ns, lsn) "
                          "FROM STDIN") as copy:
                for n in range(executions):
                    copy.write_row((f"exec-{n:09d}", 1, "FINAL_RESPONSE", '{"status": "success"}',
                                    now_ns - (executions - n) * gap, 0))
        conn.commit()
    finally:
        raw.close()
    db.migrate(engine)
    with engine.connect() as c:
        c.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
    engine.dispose()


def _rows(rng, executions: int, now_ns: int, gap: int):
    """`build_store`'s `traces` rows, in its order and with its figures."""
    for n in range(executions):
        created = now_ns - (executions - n) * gap
        duration = int(rng.lognormvariate(22, 1.0))  # median ~3.6 s
        roll = rng.random()
        outcome = "failed" if roll < 0.08 else "incomplete" if roll < 0.10 else "succeeded"
        err = outcome == "failed" or rng.random() < 0.05
        code = rng.choice(CODES) if err else None
        model = rng.choice(MODELS)
        tokens_in, tokens_out = rng.randint(500, 20_000), rng.randint(50, 2_000)
        cost = None if model == "local-llama" else round((tokens_in * 2.5 + tokens_out * 10) / 1e6, 6)
        yield (f"exec-{n:09d}", f"intent-{n % 20}", "incomplete" if outcome == "incomplete" else "completed", created,
               created + duration, outcome, 1 if err else None, "tool.responded" if err else None, code,
               "it failed" if err else None, orjson.dumps([model]).decode(), tokens_in, tokens_out, cost,
               created + duration)


def _best_of(fn, n: int = 3) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def queries(reader, now_ns: int, exact: bool = True) -> dict:
    """The timed reads: label -> seconds (best of 5); `exact`: with the exact grouping by model
    over all time (read off `traces`, seconds at 1M)."""
    from tracedb.reads.reader import Filter
    from tracedb.reads.stats import stats

    day = now_ns - 86_400 * 10**9
    out = {
        "stats --since 24h": lambda: reader.stats(day),
        "stats --since 24h --by intent": lambda: reader.stats(day, "intent"),
        "stats --since 24h --by model": lambda: reader.stats(day, "model"),
        "stats --since 7d --by day": lambda: reader.stats(now_ns - 7 * 86_400 * 10**9, "day"),
        "stats --all": lambda: reader.stats(),
        "stats --all --by intent": lambda: reader.stats(None, "intent"),
        "stats --all --by outcome": lambda: reader.stats(None, "outcome"),
        "stats --all --by model": lambda: reader.stats(None, "model"),
        "stats --all --by day": lambda: reader.stats(None, "day"),
        "stats --all --by hour": lambda: reader.stats(None, "hour"),
        # What /overview asks at once: per day, by intent, by model.
        "overview (day, intent, model)": lambda: [reader.stats(None, by) for by in ("day", "intent", "model")],
    }
    if exact:
        out["stats --all --by model, exact (traces)"] = lambda: stats(reader.engine, None, "model", exact=True)
    for label, where in (
        ("--outcome failed", Filter(outcome="failed")),
        ("--model gpt-4o", Filter(model="gpt-4o")),
        ("--error RATE_LIMIT", Filter(error="RATE_LIMIT")),
        ("--min-cost 0.05", Filter(min_cost=0.05)),
        ("--slower-than 30s", Filter(slower_than=30)),
    ):
        out[f"inspect --list {label}"] = (lambda w: lambda: reader.page(w, limit=50))(where)
    # Best of 5: a page takes a millisecond or two, which one scheduling hiccup doubles.
    return {label: _best_of(fn, 5) for label, fn in out.items()}


def scale(workdir: str, sizes=(100_000, 1_000_000)) -> dict:
    """{size: {query: seconds}} over stores built by `build_store`."""
    from tracedb.config import load_config
    from tracedb.reads.reader import Reader

    now_ns = time.time_ns()
    out = {}
    for size in sizes:
        d = tempfile.mkdtemp(dir=workdir)
        try:
            t0 = time.perf_counter()
            build_store(os.path.join(d, "traces.db"), size, now_ns)
            built = time.perf_counter() - t0
            conn = sqlite3.connect(os.path.join(d, "traces.db"))
            rollup_rows = conn.execute("SELECT COUNT(*) FROM stats_rollup").fetchone()[0]
            conn.close()
            with Reader.open(load_config(overrides={"data_dir": d})) as reader:
                out[size] = {"build_s": built, "rollup_rows": rollup_rows, "queries": queries(reader, now_ns)}
        finally:
            shutil.rmtree(d)
    return out


def scale_pg(pg_url: str, workdir: str, sizes=(100_000, 1_000_000)) -> dict:
    """`scale` on PostgreSQL: the same rows (four recorders' shards), a schema of their own each,
    timed after a prune that deletes nothing (the nightly one of a store within its retention),
    which merges the shards of the days and hours that are over; `stats --all --by hour` is also
    timed before it."""
    from benchmarks.pg import bench_schema
    from tracedb.config import load_config
    from tracedb.maintenance import retention
    from tracedb.projection import db
    from tracedb.reads.reader import Reader

    now_ns = time.time_ns()
    admin = db.create_engine(pg_url)
    out: dict = {}
    try:
        for size in sizes:
            with bench_schema(admin, pg_url, []) as url:
                t0 = time.perf_counter()
                build_pg_store(url, size, now_ns)
                built = time.perf_counter() - t0
                engine = db.create_engine(url)
                d = tempfile.mkdtemp(dir=workdir)
                try:
                    rollup_rows = _count_rollup_rows(engine)
                    with Reader.open(load_config(overrides={"data_dir": d, "db_url": url})) as reader:
                        unmerged = _best_of(lambda: reader.stats(None, "hour"), 5)
                        t0 = time.perf_counter()
                        retention.prune(engine, older_than_s=10 * 365 * 86_400, now_ns=now_ns)
                        pruned = time.perf_counter() - t0
                        merged_rows = _count_rollup_rows(engine)
                        figures = queries(reader, now_ns, exact=False)
                        figures["stats --all --by hour, shards not merged"] = unmerged
                        out[size] = {"build_s": built, "rollup_rows": rollup_rows, "merged_rollup_rows": merged_rows,
                                     "prune_s": pruned, "queries": figures}
                finally:
                    engine.dispose()
                    shutil.rmtree(d)
    finally:
        admin.dispose()
    return out


def _count_rollup_rows(engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT COUNT(*) FROM stats_rollup").scalar()


def run(workdir: str, quick: bool = False, pg_url: str | None = None) -> dict:
    """Both measurements, and the scale one on PostgreSQL when `pg_url` names a server; `quick`:
    small sizes (a smoke test, not figures)."""
    sizes = (10_000, 100_000) if quick else (100_000, 1_000_000)
    out = {
        "derivation": derivation_cost(workdir, 300 if quick else 3000, rounds=1 if quick else 3),
        "scale": scale(workdir, sizes),
    }
    if pg_url:
        out["scale_postgresql"] = scale_pg(pg_url, workdir, sizes)
    return out


def report_lines(result: dict) -> list[str]:
    d = result["derivation"]
    lines = [
        f"  live compaction, fold off: {d['without_fold_events_per_s']:>12,.0f} events/s ({d['events']:,} events, each chunk's best over the rounds)",
        f"  live compaction, fold on:  {d['with_fold_events_per_s']:>12,.0f} events/s",
        f"  ratio (on / off): {d['ratio']:.3f}   target >= 0.90 (derivation costs at most 10%): "
        f"{'met' if d['ratio'] >= 0.90 else 'NOT met'}",
        f"  per CPU second: {d['without_fold_events_per_cpu_s']:,.0f} off, {d['with_fold_events_per_cpu_s']:,.0f} on, "
        f"ratio {d['cpu_ratio']:.3f}: {'met' if d['cpu_ratio'] >= 0.90 else 'NOT met'}",
        f"  (the price table's first use in a process, import and parse, not in the ratio: {d['price_table_load_s']:.2f} s)",
    ]
    lines += _scale_lines(result["scale"], "SQLite")
    if "scale_postgresql" in result:
        lines += _scale_lines(result["scale_postgresql"], "PostgreSQL (four recorders' shards)")
    return lines


def _scale_lines(scaled: dict, database: str) -> list[str]:
    sizes = sorted(scaled)
    small, big = sizes[0], sizes[-1]
    lines = [f"  {database}:", f"  {'query':44} {small:>12,} {big:>12,}   ratio"]
    for label, t_small in scaled[small]["queries"].items():
        t_big = scaled[big]["queries"][label]
        lines.append(f"  {label:44} {t_small * 1e3:10.1f}ms {t_big * 1e3:10.1f}ms   {t_big / t_small:5.2f}")
    for label in ("stats --since 24h", "stats --all", "stats --all --by intent", "stats --all --by outcome",
                  "stats --all --by model", "stats --all --by day", "stats --all --by hour",
                  "overview (day, intent, model)"):
        t = scaled[big]["queries"][label]
        lines.append(f"  {label} at {big:,}: {t:.3f} s   target <= 1 s: {'met' if t <= 1 else 'NOT met'}")
    lines.append("  stats_rollup rows: " + ", ".join(
        f"{scaled[s]['rollup_rows']:,} for {s:,} executions" for s in sizes))
    if "merged_rollup_rows" in scaled[big]:
        lines.append("  after the prune that merged the shards of the days and hours that are over: " + ", ".join(
            f"{scaled[s]['merged_rollup_rows']:,} rows ({scaled[s]['prune_s']:.1f} s)" for s in sizes))
    lines.append("  (stores built with direct inserts: " + ", ".join(
        f"{s:,} in {scaled[s]['build_s']:.0f} s" for s in sizes) + ")")
    return lines
