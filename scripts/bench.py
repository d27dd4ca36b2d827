"""tracedb benchmarks: this project and its baselines side by side, in one run, with ratios.

Run through `scripts/bench` (which sets up the virtualenv). The machines are shared and noisy:
compare the ratios printed by one run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from typing import Callable

import orjson

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import wal  # noqa: E402

RESULTS: dict = {}


def event_payload(i: int) -> dict:
    """A ~200-byte JSON event, the shape an agent records for a tool call."""
    return {
        "op": "event",
        "id": "exec-000000000001",
        "seq": i,
        "type": "tool.responded",
        "payload": {
            "tool": "web_search",
            "args": {"q": "capital of France"},
            "result": "Paris is the capital of France.",
            "latency_ms": 12,
        },
        "t": 1763800000000000000 + i,
    }


def pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def row(name: str, rate: float, lat: list[float] | None = None, extra: str = "") -> dict:
    lat = sorted(lat or [])
    out = {"name": name, "rate": rate}
    if lat:
        out["p50_ms"] = pct(lat, 0.50) * 1e3
        out["p99_ms"] = pct(lat, 0.99) * 1e3
    text = f"  {name:<52} {rate:>12,.0f}/s"
    if lat:
        text += f"   p50 {out['p50_ms']:7.3f} ms   p99 {out['p99_ms']:7.3f} ms"
    print(text + (f"   {extra}" if extra else ""), flush=True)
    return out


def ratio(label: str, a: float, b: float) -> None:
    print(f"  ratio {label:<46} {a / b:10.1f}x", flush=True)


# -- WAL ---------------------------------------------------------------------------------


def bench_wal_async(workdir: str, producers: int, seconds: float) -> dict:
    """Acknowledged events/s and ack latency: `producers` asyncio tasks, one append at a time."""
    d = tempfile.mkdtemp(dir=workdir)
    payloads = [orjson.dumps(event_payload(i)) for i in range(256)]

    async def main():
        aw = wal.AsyncWal(wal.open_wal(d))
        lat: list[float] = []
        count = 0
        stop = time.perf_counter() + seconds

        async def producer(k: int):
            nonlocal count
            pc = time.perf_counter
            p = payloads[k % 256]
            while pc() < stop:
                t = pc()
                await aw.append(p)
                lat.append(pc() - t)
                count += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(producer(k) for k in range(producers)))
        elapsed = time.perf_counter() - t0
        stats = aw.stats()
        await aw.close()
        return count / elapsed, lat, stats

    rate, lat, stats = asyncio.run(main())
    shutil.rmtree(d)
    return row(
        f"tracedb WAL, {producers} producers",
        rate,
        lat,
        f"avg group {stats.appends / max(1, stats.groups):.1f}",
    )


def _threads(n: int, seconds: float, make_worker: Callable[[int], Callable[[], None]]):
    lat: list[list[float]] = [[] for _ in range(n)]
    stop = time.perf_counter() + seconds
    workers = [make_worker(k) for k in range(n)]

    def run(k: int):
        pc = time.perf_counter
        w = workers[k]
        mine = lat[k]
        while pc() < stop:
            t = pc()
            w()
            mine.append(pc() - t)

    ts = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    flat = [x for part in lat for x in part]
    return len(flat) / elapsed, flat


def bench_intentusnet(workdir: str, producers: int, seconds: float) -> dict:
    """IntentusNet's own WALWriter (fsync per append), or an equivalent loop if not installed."""
    d = tempfile.mkdtemp(dir=workdir)
    try:
        from intentusnet.wal.models import WALEntryType
        from intentusnet.wal.writer import WALWriter

        writer = WALWriter(d, "exec-bench").__enter__()

        def make(k):
            return lambda: writer.append(WALEntryType.STEP_STARTED, event_payload(k)["payload"])

        label = f"intentusnet WALWriter (fsync/append), {producers} thr"
    except ImportError:
        f = open(os.path.join(d, "events.jsonl"), "a", encoding="utf-8")
        lock = threading.Lock()

        def make(k):
            def append():
                with lock:
                    f.write(json.dumps(event_payload(k)) + "\n")
                    f.flush()
                    os.fsync(f.fileno())

            return append

        label = f"JSONL fsync-per-append loop, {producers} thr"
    rate, lat = _threads(producers, seconds, make)
    shutil.rmtree(d)
    return row(label, rate, lat)


