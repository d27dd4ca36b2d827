"""Sidecar ingest benchmark: a real `tracedb serve` process, N concurrent clients on its Unix socket.

    from benchmarks import sidecar
    result = sidecar.run(clients=(1, 8, 32), seconds=3.0)

or, from the project root, `python -m benchmarks.sidecar [seconds] [window]`.

Each client is one connection recording executions of `events_per_execution` events (start,
events, finish), keeping `window` requests in flight (pipelining, as the asyncio client does).
An event counts once its acknowledgement arrives, i.e. once the server has fdatasync'ed it; its
latency runs from the moment its request was handed to the socket to the moment its response
was read. The load runs `warmup` seconds before the measured `seconds`: what is acknowledged
during the warm-up (while the server starts its compactor process, prepares its first spare WAL
segment and its caches fill) is not counted. Server RSS is read from /proc (current and peak) at
the end of each run.

The load generator runs in this process, on the same machine as the server: on a 2-core machine
the two share the CPUs, so the figures are for the whole system, not the server alone.
"""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, NamedTuple, Optional, Sequence

import orjson

from .common import TOOL_RESULT, pct

DEFAULT_CLIENTS = (1, 8, 32)

_PAYLOAD = orjson.dumps(TOOL_RESULT)
_ENVELOPE = orjson.dumps({"intent": "ProcessIntent", "payload": {"q": "capital of France"}, "metadata": {"requestId": "r-1"}})


class Plan(NamedTuple):
    """What every connection of one run shares."""

    window: int  # requests each keeps in flight
    per_exec: int  # events per execution
    measure_from: float  # perf_counter() at which the measured part begins
    stop_at: float  # and at which it ends
    lat: list  # the latencies of the measured part, appended to by every connection
    payload: bytes = _PAYLOAD  # every event's payload, as JSON


class Loader(asyncio.Protocol):
    """One benchmark connection: pipelined requests with pre-formatted frames, FIFO acks."""

    def __init__(self, idx: int, plan: Plan, done: asyncio.Future):
        self.idx = idx
        self.done = done
        self.window, self.per_exec, self.measure_from, self.stop_at, self.lat, self.payload = plan
        self.sent_at: collections.deque = collections.deque()
        self.next_id = 0
        self.exec_no = 0
        self.seq = 0  # seq of the last event sent in the current execution (0: start not sent)
        self.acked_events = 0
        self.errors = 0
        self.first_error: Optional[bytes] = None
        self.transport = None
        self.stopping = False
        self.buf = b""

    def connection_made(self, transport) -> None:
        """Fill the window at once."""
        self.transport = transport
        self._fill()

    def _frame(self) -> bytes:
        self.next_id += 1
        rid = self.next_id
        eid = b"bench-%d-%d-%d" % (os.getpid(), self.idx, self.exec_no)
        if self.seq == 0:
            self.seq = 1
            return b'{"id":%d,"op":"start","intent":"ProcessIntent","execution_id":"%s","envelope":%s}\n' % (
                rid, eid, _ENVELOPE)
        seq = self.seq
        if seq > self.per_exec:
            self.exec_no += 1
            self.seq = 0
            return b'{"id":%d,"op":"finish","execution_id":"%s","seq":%d,"response":{"status":"success"}}\n' % (
                rid, eid, seq)
        self.seq = seq + 1
        return b'{"id":%d,"op":"event","execution_id":"%s","seq":%d,"type":"tool.responded","payload":%s}\n' % (
            rid, eid, seq, self.payload)

    def _fill(self) -> None:
        if self.stopping:
            return
        if time.perf_counter() >= self.stop_at:
            self.stopping = True
            if not self.sent_at and not self.done.done():
                self.done.set_result(None)
            return
        n = self.window - len(self.sent_at)
        if n <= 0:
            return
        frames = [self._frame() for _ in range(n)]
        now = time.perf_counter()
        self.sent_at.extend([now] * n)
        self.transport.write(b"".join(frames))

    def data_received(self, data: bytes) -> None:
        """Acknowledgements arrive in request order: time them, then refill the window."""
        now = time.perf_counter()
        data = self.buf + data
        k = data.count(b"\n")
        end = data.rfind(b"\n")
        self.buf = data[end + 1:]
        if b'"ok":false' in data:
            for line in data[: end].split(b"\n"):
                if b'"ok":false' in line:
                    self.errors += 1
                    self.first_error = self.first_error or line
        pop = self.sent_at.popleft
        if now >= self.measure_from:
            lat = self.lat
            for _ in range(k):
                lat.append(now - pop())
            self.acked_events += k
        else:  # still warming up
            for _ in range(k):
                pop()
        if self.stopping:
            if not self.sent_at and not self.done.done():
                self.done.set_result(None)
        else:
            self._fill()

    def connection_lost(self, exc) -> None:
        """A server that closes on us ends the run with an error."""
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"server closed the connection: {exc}"))


