"""Benchmark: retention against ingest, in the same run, on SQLite and on PostgreSQL.

    from benchmarks import retention
    result = retention.run(workdir, pg_url, events=1_000_000)
    for line in retention.report_lines(result):
        print(line)

or, from the project root, `python -m benchmarks.retention [URL] [--events N]`.

Ingest is what retention has to keep up with: the events/s that one recorder compacts into SQLite,
and that a fleet of four recorders compacts into one PostgreSQL database (benchmarks.pg's fleet,
the recorders released at once). The executions they record have ids in no time order (a hash,
as random as the uuid4 ids a caller chooses) and are spread evenly over 33 days; prune, run next
with a 30-day cutoff, deletes the oldest 3 days (a nightly prune that missed two nights; about a
tenth of the store) and keeps the rest. One execution in a hundred is pinned, and one young
execution in a hundred is a fork of an old one (its parent is kept). On PostgreSQL the tables are
then vacuumed and analyzed, as autovacuum keeps a store that has been running for a while.
Prune's rate is the steps it deleted over its whole wall time, the space given back included
(what `tracedb prune` takes from cron).
Target: prune's steps/s at least twice the ingest's events/s of the same database.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Optional

import sqlalchemy as sa

from .common import T0_NS, pg_command_line, print_result, rate_line, ratio_line

DAY_NS = 86_400 * 10**9
RETENTION_DAYS = 30
HISTORY_DAYS = RETENTION_DAYS + 3
TARGET = 2.0


def _mark_pins_and_forks(engine) -> tuple[int, int]:
    """Pin one execution in a hundred; make one young execution in a hundred a fork of an old
    one. Returns (pinned, forks)."""
    from tracedb.projection.models import traces

    t = traces.c
    cutoff = T0_NS + (HISTORY_DAYS - RETENTION_DAYS) * DAY_NS
    with engine.begin() as conn:
        ids = conn.execute(sa.select(t.execution_id, t.created_at_ns).order_by(t.created_at_ns, t.execution_id)).all()
        pins = [r.execution_id for r in ids[::100]]
        pinned = set(pins)
        # Parents among the old traces prune would delete were they not parents.
        old = [r.execution_id for r in ids if r.created_at_ns < cutoff and r.execution_id not in pinned]
        young = [r.execution_id for r in ids if r.created_at_ns >= cutoff]
        conn.execute(traces.update().where(t.execution_id.in_(pins)).values(pinned=True))
        forks = 0
        for k, eid in enumerate(young[::100]):
            if not old:
                break
            conn.execute(
                traces.update().where(t.execution_id == eid)
                .values(parent_execution_id=old[(k * 37) % len(old)], forked_at_seq=1)
            )
            forks += 1
    return len(pins), forks


def _prune(target: str, fleet: dict) -> dict:
    """Pins and forks, then one timed prune with the 30-day cutoff; its figures next to the
    fleet's."""
    from tracedb.projection import db
    from tracedb.maintenance.retention import prune

    engine = db.create_engine(target, write=True)
    try:
        pinned, forks = _mark_pins_and_forks(engine)
        if engine.dialect.name == "postgresql":
            # The store as autovacuum keeps it: statistics, and the visibility map of rows that
            # no one has deleted. Right after the bulk load the planner knows no row counts, and
            # prune's first VACUUM would pay for the whole load's.
            with engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                    "VACUUM (ANALYZE) traces, trace_steps")
        now_ns = T0_NS + HISTORY_DAYS * DAY_NS
        t0 = time.perf_counter()
        res = prune(engine, RETENTION_DAYS * 86_400, now_ns=now_ns)
        seconds = time.perf_counter() - t0
        with engine.connect() as conn:
            from tracedb.projection.models import trace_steps

            left = conn.execute(sa.select(sa.func.count()).select_from(trace_steps)).scalar()
    finally:
        engine.dispose()
    if res.deleted_steps + left != fleet["events"] or res.deleted_traces == 0:
        raise AssertionError(f"prune deleted {res.deleted_steps} steps and left {left} of {fleet['events']}")
    steps_per_s = res.deleted_steps / seconds
    return {
        "ingest": fleet,
        "prune": {"deleted_traces": res.deleted_traces, "deleted_steps": res.deleted_steps,
                  "kept_pinned": res.kept_pinned, "kept_parents": res.kept_parents, "pinned": pinned,
                  "forks": forks, "bytes_freed": res.bytes_freed, "seconds": seconds,
                  "steps_per_s": steps_per_s},
        "ratio": steps_per_s / fleet["events_per_s"],
    }