def bench_sqlite_commit(workdir: str, seconds: float) -> dict:
    """SQLite, one transaction per event, journal_mode=WAL, synchronous=FULL."""
    d = tempfile.mkdtemp(dir=workdir)
    con = sqlite3.connect(os.path.join(d, "b.db"), isolation_level=None, check_same_thread=False)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, body BLOB)")
    i = 0

    def make(_k):
        def append():
            nonlocal i
            i += 1
            con.execute("BEGIN")
            con.execute("INSERT INTO events (body) VALUES (?)", (orjson.dumps(event_payload(i)),))
            con.execute("COMMIT")

        return append

    rate, lat = _threads(1, seconds, make)
    con.close()
    shutil.rmtree(d)
    return row("SQLite commit per event (WAL, synchronous=FULL)", rate, lat)


def bench_recovery_scan(workdir: str, records: int) -> dict:
    d = tempfile.mkdtemp(dir=workdir)
    w = wal.open_wal(d)
    batch = [orjson.dumps(event_payload(i)) for i in range(10_000)]
    for _ in range(records // len(batch)):
        w.append_many(batch)
    w.close()
    t0 = time.perf_counter()
    result = wal.scan(d)
    elapsed = time.perf_counter() - t0
    assert result.records == records, result
    shutil.rmtree(d)
    return row(f"WAL recovery scan ({records:,} records)", records / elapsed)


def section_wal(args, workdir: str) -> None:
    print("\n== WAL: acknowledged events (ack only after fdatasync), ~200-byte JSON events")
    s = args.seconds
    ours = {n: bench_wal_async(workdir, n, s) for n in (1, 8, 64)}
    base = {n: bench_intentusnet(workdir, n, s) for n in (1, 8, 64)}
    sqlite_row = bench_sqlite_commit(workdir, s)
    scan_row = bench_recovery_scan(workdir, args.scan_records)
    for n in (1, 8, 64):
        ratio(f"WAL {n} producers / fsync-per-append {n} thr", ours[n]["rate"], base[n]["rate"])
    ratio("WAL 64 producers / fsync-per-append 1 thr", ours[64]["rate"], base[1]["rate"])
    ratio("WAL 64 producers / SQLite commit per event", ours[64]["rate"], sqlite_row["rate"])
    RESULTS["wal"] = {
        "tracedb": ours,
        "fsync_per_append": base,
        "sqlite_commit_per_event": sqlite_row,
        "recovery_scan": scan_row,
    }
    print(
        "  targets: >= 150,000 ev/s at 64 producers with p99 <= 10 ms; recovery scan >= 500,000 rec/s"
    )


SECTIONS = {"wal": section_wal}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    ap.add_argument("--seconds", type=float, default=3.0, help="duration of each throughput run")
    ap.add_argument("--scan-records", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="short runs (a smoke test, not figures)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--workdir", default=None, help="where temporary data goes (default ./bench-out)")
    args = ap.parse_args()
    if args.quick:
        args.seconds = 0.5
        args.scan_records = 100_000
    workdir = args.workdir or os.path.join(ROOT, "bench-out")
    os.makedirs(workdir, exist_ok=True)
    print(
        f"tracedb bench: {platform.platform()}, {os.cpu_count()} cpus, Python {platform.python_version()}"
    )
    for name in args.only.split(","):
        SECTIONS[name.strip()](args, workdir)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(RESULTS, f, indent=2, default=str)


if __name__ == "__main__":
    main()