async def drive(socket_path: str, clients: int, seconds: float, *, window: int = 32,
                events_per_execution: int = 100, warmup: float = 1.0,
                on_measure: Optional[Callable[[], None]] = None) -> dict:
    """Run `clients` pipelining connections against a server for `warmup` + `seconds`; return
    the figures of the last `seconds` (and of the drain of the requests still in flight then).
    `on_measure` is called when the measured part begins (to read the server's CPU time)."""
    loop = asyncio.get_running_loop()
    if on_measure is not None:
        loop.call_later(warmup, on_measure)
    lat: list[float] = []
    measure_from = time.perf_counter() + warmup
    plan = Plan(window, events_per_execution, measure_from, measure_from + seconds, lat)
    loaders = []
    waits = []
    for i in range(clients):
        done = loop.create_future()
        waits.append(done)
        _t, proto = await loop.create_unix_connection(
            lambda i=i, done=done: Loader(i, plan, done),
            socket_path,
        )
        loaders.append(proto)
    await asyncio.gather(*waits)
    elapsed = time.perf_counter() - measure_from
    for p in loaders:
        p.transport.close()
    lat.sort()
    acked = sum(p.acked_events for p in loaders)
    errors = sum(p.errors for p in loaders)
    first_error = next((p.first_error for p in loaders if p.first_error), None)
    return {
        "clients": clients,
        "window": window,
        "warmup_s": warmup,
        "acked": acked,
        "errors": errors,
        "first_error": first_error.decode(errors="replace") if first_error else None,
        "seconds": elapsed,
        "events_per_s": acked / elapsed if elapsed > 0 else 0.0,
        "p50_ms": pct(lat, 0.50) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "max_ms": (lat[-1] * 1e3) if lat else float("nan"),
    }