def run(workdir: str, pg_url: Optional[str], events: int = 1_000_000, *, recorders: int = 4,
        events_per_execution: int = 50, batch_records: int = 5000) -> dict:
    """Ingest, then prune, on SQLite (one recorder) and, given `pg_url`, on PostgreSQL
    (`recorders` recorders), each in a database of its own. Returns {"sqlite": {...},
    "postgresql": {...}, "target": 2.0}, each {"ingest", "prune", "ratio", "met"}."""
    from . import pg

    work = tempfile.mkdtemp(prefix="tracedb-bench-retention-", dir=workdir)
    result: dict = {"events": events, "target": TARGET, "retention_days": RETENTION_DAYS,
                    "history_days": HISTORY_DAYS}

    def spacing(n: int) -> int:
        per = max(1, events // n // events_per_execution)
        return HISTORY_DAYS * DAY_NS // per

    try:
        path = os.path.join(work, "traces.db")
        fleet = pg.run_fleet(path, work, 1, events, events_per_execution, batch_records, spacing(1), True)
        result["sqlite"] = _prune(path, fleet)
        if pg_url:
            from tracedb.projection import db

            admin = db.create_engine(pg_url)
            result["schemas"] = []
            try:
                with pg.bench_schema(admin, pg_url, result["schemas"]) as url:
                    fleet = pg.run_fleet(url, work, recorders, events, events_per_execution, batch_records,
                                         spacing(recorders), True)
                    result["postgresql"] = _prune(url, fleet)
            finally:
                admin.dispose()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name in ("sqlite", "postgresql"):
        if name in result:
            result[name]["met"] = result[name]["ratio"] >= TARGET
    return result


def report_lines(result: dict) -> list[str]:
    """Lines in scripts/bench's style, with the target and whether this run met it."""
    lines = [f"  {result['events']:,} events over {result['history_days']} days, pruned at"
             f" {result['retention_days']} days"]
    for name, label in (("sqlite", "SQLite, 1 recorder"), ("postgresql", "PostgreSQL, fleet of 4 recorders")):
        r = result.get(name)
        if r is None:
            continue
        p = r["prune"]
        lines.append(rate_line(f"ingest: compaction into {label} (events)", r["ingest"]["events_per_s"]))
        lines.append(rate_line(f"prune {label.split(',')[0]}: {p['deleted_steps']:,} steps", p["steps_per_s"])
                     + f"   {p['seconds']:.2f} s, {p['bytes_freed'] / 1e6:.1f} MB given back,"
                       f" kept {p['kept_pinned']} pinned, {p['kept_parents']} parents")
        lines.append(ratio_line(f"prune steps/s / ingest events/s ({name})", r["ratio"]))
        lines.append(f"    target >= {result['target']:g}x: {'met' if r['met'] else 'NOT met'}")
    return lines


def main() -> None:
    """`python -m benchmarks.retention [URL]`: run and print."""
    ap = pg_command_line(__doc__, "; none: SQLite only")
    ap.add_argument("--events", type=int, default=1_000_000, help="events per database")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    result = run(args.workdir or tempfile.gettempdir(), args.url, events=args.events)
    print_result(result, args.json, report_lines)


if __name__ == "__main__":
    main()
