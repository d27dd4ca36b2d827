"""Agents recording through a fail-open client while their recorder goes away and comes back.

    python -m tests.sidecar.outage_load --agents 16 --stop-s 8            # SIGSTOP, then SIGCONT
    python -m tests.sidecar.outage_load --agents 16 --kill                 # SIGKILL, then restart
    python -m tests.sidecar.outage_load --agents 16 --stop-s 8 --asyncio
    python -m tests.sidecar.outage_load --agents 16 --startup 10000       # a start-up that recovers

A real `tracedb serve` process on a fresh data directory; `agents` threads (or asyncio tasks on
one loop), each with its own client (`on_outage="continue"`), record executions back to back:
a start, `events` events `think_s` apart, a finish. After `before_s` the recorder is stopped
(SIGSTOP, or SIGKILL), `stop_s` later it is resumed (SIGCONT, or started again), the agents
go on for `after_s` and finish the execution they are in, the clients are closed and the
recorder is stopped cleanly (SIGTERM). Every call's outcome is kept with the time it was made;
the executions' states are read from the data directory at the end.

What it prints (and `run` returns): the records dropped, those dropped by calls made after the
recorder answered again (SIGCONT; or, for a restart, the first answer its store gave to a `get`
asked every 5 ms on a fresh connection), and how the executions ended (status / reason).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from tests.sidecar.helpers import store_answers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def spawn_recorder(data_dir: str, log_level: str = "warning") -> subprocess.Popen:
    """`tracedb serve` on `data_dir`, just started (its log, JSON lines, on its stderr pipe)."""
    env = dict(os.environ, PYTHONPATH=ROOT, TRACEDB_IDLE_TIMEOUT_S="0")
    env.pop("TRACEDB_SIDECAR", None)
    return subprocess.Popen(
        [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "serve", "--log-level", log_level, "--log-format", "json"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )


def wait_ready(data_dir: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> float:
    """Wait until the recorder's store answers on its socket (`store_answers`, every 5 ms);
    returns the monotonic time the answer came."""
    path = os.path.join(data_dir, "tracedb.sock")
    deadline = time.monotonic() + timeout_s
    while not store_answers(path, max(0.01, deadline - time.monotonic())):
        if proc.poll() is not None:
            raise RuntimeError(f"tracedb serve exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError("tracedb serve did not answer")
        time.sleep(0.005)
    return time.monotonic()


def start_recorder(data_dir: str, timeout_s: float = 60.0) -> subprocess.Popen:
    """`tracedb serve` on `data_dir`, once its store answers."""
    proc = spawn_recorder(data_dir)
    try:
        wait_ready(data_dir, proc, timeout_s)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


@dataclass
class Outcome:
    """What the agents saw and how their executions ended."""

    executions: int = 0
    calls: int = 0
    dropped: int = 0
    dropped_after_back: int = 0
    states: collections.Counter = field(default_factory=collections.Counter)
    # executions the agent finished, by (status, reason)
    finished_states: collections.Counter = field(default_factory=collections.Counter)
    # The last of those: how long after the recorder was back (s).
    last_drop_after_back_s: Optional[float] = None
    # Every call: (monotonic time it was made, dropped).
    call_log: list = field(default_factory=list)
    stopped_at: float = 0.0
    back_at: float = 0.0

    def dropped_after(self, t: float) -> int:
        """How many calls made at `t` or later were dropped."""
        return sum(1 for at, dropped in self.call_log if dropped and at >= t)

    def summary(self) -> str:
        window = "" if self.last_drop_after_back_s is None else f" (the last {self.last_drop_after_back_s * 1000:.0f} ms after)"
        lines = [
            f"executions: {self.executions}, calls: {self.calls}, dropped: {self.dropped}, "
            f"dropped by calls made after the recorder was back: {self.dropped_after_back}{window}",
            "how the executions ended (status / reason): "
            + ", ".join(f"{s}/{r}: {n}" for (s, r), n in sorted(self.states.items(), key=str)),
            "those the agent finished: "
            + ", ".join(f"{s}/{r}: {n}" for (s, r), n in sorted(self.finished_states.items(), key=str)),
        ]
        return "\n".join(lines)


class _Log:
    def __init__(self):
        self.lock = threading.Lock()
        self.calls: list[tuple[float, bool]] = []  # (monotonic time the call was made, dropped)
        self.finished: set[str] = set()
        self.ids: list[str] = []

    def call(self, t: float, got) -> None:
        with self.lock:
            self.calls.append((t, got is None))


def _sync_agent(address: str, log: _Log, stop: threading.Event, events: int, think_s: float) -> None:
    from tracedb.sidecar.client import Client

    client = Client(address, on_outage="continue")
    try:
        while not stop.is_set():
            t = time.monotonic()
            ex = client.start("outage.load", {"intent": "outage.load"})
            with log.lock:
                log.ids.append(ex.execution_id)
            for i in range(events):
                time.sleep(think_s)
                t = time.monotonic()
                log.call(t, ex.event("outage.step", {"i": i}))
            t = time.monotonic()
            log.call(t, ex.finish({"status": "success", "payload": {}}))
            with log.lock:
                log.finished.add(ex.execution_id)
    finally:
        client.close()


async def _async_agents(address: str, agents: int, log: _Log, stop: threading.Event, events: int, think_s: float) -> None:
    from tracedb.sidecar.client import connect_async

    async def one():
        client = await connect_async(address, on_outage="continue")
        try:
            while not stop.is_set():
                ex = await client.start("outage.load", {"intent": "outage.load"})
                log.ids.append(ex.execution_id)
                for i in range(events):
                    await asyncio.sleep(think_s)
                    t = time.monotonic()
                    log.call(t, await ex.event("outage.step", {"i": i}))
                t = time.monotonic()
                log.call(t, await ex.finish({"status": "success", "payload": {}}))
                log.finished.add(ex.execution_id)
        finally:
            await client.close()

    await asyncio.gather(*(one() for _ in range(agents)))


def run(*, agents: int = 16, events: int = 5, think_s: float = 0.05, before_s: float = 2.0,
        stop_s: float = 8.0, after_s: float = 4.0, kill: bool = False, use_asyncio: bool = False,
        startup: Optional[int] = None, data_dir: Optional[str] = None) -> Outcome:
    """Run the load once (see the module doc); returns what was seen. With `startup`, the
    recorder is not stopped: the agents start first, and the recorder then starts on a data
    directory whose WAL holds `startup` executions to recover (`leave_uncompacted`);
    `stopped_at` is when it was started, `back_at` when its store answered."""
    from tracedb.config import as_config
    from tracedb.errors import ExecutionNotFoundError
    from tracedb.reads.reader import Reader

    own_dir = data_dir is None
    data_dir = data_dir or tempfile.mkdtemp(prefix="tdbo")
    address = "unix:" + os.path.join(data_dir, "tracedb.sock")
    out = Outcome()
    if startup is not None:
        leave_uncompacted(data_dir, startup)
        proc = None
    else:
        proc = start_recorder(data_dir)
    log = _Log()
    stop = threading.Event()
    if use_asyncio:
        workers = [threading.Thread(target=asyncio.run, args=(_async_agents(address, agents, log, stop, events, think_s),))]
    else:
        workers = [threading.Thread(target=_sync_agent, args=(address, log, stop, events, think_s)) for _ in range(agents)]
    try:
        for w in workers:
            w.start()
        time.sleep(before_s)
        out.stopped_at = time.monotonic()
        if startup is not None:  # the agents came first; the recorder starts now
            proc = spawn_recorder(data_dir)
            out.back_at = wait_ready(data_dir, proc)
        elif kill:
            proc.kill()
            proc.wait()
            time.sleep(stop_s)
            proc = spawn_recorder(data_dir)
            out.back_at = wait_ready(data_dir, proc)
        else:
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(stop_s)
            os.kill(proc.pid, signal.SIGCONT)
            out.back_at = time.monotonic()
        time.sleep(after_s)
    finally:
        stop.set()
        for w in workers:
            w.join(120)
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            proc.wait(120)
    out.call_log = list(log.calls)
    out.calls = len(log.calls)
    out.dropped = sum(1 for _t, d in log.calls if d)
    late = [t for t, d in log.calls if d and t >= out.back_at]
    out.dropped_after_back = len(late)
    out.last_drop_after_back_s = max(late) - out.back_at if late else None
    reader = Reader.open(as_config(None, data_dir))
    try:
        for eid in log.ids:
            try:
                rec = reader.get(eid)
                key = (rec.status, rec.header.replayableReason)
            except ExecutionNotFoundError:  # its start was dropped, and never sent again
                key = ("missing", None)
            out.states[key] += 1
            if eid in log.finished:
                out.finished_states[key] += 1
        out.executions = len(log.ids)
    finally:
        reader.close()
        if own_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
    return out


_UNCOMPACTED = """
import os, sys, time
import tracedb
from tracedb.records.codec import encode_event, encode_finish, encode_start
from tracedb.records.record import compute_envelope_hash
store = tracedb.open(sys.argv[1], config={"compact_interval_ms": 0, "idle_timeout_s": 0, "compact_worker": False})
records, t = [], time.time_ns()
for i in range(int(sys.argv[2])):
    eid, envelope = f"exec-{i:06d}", {"intent": "outage.recovered", "i": i}
    records.append(encode_start(eid, "outage.recovered", envelope, compute_envelope_hash(envelope), t))
    records += [encode_event(eid, s, "tool.requested", b'{"q": "capital of France"}', t) for s in range(1, 21)]
    records.append(encode_finish(eid, 21, {"status": "success"}, t))