def _rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in MB, from /proc (Linux)."""
    cur = peak = float("nan")
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    cur = int(line.split()[1]) / 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
    except OSError:
        pass
    return cur, peak


def start_server(data_dir: str, *, extra_args: Sequence[str] = (), timeout_s: float = 60.0,
                 env: Optional[dict] = None) -> tuple[subprocess.Popen, str]:
    """Start `tracedb serve` on `data_dir` as a subprocess; return it and its socket once listening."""
    sock = os.path.join(data_dir, "tracedb.sock")
    cmd = [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "serve", "--socket", sock,
           "--log-level", "warning", *extra_args]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + timeout_s
    while not accepts(sock):
        if proc.poll() is not None:
            raise RuntimeError(f"tracedb serve exited with {proc.returncode} before listening")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError("tracedb serve did not start listening")
        time.sleep(0.01)  # polling for the socket with a deadline
    return proc, sock


def accepts(path: str) -> bool:
    """True once a server accepts connections on the Unix socket `path` (a stale file does not)."""
    if not os.path.exists(path):
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def stop_server(proc: subprocess.Popen, timeout_s: float = 60.0) -> int:
    """SIGTERM the server and wait for its clean exit; returns its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def free_port() -> int:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def _health(port: int, data_dir: str) -> dict:
    """The server's /health document (compaction lag at the end of the run); {} if unreachable."""
    import urllib.request

    try:
        with open(os.path.join(data_dir, "token")) as f:  # the whole document needs the token
            req = urllib.request.Request(f"http://127.0.0.1:{port}/health",
                                         headers={"Authorization": f"Bearer {f.read().strip()}"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            return orjson.loads(resp.read())
    except Exception:  # noqa: BLE001 - a missing figure, not a failed benchmark
        return {}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc (Linux); NaN elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def run(clients: Sequence[int] = DEFAULT_CLIENTS, seconds: float = 3.0, *, window: int = 32,
        events_per_execution: int = 100, workdir: Optional[str] = None, quiet: bool = False,
        compact: bool = True, server_args: Sequence[str] = (), warmup: float = 1.0) -> dict:
    """Benchmark sidecar ingest over the Unix socket; one fresh `tracedb serve` per client count.

    `window` is the number of requests each client keeps in flight; the first `warmup` seconds
    of load are not counted (see the module docstring); `compact=False` turns the
    server's background compaction off, to measure the ingest path alone (the WAL then keeps
    everything until the next compaction).

    Returns {"sidecar": {n: {"events_per_s", "p50_ms", "p99_ms", "max_ms", "rss_mb",
    "rss_peak_mb", "server_cpu_s", "acked", "errors", ...}}} keyed by client count.
    """
    results: dict = {}
    base = tempfile.mkdtemp(prefix="tdb-bench-", dir=workdir)
    env = dict(os.environ)
    if not compact:
        env["TRACEDB_COMPACT_INTERVAL_MS"] = "0"
    label = "" if compact else ", no compaction"
    try:
        for n in clients:
            data_dir = os.path.join(base, f"c{n}")
            os.makedirs(data_dir, mode=0o700)
            port = free_port()
            proc, sock = start_server(data_dir, extra_args=[*server_args, "--metrics-port", str(port)], env=env)
            try:
                cpu0 = [cpu_s(proc.pid)]

                def mark(pid=proc.pid, cpu0=cpu0) -> None:
                    cpu0[0] = cpu_s(pid)

                r = asyncio.run(drive(sock, n, seconds, window=window, warmup=warmup,
                                      events_per_execution=events_per_execution, on_measure=mark))
                r["server_cpu_s"] = cpu_s(proc.pid) - cpu0[0]
                r["rss_mb"], r["rss_peak_mb"] = _rss_mb(proc.pid)
                health = _health(port, data_dir)
                r["compaction_lag_records"] = health.get("compaction_lag_records")
                r["compaction_lag_s"] = health.get("compaction_lag_s")
            finally:
                r_exit = stop_server(proc)
            r["server_exit"] = r_exit
            r["compaction"] = compact
            results[n] = r
            if not quiet:
                print(
                    f"  sidecar ingest, {n:>2} clients x {window} in flight{label:<16}"
                    f"{r['events_per_s']:>10,.0f}/s   p50 {r['p50_ms']:7.3f} ms   p99 {r['p99_ms']:7.3f} ms"
                    f"   server RSS {r['rss_mb']:.0f} MB (peak {r['rss_peak_mb']:.0f})"
                    f"   compaction lag {r['compaction_lag_records']} rec"
                    + (f"   ERRORS {r['errors']}: {r['first_error']}" if r["errors"] else ""),
                    flush=True,
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {"sidecar": results}


if __name__ == "__main__":  # python -m benchmarks.sidecar [seconds] [window]
    run(seconds=float(sys.argv[1]) if len(sys.argv) > 1 else 3.0,
        window=int(sys.argv[2]) if len(sys.argv) > 2 else 32)
