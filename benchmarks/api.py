"""The user's path: recording, compaction and replay through tracedb's public API.

Executions are started with the ids the store generates (no id passed), and many of them
record at once, so their events interleave in the log as an agent fleet's do. Payloads are given
by size (~200 or ~600 bytes of JSON). Every function returns raw figures (seconds, counts);
`benchmarks.run` formats them and puts them next to the layer beneath.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import sqlite3
import tempfile
import threading
import time
from typing import Callable, Optional

from .common import (
    CpuWindow,
    run_threads,
    AGENT_INTENT,
    EVENTS_PER_EXECUTION,
    agent_envelope,
    agent_event_type,
    agent_payload,
    agent_response,
    event_record,
)

# The store's background work stays as configured by default, except where a bench says so.
QUIET = {"idle_timeout_s": 0}


def _payloads(size: int) -> list[dict]:
    """A few payloads of about `size` bytes, differing only in their call number."""
    return [agent_payload(size, i) for i in range(1, EVENTS_PER_EXECUTION)]


# -- ingest: events/s and latency per event ------------------------------------------------------


def ingest_async(
    workdir: str, concurrency: int, size: int, seconds: float, warmup: float = 0.0,
    per_execution: int = EVENTS_PER_EXECUTION,
) -> dict:
    """`concurrency` asyncio tasks, each recording executions one after another through
    `tracedb.open_async`: `start`, `ex.event` x (per_execution - 1), `ex.finish`. An event counts
    (an `ex.event` or the `ex.finish`, each acknowledged once durable) when its call began and
    returned inside the measured `seconds`, after `warmup` seconds of the same load."""
    import tracedb

    d = tempfile.mkdtemp(dir=workdir)
    payloads = _payloads(size)

    async def main():
        store = await tracedb.open_async(os.path.join(d, "data"), config=QUIET)
        lat: list[float] = []
        counts = [0, 0]  # events, executions started in the measured part
        pc = time.perf_counter
        t0 = pc() + warmup
        stop = t0 + seconds

        async def agent(k: int) -> None:
            n = k
            while pc() < stop:
                t = pc()
                ex = await store.start(AGENT_INTENT, agent_envelope(n))
                if t >= t0:
                    counts[1] += 1
                for seq in range(1, per_execution):
                    t = pc()
                    await ex.event(agent_event_type(seq), payloads[seq - 1])
                    done = pc()
                    if t >= t0 and done <= stop:
                        lat.append(done - t)
                t = pc()
                await ex.finish(agent_response(n))
                done = pc()
                if t >= t0 and done <= stop:
                    lat.append(done - t)
                n += concurrency

        cpu = CpuWindow(t0, stop)
        await asyncio.gather(cpu.watch(), *(agent(k) for k in range(concurrency)))
        engine = "loop" if store.store.wal.loop_attached else "thread"
        await store.close()
        return lat, counts[1], engine, cpu.seconds

    lat, started, engine, cpu_s = asyncio.run(main())
    shutil.rmtree(d)
    return {"events_per_s": len(lat) / seconds, "lat": lat, "executions": started, "flushed_by": engine,
            "cpu_us_per_event": cpu_s / max(1, len(lat)) * 1e6}


def ingest_sync(
    workdir: str, threads: int, size: int, seconds: float, warmup: float = 0.0,
    per_execution: int = EVENTS_PER_EXECUTION,
) -> dict:
    """The same workload through the sync API (`tracedb.open`): `threads` threads, each
    recording executions one after another."""
    import tracedb

    d = tempfile.mkdtemp(dir=workdir)
    payloads = _payloads(size)
    store = tracedb.open(os.path.join(d, "data"), config=QUIET)
    lat: list[list[float]] = [[] for _ in range(threads)]
    pc = time.perf_counter
    t0 = pc() + warmup
    stop = t0 + seconds

    def agent(k: int) -> None:
        mine = lat[k]
        n = k
        while pc() < stop:
            ex = store.start(AGENT_INTENT, agent_envelope(n))
            for seq in range(1, per_execution):
                t = pc()
                ex.event(agent_event_type(seq), payloads[seq - 1])
                done = pc()
                if t >= t0 and done <= stop:
                    mine.append(done - t)
            t = pc()
            ex.finish(agent_response(n))
            done = pc()
            if t >= t0 and done <= stop:
                mine.append(done - t)
            n += threads

    cpu = CpuWindow(t0, stop)
    watcher = threading.Thread(target=cpu.watch_blocking)
    watcher.start()
    run_threads(agent, threads)
    watcher.join()
    store.close()
    shutil.rmtree(d)
    flat = [x for part in lat for x in part]
    return {"events_per_s": len(flat) / seconds, "lat": flat, "cpu_us_per_event": cpu.seconds / max(1, len(flat)) * 1e6}


def _generated_id() -> str:
    """An id of the kind the store generates."""
    try:
        from tracedb.records.ids import new_execution_id
    except ImportError:  # before generated ids had a module of their own
        import uuid

        return f"exec-{uuid.uuid4().hex}"
    return new_execution_id()


def wal_records(size: int, count: int = 256) -> list[bytes]:
    """The WAL records the store writes for events of `size`-byte payloads, for measuring the
    WAL alone with the same bytes."""
    out = []
    for i in range(count):
        seq = i % (EVENTS_PER_EXECUTION - 1) + 1
        out.append(event_record(_generated_id(), seq, agent_event_type(seq), agent_payload(size, seq), time.time_ns()))
    return out


# -- recording a store the way agents do --------------------------------------------------------


async def record_interleaved(
    astore, executions: int, concurrency: int = 64, size: int = 200,
    per_execution: int = EVENTS_PER_EXECUTION,
    pause: Optional[Callable[[], "asyncio.Future | None"]] = None,
    make_id: Optional[Callable[[], str]] = None,
) -> list[str]:
    """Record `executions` executions through an `AsyncStore`, `concurrency` at a time, with
    the ids the store generates (or, with `make_id`, ids the caller chooses); returns their ids
    in the order they started. `pause`, if given, is awaited (when it returns an awaitable)
    before each record: the compaction bench stops the agents there."""
    payloads = _payloads(size)
    ids: list[str] = []
    next_n = 0

    async def agent() -> None:
        nonlocal next_n
        while next_n < executions:
            n = next_n
            next_n += 1
            if pause is not None and (w := pause()) is not None:
                await w
            ex = await astore.start(AGENT_INTENT, agent_envelope(n), None if make_id is None else make_id())
            ids.append(ex.execution_id)
            for seq in range(1, per_execution):
                if pause is not None and (w := pause()) is not None:
                    await w
                await ex.event(agent_event_type(seq), payloads[seq - 1])
            if pause is not None and (w := pause()) is not None:
                await w
            await ex.finish(agent_response(n))

    await asyncio.gather(*(agent() for _ in range(min(concurrency, executions))))
    return ids


def build_store(data_dir: str, events: int, concurrency: int = 64, size: int = 200) -> tuple[list[str], float]:
    """A store of `events` events (executions of EVENTS_PER_EXECUTION), recorded through
    `tracedb.open_async` with the default configuration; closed when this returns.
    Returns the execution ids and the seconds it took."""
    import tracedb

    async def main() -> list[str]:
        astore = await tracedb.open_async(data_dir, config=QUIET)
        try:
            return await record_interleaved(astore, events // EVENTS_PER_EXECUTION, concurrency, size)
        finally:
            await astore.close()

    t0 = time.perf_counter()
    ids = asyncio.run(main())
    return ids, time.perf_counter() - t0


# -- compaction of a realistic recording --------------------------------------------------------


def compaction_interleaved(
    workdir: str, events: int, concurrency: int = 64, size: int = 200, chunk: int = 20_000,
    make_id: Optional[Callable[[], str]] = None,
) -> dict:
    """The recorder's own compaction of what agents record: executions started through
    `tracedb.open_async` with generated ids (or the caller's, from `make_id`), `concurrency` of
    them recording at once. The
    background compactor is off; instead the agents stop after every `chunk` records (the
    default `compact_batch_records`: a batch's worth, as the background compactor takes it),
    mid-execution, and `astore.compact()` is timed. In-process, as the library runs by default,
    the compactor takes the just-appended records from memory.

    Then the baseline: the same trace and step rows, read back from the result, inserted into a
    new database of the same schema with sqlite3's executemany in ONE transaction, in the order
    the log had them (steps by LSN); and the same again committed in as many transactions as
    the compactor committed (what committing in batches costs the database by itself). Returns
    the rates."""
    import tracedb

    d = tempfile.mkdtemp(dir=workdir)
    data = os.path.join(d, "data")
    executions = events // EVENTS_PER_EXECUTION
    timing = {"compact_s": 0.0, "steps": 0, "compactions": 0}

    async def main() -> None:
        astore = await tracedb.open_async(data, config={**QUIET, "compact_interval_ms": 0})
        store = astore.store
        base = store.durable_lsn
        gate: dict = {"mark": chunk, "future": None}
        loop = asyncio.get_running_loop()
        recorded = [0]

        def pause():
            recorded[0] += 1
            if recorded[0] <= gate["mark"]:
                return None
            if gate["future"] is None:
                gate["future"] = loop.create_future()
            return gate["future"]

        async def compact_now() -> None:
            t0 = time.perf_counter()
            res = await astore.compact()
            timing["compact_s"] += time.perf_counter() - t0
            timing["steps"] += res.steps
            timing["compactions"] += 1

        async def controller(task: asyncio.Task) -> None:
            while not task.done():
                await asyncio.sleep(0.001)
                fut = gate["future"]
                # Every agent is either waiting at the gate or finished: nothing is in flight.
                if fut is not None and store.durable_lsn - base >= gate["mark"]:
                    await compact_now()
                    gate["mark"] += chunk
                    gate["future"] = None
                    fut.set_result(None)

        task = asyncio.ensure_future(record_interleaved(astore, executions, concurrency, size, pause=pause,
                                                      make_id=make_id))
        await controller(task)
        await task
        await compact_now()
        assert store.durable_lsn == store.applied_lsn
        await astore.close()

    asyncio.run(main())
    n_steps = executions * EVENTS_PER_EXECUTION
    assert timing["steps"] == n_steps, (timing, n_steps)
    base_s = executemany_baseline(os.path.join(data, "traces.db"), os.path.join(d, "raw.db"))
    batched_s = executemany_baseline(
        os.path.join(data, "traces.db"), os.path.join(d, "raw-batched.db"), batches=timing["compactions"]
    )
    shutil.rmtree(d)
    return {
        "events": n_steps,
        "executions": executions,
        "compactions": timing["compactions"],
        "events_per_s": n_steps / timing["compact_s"],
        "raw_rows_per_s": n_steps / base_s,
        "raw_batched_rows_per_s": n_steps / batched_s,
    }


def executemany_baseline(source_db: str, target_db: str, batches: int = 1) -> float:
    """Copy the trace and step rows of `source_db` into a new, migrated `target_db` with
    sqlite3's executemany in one transaction; returns the seconds the insert and commit took
    (reading the rows back is not timed). Steps go in LSN order, traces in creation order.

    `batches` > 1: the same rows committed in that many transactions instead, as compaction
    commits them: the steps cut into runs of LSNs, each run's transaction inserting the traces
    started up to its last step first (a trace starts before its first step)."""
    from tracedb.projection import db

    src = sqlite3.connect(source_db)
    trace_cols = [r[1] for r in src.execute("PRAGMA table_info(traces)")]
    step_cols = [r[1] for r in src.execute("PRAGMA table_info(trace_steps)")]
    trace_rows = src.execute(f"SELECT {', '.join(trace_cols)} FROM traces ORDER BY created_at_ns, rowid").fetchall()
    step_rows = src.execute(f"SELECT {', '.join(step_cols)} FROM trace_steps ORDER BY lsn").fetchall()
    src.close()
    created = trace_cols.index("created_at_ns")
    recorded = step_cols.index("recorded_at_ns")
    per = -(-len(step_rows) // batches)
    plan = []  # (trace rows, step rows) a transaction
    t_at = 0
    for i in range(0, len(step_rows), per):
        steps = step_rows[i : i + per]
        last_t = max(r[recorded] for r in steps) if i + per < len(step_rows) else float("inf")
        t_end = t_at
        while t_end < len(trace_rows) and trace_rows[t_end][created] <= last_t:
            t_end += 1
        plan.append((trace_rows[t_at:t_end], steps))
        t_at = t_end

    engine = db.create_engine(target_db, write=True)
    db.migrate(engine)
    raw = engine.raw_connection()  # the same connection settings (pragmas) as the store's writer
    cur = raw.cursor()
    sql_t = f"INSERT INTO traces ({', '.join(trace_cols)}) VALUES ({', '.join('?' * len(trace_cols))})"
    sql_s = f"INSERT INTO trace_steps ({', '.join(step_cols)}) VALUES ({', '.join('?' * len(step_cols))})"
    t0 = time.perf_counter()
    for traces_of, steps_of in plan:
        cur.execute("BEGIN IMMEDIATE")
        cur.executemany(sql_t, traces_of)
        cur.executemany(sql_s, steps_of)
        cur.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    raw.close()
    engine.dispose()
    return elapsed


# -- replay from the store ----------------------------------------------------------------------


def replay_from_store(workdir: str, executions: int, samples: int = 2000) -> dict:
    """`store.get(id)` and exact replay of what it returns, for stored executions of
    EVENTS_PER_EXECUTION events recorded through the public API, next to the same two queries
    (the trace row, then its steps in seq order, in one read transaction) in raw sqlite3.

    The store is recorded, closed, and opened again with `tracedb.open` (a user reading what
    was recorded earlier). Ids are taken in a random order. Returns latency lists in seconds."""
    import tracedb
    from tracedb import ReplayEngine

    d = tempfile.mkdtemp(dir=workdir)
    data = os.path.join(d, "data")
    ids, _ = build_store(data, executions * EVENTS_PER_EXECUTION)
    rng = random.Random(7)
    picks = [rng.choice(ids) for _ in range(samples)]

    get_lat, replay_lat, both_lat = [], [], []
    pc = time.perf_counter
    with tracedb.open(data, config={**QUIET, "compact_interval_ms": 0}) as store:
        for eid in picks[:50]:  # warm the connection pool and the page cache
            ReplayEngine(store.get(eid)).replay()
        for eid in picks:
            t0 = pc()
            record = store.get(eid)
            t1 = pc()
            result = ReplayEngine(record).replay()
            t2 = pc()
            get_lat.append(t1 - t0)
            replay_lat.append(t2 - t1)
            both_lat.append(t2 - t0)
        assert len(record.events) == EVENTS_PER_EXECUTION and result.payload["answer"] == "Paris"

    con = sqlite3.connect(f"file:{os.path.join(data, 'traces.db')}?mode=ro", uri=True, isolation_level=None)
    q_trace = "SELECT * FROM traces WHERE execution_id = ?"
    q_steps = ("SELECT seq, type, payload, recorded_at_ns FROM trace_steps WHERE execution_id = ? "
               "ORDER BY seq")
    raw_lat = []

    def raw_get(eid: str):
        con.execute("BEGIN")
        row = con.execute(q_trace, (eid,)).fetchone()
        steps = con.execute(q_steps, (eid,)).fetchall()
        con.execute("COMMIT")
        return row, steps

    for eid in picks[:50]:
        raw_get(eid)
    for eid in picks:
        t0 = pc()
        row, steps = raw_get(eid)
        raw_lat.append(pc() - t0)
    assert row is not None and len(steps) == EVENTS_PER_EXECUTION
    con.close()
    shutil.rmtree(d)
    return {"executions": len(ids), "get": get_lat, "replay": replay_lat, "get_and_replay": both_lat,
            "raw_sqlite3": raw_lat}
