"""Benchmark: compaction into PostgreSQL from 1 and from N concurrent recorders, next to SQLite.

    from benchmarks import pg
    result = pg.run("postgresql+psycopg://postgres@127.0.0.1:5432/test", events=200_000)
    for line in pg.report_lines(result):
        print(line)

or, from the project root, `python -m benchmarks.pg URL [--events N] [--recorders 1,4]`.

Each configuration gets a fresh schema of its own in the database the URL names (created, then
dropped; nothing else in the database is touched). Its `events` are split evenly over the
recorders; each recorder is a process with its own WAL directory and recorder id, filled first
(the same records the store writes: start, events, finish), then all of them run tracedb's
compactor at once, released by one barrier. The rate is all their events over the wall time from
that release to the last one done. SQLite runs the same compactor over the same WAL into a file,
one recorder (SQLite has one writer at a time).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import tempfile
import time
import uuid
from typing import Optional, Sequence

import sqlalchemy as sa

from .common import fill_store_wal, pg_command_line, print_result, rate_line, ratio_line


def _compact_worker(target: str, wal_dir: str, recorder_id: str, batch_records: int, barrier, out) -> None:
    """One recorder: migrate (once per schema, thanks to the advisory lock), wait for the
    others, compact its whole WAL, report (start, end, steps) on the monotonic clock."""
    import wal

    from tracedb.projection import db
    from tracedb.projection.compactor import Compactor

    engine = db.create_engine(target, write=True)
    try:
        db.migrate(engine)
        db.ensure_checkpoint(engine, recorder_id, 0)
        durable = wal.scan(wal_dir).last_lsn
        comp = Compactor(engine, wal_dir, recorder_id, 0, batch_records=batch_records)
        barrier.wait()
        t0 = time.monotonic()
        result = comp.compact(durable)
        t1 = time.monotonic()
        comp.close()
        out.put((t0, t1, result.steps))
    except BaseException as e:  # noqa: BLE001 - the parent reports it
        out.put(e)
        barrier.abort()
        raise
    finally:
        engine.dispose()


def run_fleet(target: str, workdir: str, recorders: int, events: int, events_per: int, batch_records: int,
              spacing_ns: int = 0, scattered_ids: bool = False) -> dict:
    """`recorders` processes, each with a WAL of its share of `events` (executions started
    `spacing_ns` apart; `scattered_ids`: see fill_store_wal), compacting into `target` at once:
    {"recorders", "events", "seconds", "events_per_s"}."""
    ctx = multiprocessing.get_context("spawn")
    per = max(1, events // recorders // events_per)
    dirs = []
    for k in range(recorders):
        d = tempfile.mkdtemp(prefix=f"rec{k}-", dir=workdir)
        fill_store_wal(os.path.join(d, "wal"), per, events_per, prefix=f"r{k}", spacing_ns=spacing_ns,
                       scattered_ids=scattered_ids)
        dirs.append(d)
    barrier = ctx.Barrier(recorders)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_compact_worker, args=(target, os.path.join(d, "wal"), f"bench-{k}", batch_records, barrier, out))
        for k, d in enumerate(dirs)
    ]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    start = min(r[0] for r in results)
    end = max(r[1] for r in results)
    steps = sum(r[2] for r in results)
    expected = per * events_per * recorders
    if steps != expected:
        raise AssertionError(f"compacted {steps} events where {expected} were written")
    return {"recorders": recorders, "events": steps, "seconds": end - start, "events_per_s": steps / (end - start)}


def _schema_url(pg_url: str, schema: str) -> str:
    url = sa.engine.make_url(pg_url).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False)


@contextlib.contextmanager
def bench_schema(admin, pg_url: str, made: list):
    """A fresh schema for one configuration, dropped when it is done: yields the URL whose
    search_path is that schema. Its name is appended to `made`."""
    schema = "tracedb_bench_" + uuid.uuid4().hex[:12]
    made.append(schema)
    with admin.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield _schema_url(pg_url, schema)
    finally:
        with admin.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')


def run(
    pg_url: str,
    events: int = 200_000,
    recorders: Sequence[int] = (1, 4),
    *,
    events_per_execution: int = 50,
    batch_records: int = 5000,
    workdir: Optional[str] = None,
    sqlite: bool = True,
) -> dict:
    """Compaction events/s into PostgreSQL for each recorder count, and into SQLite (one
    recorder), over `events` events per configuration. Returns
    {"postgresql": {"1": {...}, "4": {...}}, "sqlite": {"1": {...}}, "server": "...",
    "scaling": 4 vs 1, "pg_vs_sqlite": 1 recorder PostgreSQL vs SQLite}, each entry
    {"recorders", "events", "seconds", "events_per_s"}."""
    from tracedb.projection import db

    work = tempfile.mkdtemp(prefix="tracedb-bench-pg-", dir=workdir)
    admin = db.create_engine(pg_url)
    result: dict = {"postgresql": {}, "events": events, "events_per_execution": events_per_execution,
                    "schemas": []}
    try:
        with admin.connect() as conn:
            result["server"] = conn.exec_driver_sql("SHOW server_version").scalar()
        for n in recorders:
            # Each schema is created for this run and dropped at its end.
            with bench_schema(admin, pg_url, result["schemas"]) as url:
                result["postgresql"][str(n)] = run_fleet(url, work, n, events, events_per_execution, batch_records)
        if sqlite:
            path = os.path.join(work, "bench.db")
            result["sqlite"] = {"1": run_fleet(path, work, 1, events, events_per_execution, batch_records)}
    finally:
        admin.dispose()
        shutil.rmtree(work, ignore_errors=True)
    pg = result["postgresql"]
    if "1" in pg and len(pg) > 1:
        top = max(pg, key=int)
        result["scaling"] = pg[top]["events_per_s"] / pg["1"]["events_per_s"]
    if "1" in pg and "sqlite" in result:
        result["pg_vs_sqlite"] = pg["1"]["events_per_s"] / result["sqlite"]["1"]["events_per_s"]
    return result


def report_lines(result: dict) -> list[str]:
    """Human-readable lines for a `run` result, in scripts/bench's style."""
    lines = [f"  PostgreSQL {result.get('server', '?')}, {result['events']:,} events per run"]
    for n, r in sorted(result["postgresql"].items(), key=lambda kv: int(kv[0])):
        lines.append(rate_line(f"compaction WAL -> PostgreSQL, {n} recorder(s)", r["events_per_s"]))
    for n, r in result.get("sqlite", {}).items():
        lines.append(rate_line(f"compaction WAL -> SQLite, {n} recorder", r["events_per_s"]))
    if "scaling" in result:
        top = max(result["postgresql"], key=int)
        lines.append(ratio_line(f"PostgreSQL {top} recorders / 1 recorder", result["scaling"]))
    if "pg_vs_sqlite" in result:
        lines.append(ratio_line("PostgreSQL 1 recorder / SQLite", result["pg_vs_sqlite"]))
    return lines


def main() -> None:
    """`python -m benchmarks.pg URL`: run and print."""
    ap = pg_command_line(__doc__)
    ap.add_argument("--events", type=int, default=200_000, help="events per configuration")
    ap.add_argument("--recorders", default="1,4", help="comma-separated recorder counts")
    args = ap.parse_args()
    if not args.url:
        ap.error("give a PostgreSQL URL (or set TRACEDB_TEST_PG_URL)")
    result = run(args.url, events=args.events, recorders=tuple(int(x) for x in args.recorders.split(",")))
    print_result(result, args.json, report_lines)


if __name__ == "__main__":
    main()
