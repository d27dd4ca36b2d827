"""The sidecar through its real clients: `tracedb.connect_async()` and `tracedb.connect()`, next
to the bench's own loader (pre-encoded frames), all recording the same nested ~700-byte LLM
response as each event's payload.

    from benchmarks import sidecar_clients
    result = sidecar_clients.run(clients=32, window=16, seconds=3.0)

or `python -m benchmarks.sidecar_clients [seconds] [window]`.

Every row gets a fresh `tracedb serve`. The figures of a row: acknowledged events/s, ack latency
(p50, p99: from the call that sent the event to its acknowledgement), and CPU per acknowledged
event of the `serve` process, of its compactor child, and of this process (the clients), read
from /proc over the measured window. `wal_append` is the WAL's own append of the same payload
(512 asyncio producers, group commit, in this process): the floor of what `serve` spends.
"""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Optional

import orjson

from .common import LLM_RESPONSE, pct
from .sidecar import Loader, Plan, cpu_s, start_server, stop_server

ENVELOPE = {"intent": "ProcessIntent", "payload": {"q": "capital of France"}, "metadata": {"requestId": "r-1"}}


def _childrencpu_s(pid: int) -> float:
    """CPU seconds of the direct children of `pid` (the compactor process), from /proc."""
    total = 0.0
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):  # a child is listed under the thread that forked it
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(k) for k in f.read().split()]
    except OSError:
        return float("nan")
    for k in kids:
        total += cpu_s(k)
    return total


class _Meter:
    """CPU of the server, of its children and of this process over the measured window."""

    def __init__(self, pid: int):
        self.pid = pid
        self.at: Optional[tuple] = None
        self.server_s = self.compactor_s = self.client_s = float("nan")

    def start(self) -> None:
        self.at = (cpu_s(self.pid), _childrencpu_s(self.pid), time.process_time())

    def stop(self) -> None:
        s0, c0, p0 = self.at
        self.server_s = cpu_s(self.pid) - s0
        self.compactor_s = _childrencpu_s(self.pid) - c0
        self.client_s = time.process_time() - p0


# -- the loader, with the same payload ----------------------------------------------------------


async def _drive_loader(sock: str, clients: int, window: int, seconds: float, warmup: float,
                        meter: _Meter, per_exec: int) -> tuple[int, float, list]:
    loop = asyncio.get_running_loop()
    lat: list[float] = []
    measure_from = time.perf_counter() + warmup
    plan = Plan(window, per_exec, measure_from, measure_from + seconds, lat, orjson.dumps(LLM_RESPONSE))
    loop.call_later(warmup, meter.start)
    waits, loaders = [], []
    for i in range(clients):
        done = loop.create_future()
        waits.append(done)
        _t, proto = await loop.create_unix_connection(lambda i=i, done=done: Loader(i, plan, done), sock)
        loaders.append(proto)
    await asyncio.gather(*waits)
    meter.stop()
    elapsed = time.perf_counter() - measure_from
    for p in loaders:
        p.transport.close()
    errors = sum(p.errors for p in loaders)
    if errors:
        raise RuntimeError(f"loader: {errors} errors, first {loaders[0].first_error!r}")
    return sum(p.acked_events for p in loaders), elapsed, lat


# -- connect_async --------------------------------------------------------------------------


async def _drive_async(sock: str, clients: int, window: int, seconds: float, warmup: float,
                       meter: _Meter, per_exec: int) -> tuple[int, float, list]:
    from tracedb import client as tracedb

    loop = asyncio.get_running_loop()
    lat: list[float] = []
    measure_from = time.perf_counter() + warmup
    stop_at = measure_from + seconds
    loop.call_later(warmup, meter.start)
    acked = [0]

    async def one(k: int) -> None:
        pc = time.perf_counter
        client = await tracedb.connect_async(sock, embedded=False)
        inflight: collections.deque = collections.deque()
        try:
            while pc() < stop_at:
                t = pc()
                ex = await client.start("ProcessIntent", ENVELOPE)
                if t >= measure_from:
                    lat.append(pc() - t)
                    acked[0] += 1
                for i in range(per_exec + 1):
                    if len(inflight) >= window:
                        t, aw = inflight.popleft()
                        await aw
                        now = pc()
                        if t >= measure_from and now < stop_at + 1:
                            lat.append(now - t)
                            acked[0] += 1
                    t = pc()
                    if i < per_exec:
                        inflight.append((t, ex.event("llm.responded", LLM_RESPONSE)))
                    else:
                        inflight.append((t, ex.finish({"status": "success"})))
                    if t >= stop_at:
                        break
                while inflight:
                    t, aw = inflight.popleft()
                    await aw
                    if t >= measure_from:
                        lat.append(pc() - t)
                        acked[0] += 1
        finally:
            await client.close()

    await asyncio.gather(*(one(k) for k in range(clients)))
    meter.stop()
    return acked[0], time.perf_counter() - measure_from, lat


