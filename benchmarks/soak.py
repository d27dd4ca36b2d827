"""Soak: `tracedb serve` under steady load for a long while, pruned and killed on a schedule.

    scripts/soak [--minutes 10] [--writers 4] [--prune-every 30] [--kill-every 60] [--data-dir D]

Writer threads record executions (a start, five events, a finish) through the sync client.
Every `--prune-every` seconds `tracedb prune --older-than 120s` runs from another process; every
`--kill-every` seconds the recorder is SIGKILLed and started again. After each restart (recovery
has compacted everything by the time it listens) every event acknowledged in the last 100 s
(older ones may have been pruned) is looked up in the database: one missing is a failure. Every
10 s a line gives the recorder's RSS, its open descriptors, the WAL's bytes on disk, the
database's size and the acknowledged events so far. Exit 1 if anything acknowledged was lost.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque

from tracedb import errors as E
from tracedb.sidecar.client import Client, RecorderUnavailableError

from .sidecar import accepts

PRUNE_AGE_S = 120
CHECK_WINDOW_S = 100  # younger than the prune age, with a margin for clocks and slow batches


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def _proc_rss_fds(pid: int) -> tuple[int, int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return 0, 0


class Recorder:
    """The `tracedb serve` subprocess, started again after each kill."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.socket = os.path.join(data_dir, "tracedb.sock")
        self.log = open(os.path.join(data_dir, "serve.log"), "ab")
        self.proc = None
        self.restarts = 0

    def start(self) -> float:
        t0 = time.monotonic()
        env = dict(os.environ)
        env.pop("TRACEDB_SIDECAR", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tracedb", "--data-dir", self.data_dir, "serve", "--log-format", "json"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, env=env,
        )
        while not accepts(self.socket):
            if self.proc.poll() is not None:
                raise SystemExit(f"soak: tracedb serve exited {self.proc.returncode}; see {self.log.name}")
            time.sleep(0.05)
        return time.monotonic() - t0

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.restarts += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


class Load:
    """Writer threads; `acked` holds (wall time of the start, execution id, events acknowledged)."""

    def __init__(self, address: str, writers: int):
        self.address = address
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: deque = deque()
        self.events = 0
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(writers)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _run(self, n: int) -> None:
        client = None
        payload = {"tool": "search", "args": {"q": "x" * 200}}
        while not self.stop.is_set():
            try:
                if client is None:
                    client = Client(self.address, reconnect_timeout_s=60, connect_timeout_s=30)
                began = time.time()
                ex = client.start("soak.run", {"intent": "soak.run", "writer": n})
                entry = [began, ex.execution_id, 0]
                with self.lock:
                    self.acked.append(entry)
                for _ in range(5):
                    ex.event("tool.requested", payload)
                    entry[2] += 1
                    with self.lock:
                        self.events += 1
                ex.finish({"status": "success", "payload": {"ok": True}})
                entry[2] += 1
                with self.lock:
                    self.events += 1
            except E.ExecutionClosedError:
                continue  # recovery closed it after a kill: start another
            except RecorderUnavailableError:
                if client is not None:
                    client.close()
                client = None
            except Exception as e:  # noqa: BLE001 - reported at the end
                self.errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.5)
        if client is not None:
            client.close()

    def to_check(self, now: float) -> list:
        with self.lock:
            while self.acked and self.acked[0][0] < now - CHECK_WINDOW_S:
                self.acked.popleft()
            return [(eid, n) for _t, eid, n in self.acked if n]