store.wal.append_many(records)
os._exit(0)  # as a crash: the records are durable, nothing is compacted
"""


def leave_uncompacted(data_dir: str, executions: int) -> None:
    """A data directory whose recorder died with `executions` whole executions (22 records
    each) in its WAL and none in its database: the next recorder's start-up compacts them."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, "-c", _UNCOMPACTED, data_dir, str(executions)], check=True, env=env, timeout=300)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--events", type=int, default=5)
    p.add_argument("--think-s", type=float, default=0.05)
    p.add_argument("--before-s", type=float, default=2.0)
    p.add_argument("--stop-s", type=float, default=8.0)
    p.add_argument("--after-s", type=float, default=4.0)
    p.add_argument("--kill", action="store_true", help="SIGKILL and start again, instead of SIGSTOP/SIGCONT")
    p.add_argument("--asyncio", action="store_true", help="asyncio agents on one loop")
    p.add_argument("--startup", type=int, metavar="EXECUTIONS",
                   help="no stop: the recorder starts after the agents, recovering this many executions")
    a = p.parse_args()
    logging.getLogger("tracedb").setLevel(logging.CRITICAL)  # the clients' outage logs, once per agent
    out = run(agents=a.agents, events=a.events, think_s=a.think_s, before_s=a.before_s, stop_s=a.stop_s,
              after_s=a.after_s, kill=a.kill, use_asyncio=a.asyncio, startup=a.startup)
    print(out.summary())


if __name__ == "__main__":
    main()