# -- connect (sync: one request in flight per thread) -------------------------------------------


def _drive_sync(sock: str, threads: int, seconds: float, warmup: float, meter: _Meter,
                per_exec: int) -> tuple[int, float, list]:
    from tracedb import client as tracedb

    lat: list[float] = []
    acked = [0]
    lock = threading.Lock()
    measure_from = time.perf_counter() + warmup
    stop_at = measure_from + seconds
    timer = threading.Timer(warmup, meter.start)

    def one() -> None:
        pc = time.perf_counter
        mine: list[float] = []
        with tracedb.connect(sock, embedded=False) as client:
            while pc() < stop_at:
                t = pc()
                ex = client.start("ProcessIntent", ENVELOPE)
                if t >= measure_from:
                    mine.append(pc() - t)
                for i in range(per_exec + 1):
                    t = pc()
                    if t >= stop_at:
                        break
                    if i < per_exec:
                        ex.event("llm.responded", LLM_RESPONSE)
                    else:
                        ex.finish({"status": "success"})
                    if t >= measure_from:
                        mine.append(pc() - t)
        with lock:
            lat.extend(mine)
            acked[0] += len(mine)

    timer.start()
    ts = [threading.Thread(target=one) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    meter.stop()
    return acked[0], time.perf_counter() - measure_from, lat


# -- the WAL's own append ---------------------------------------------------------------------


def wal_append(workdir: str, seconds: float, warmup: float, producers: int = 512) -> dict:
    """The WAL's own append of a record the size of an LLM event: events/s and CPU per event."""
    from .run import bench_wal_async

    record = orjson.dumps({"op": "event", "id": "exec-000000000001", "seq": 1, "type": "llm.responded",
                           "payload": LLM_RESPONSE, "t": 1_700_000_000_000_000_000})
    r = bench_wal_async(workdir, producers, seconds, warmup=warmup, payloads=[record],
                        label=f"WAL append, {producers} producers, {len(record)}-byte records")
    return {"events_per_s": r["rate"], "cpu_us_per_event": r["cpu_us_per_event"]}


# -- one row each ----------------------------------------------------------------------------

KINDS = ("loader", "connect_async", "connect")


def run(clients: int = 32, window: int = 16, seconds: float = 3.0, *, warmup: float = 1.0,
        workdir: Optional[str] = None, per_exec: int = 100, kinds=KINDS, sync_threads: int = 32,
        quiet: bool = False, server_args=()) -> dict:
    """One fresh `tracedb serve` per kind; returns {kind: figures, "wal_append": figures}."""
    out: dict = {}
    base = tempfile.mkdtemp(prefix="tdb-bench-clients-", dir=workdir)
    try:
        for kind in kinds:
            data_dir = os.path.join(base, kind)
            os.makedirs(data_dir, mode=0o700)
            proc, sock = start_server(data_dir, extra_args=server_args)
            meter = _Meter(proc.pid)
            try:
                if kind == "loader":
                    acked, elapsed, lat = asyncio.run(
                        _drive_loader(sock, clients, window, seconds, warmup, meter, per_exec))
                elif kind == "connect_async":
                    acked, elapsed, lat = asyncio.run(
                        _drive_async(sock, clients, window, seconds, warmup, meter, per_exec))
                else:
                    acked, elapsed, lat = _drive_sync(sock, sync_threads, seconds, warmup, meter, per_exec)
            finally:
                stop_server(proc)
            lat.sort()
            r = {
                "clients": sync_threads if kind == "connect" else clients,
                "window": 1 if kind == "connect" else window,
                "acked": acked,
                "events_per_s": acked / elapsed,
                "p50_ms": pct(lat, 0.50) * 1e3,
                "p99_ms": pct(lat, 0.99) * 1e3,
                "serve_cpu_us": meter.server_s / max(1, acked) * 1e6,
                "compactor_cpu_us": meter.compactor_s / max(1, acked) * 1e6,
                "client_cpu_us": meter.client_s / max(1, acked) * 1e6,
            }
            out[kind] = r
            if not quiet:
                print(f"  {kind:<14} {r['clients']:>2} x {r['window']:<2} {r['events_per_s']:>9,.0f}/s"
                      f"  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms"
                      f"  CPU/event: serve {r['serve_cpu_us']:5.1f} µs, compactor {r['compactor_cpu_us']:5.1f} µs,"
                      f" client {r['client_cpu_us']:5.1f} µs", flush=True)
        out["wal_append"] = wal_append(base, seconds, warmup)
        if not quiet:
            w = out["wal_append"]
            print(f"  WAL append (in process)  {w['events_per_s']:>9,.0f}/s  CPU {w['cpu_us_per_event']:.1f} µs/event")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


if __name__ == "__main__":  # python -m benchmarks.sidecar_clients [seconds] [window]
    run(seconds=float(sys.argv[1]) if len(sys.argv) > 1 else 3.0,
        window=int(sys.argv[2]) if len(sys.argv) > 2 else 16)