def check(db_path: str, expected: list) -> list:
    """The (id, acknowledged, stored) of every execution with fewer events stored than acknowledged."""
    missing = []
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)
    try:
        for i in range(0, len(expected), 500):
            chunk = expected[i : i + 500]
            marks = ",".join("?" * len(chunk))
            stored = dict(conn.execute(
                f"SELECT execution_id, last_seq FROM traces WHERE execution_id IN ({marks})", [e for e, _ in chunk]
            ).fetchall())
            for eid, n in chunk:
                if stored.get(eid, -1) < n:
                    missing.append((eid, n, stored.get(eid)))
    finally:
        conn.close()
    return missing


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--prune-every", type=float, default=30.0, help="seconds between prunes")
    ap.add_argument("--kill-every", type=float, default=60.0, help="seconds between SIGKILLs")
    ap.add_argument("--data-dir", help="default: a new temporary directory")
    args = ap.parse_args(argv)
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="tracedb-soak-")
    os.makedirs(data_dir, exist_ok=True)
    rec = Recorder(data_dir)
    rec.start()
    load = Load(rec.socket, args.writers)
    load.start()
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    next_prune = t0 + args.prune_every
    next_kill = t0 + args.kill_every
    next_line = t0
    last_events, last_t = 0, t0
    checked = lost = prunes = prune_failures = 0
    print(f"soak: {args.minutes:g} min, {args.writers} writers, prune every {args.prune_every:g} s, "
          f"SIGKILL every {args.kill_every:g} s; data in {data_dir}")
    print(f"{'t_s':>6} {'events':>9} {'ev/s':>7} {'rss_MB':>7} {'fds':>4} {'wal_MB':>7} {'db_MB':>7} restarts")
    prune_proc = None
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_line:
            rss, fds = _proc_rss_fds(rec.proc.pid)
            ev = load.events
            rate = (ev - last_events) / max(now - last_t, 1e-9)
            last_events, last_t = ev, now
            db = sum(os.path.getsize(p) for p in (os.path.join(data_dir, "traces.db"), os.path.join(data_dir, "traces.db-wal")) if os.path.exists(p))
            print(f"{now - t0:6.0f} {ev:9d} {rate:7.0f} {rss / 2**20:7.1f} {fds:4d} "
                  f"{_dir_bytes(os.path.join(data_dir, 'wal')) / 2**20:7.1f} {db / 2**20:7.1f} {rec.restarts:8d}", flush=True)
            next_line = now + 10
        if prune_proc is not None and prune_proc.poll() is not None:
            prunes += 1
            if prune_proc.returncode != 0:
                prune_failures += 1
                print(f"soak: prune exited {prune_proc.returncode}: {prune_proc.stderr.read().decode()[-500:]}")
            prune_proc = None
        if now >= next_prune and prune_proc is None:
            prune_proc = subprocess.Popen(
                [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "prune", "--older-than", f"{PRUNE_AGE_S}s", "--json"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )
            next_prune = now + args.prune_every
        if now >= next_kill:
            rec.kill()
            # What the killed recorder acknowledged (nothing is acknowledged while none runs);
            # recovery has compacted all of it by the time the new one listens.
            expected = load.to_check(time.time())
            took = rec.start()
            missing = check(os.path.join(data_dir, "traces.db"), expected)
            checked += len(expected)
            lost += len(missing)
            print(f"soak: SIGKILL #{rec.restarts}, back in {took:.1f} s; {len(expected)} executions acknowledged "
                  f"in the last {CHECK_WINDOW_S} s checked, {len(missing)} short{': ' + str(missing[:3]) if missing else ''}",
                  flush=True)
            next_kill = time.monotonic() + args.kill_every
        time.sleep(0.2)
    load.stop.set()
    for t in load.threads:
        t.join(90)
    if prune_proc is not None:
        prune_proc.wait(120)
    rec.stop()
    print(f"soak: {load.events} events acknowledged, {rec.restarts} SIGKILLs, {prunes} prunes "
          f"({prune_failures} failed), {checked} execution checks, {lost} short; "
          f"writer errors: {len(load.errors)}{' ' + str(load.errors[:3]) if load.errors else ''}")
    return 1 if lost or prune_failures else 0


if __name__ == "__main__":
    sys.exit(main())
