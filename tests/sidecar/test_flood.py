"""`tracedb serve` under a same-host flood: 2,000 slow connections held on each of its ports (the
Unix socket, TCP, OTLP, HTTP; half silent, half sending a request that never ends, byte by
byte, each one opened again when the server closes it), by another process (tests/sidecar/flood.py).

The recorder runs with a lowered soft RLIMIT_NOFILE under a higher hard one (it must raise it),
and with a low hard limit (its caps must fit the descriptors it has, keeping the reserve). In
both: a new client on the Unix socket, and one connected before the flood, are answered within
1 s; GET /health answers; the log grows by less than 1 MB a minute."""

from __future__ import annotations

import http.client
import os
import resource
import subprocess
import sys
import time

import orjson
import pytest

from tests.waiting import wait_until
from tracedb.sidecar.client import connect

from tests.serving import ROOT
from .helpers import sock_path

pytestmark = pytest.mark.timeout(180)

PER_PORT = 2000
WINDOW_S = 10.0


def _flood_limit() -> int:
    need = 4 * PER_PORT + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need and os.geteuid() != 0:
        pytest.skip(f"the flooding process needs {need} descriptors; the hard limit here is {hard} (not root)")
    return need


def _log(path: str) -> list[dict]:
    out = []
    with open(path, "rb") as f:
        for line in f:
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                out.append({"msg": line.decode(errors="replace")})
    return out


def _health(port: int) -> tuple:
    t = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/health")
        status = conn.getresponse().status
    except OSError as e:
        status = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return status, time.monotonic() - t


def _metrics(port: int, token: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def _value(metrics: str, series: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} is not in /metrics")


@pytest.mark.parametrize("soft,hard", [(1024, 4096), (640, 640)], ids=["raised", "low-hard-limit"])
def test_every_listener_holds_under_a_flood_of_slow_connections(tdir, soft, hard):
    need = _flood_limit()
    log_path = os.path.join(tdir, "serve.log")
    env = dict(os.environ, PYTHONPATH=ROOT, TRACEDB_IDLE_TIMEOUT_S="0")
    env.pop("TRACEDB_SIDECAR", None)
    with open(log_path, "wb") as log:
        serve = subprocess.Popen(
            [sys.executable, "-m", "tracedb", "--data-dir", tdir, "serve", "--log-format", "json",
             "--tcp", "127.0.0.1:0", "--otlp-port", "0", "--http-port", "0"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
        )
    flood = None
    ports: dict[str, int] = {}
    try:
        def listening() -> bool:
            if serve.poll() is not None:
                raise AssertionError(f"tracedb serve exited {serve.returncode}: {open(log_path).read()[-2000:]}")
            for doc in _log(log_path):
                if doc.get("msg") == "listening":
                    ports["tcp"] = int(doc["tcp"].rsplit(":", 1)[1])
                elif doc.get("msg") == "http listening":
                    ports["http"] = int(doc["metrics"].rsplit(":", 1)[1].split("/")[0])
                elif doc.get("msg") == "otlp listening":
                    ports["otlp"] = int(doc["otlp"].rsplit(":", 1)[1].split("/")[0])
            return len(ports) == 3

        wait_until(listening, 60, "tracedb serve to listen on every port")
        socket_path = sock_path(tdir)
        kept = connect("unix:" + socket_path)
        kept_ex = kept.start("Kept", {"before": "the flood"})

        flood_out = os.path.join(tdir, "flood.out")
        own = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        with open(flood_out, "wb") as out:
            flood = subprocess.Popen(
                [sys.executable, "-m", "tests.sidecar.flood", "--per-port", str(PER_PORT),
                 f"wire:unix:{socket_path}", f"wire:tcp:127.0.0.1:{ports['tcp']}",
                 f"http:tcp:127.0.0.1:{ports['otlp']}", f"http:tcp:127.0.0.1:{ports['http']}"],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (need, max(need, own))),
            )

        def flood_report() -> dict:
            with open(flood_out, "rb") as f:
                lines = f.read().splitlines()
            return orjson.loads(lines[-1]) if lines else {}

        wait_until(lambda: len(flood_report()) == 4 and all(t["connects"] >= PER_PORT for t in flood_report().values()),
                   60, f"the flood to open {PER_PORT} connections on every port")

        new_client, kept_client, health = [], [], []
        size0 = os.path.getsize(log_path)
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < WINDOW_S:
            n += 1
            t = time.monotonic()
            with connect("unix:" + socket_path, connect_timeout_s=5, reconnect_timeout_s=5) as client:
                ex = client.start("New", {"n": n})
                assert ex.event("t.flood", {"n": n}) == 1
            new_client.append(time.monotonic() - t)
            t = time.monotonic()
            assert kept_ex.event("t.flood", {"n": n}) == n
            kept_client.append(time.monotonic() - t)
            health.append(_health(ports["http"]))
            if n == 3:
                during = _metrics(ports["http"], open(os.path.join(tdir, "token")).read().strip())
        elapsed = time.monotonic() - t0
        grown = os.path.getsize(log_path) - size0

        flood.terminate()
        flood.wait(30)
        pressure = flood_report()
        metrics = _metrics(ports["http"], open(os.path.join(tdir, "token")).read().strip())
        assert kept_ex.finish({"status": "ok"}) == n + 1
        kept.close()
        serve.terminate()
        assert serve.wait(60) == 0
    finally:
        for p in (flood, serve):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()

    summary = (f"new client {max(new_client):.3f} s max, kept client {max(kept_client):.3f} s max, "
               f"health {[(s, round(d, 3)) for s, d in health]}, log {grown} bytes in {elapsed:.1f} s, "
               f"flood {pressure}")
    print(summary)
    # The flood was real: every port saw its connections closed by the server and opened again.
    assert all(t["connects"] > PER_PORT and t["closed_by_server"] > 0 for t in pressure.values()), summary
    assert max(new_client) < 1.0 and max(kept_client) < 1.0, summary
    assert all(status == 200 for status, _ in health), summary
    assert grown < 1_000_000 * elapsed / 60, summary

    log = _log(log_path)
    fds = next(doc for doc in log if doc.get("msg") == "file descriptors")
    assert fds["limit"] == hard and fds["raised_from"] == (soft if soft < hard else None)
    assert _value(metrics, "tracedb_fd_limit") == hard
    caps = fds["max_connections"]
    for name in ("unix", "tcp", "otlp", "http"):
        # Never out of descriptors: the caps, not the kernel, turned the flood away.
        for errno_name in ("EMFILE", "ENFILE"):
            assert _value(metrics, f'tracedb_listener_accept_errors_total{{errno="{errno_name}",listener="{name}"}}') == 0
        assert _value(metrics, f'tracedb_listener_refused_total{{listener="{name}",reason="limit"}}') > 0
        assert _value(during, f'tracedb_listener_connections{{listener="{name}"}}') <= caps[name]
    for name in ("unix", "http"):  # where the test's clients came: room was made for them
        assert _value(metrics, f'tracedb_listener_closed_total{{listener="{name}",reason="evicted"}}') > 0
    assert _value(during, "tracedb_open_fds") < hard
    assert caps["unix"] == 256
    if hard < 1024:
        lowered = next(doc for doc in log if doc.get("msg") == "connection caps lowered to fit the limit of open files")
        assert lowered["max_connections"] == {k: caps[k] for k in ("tcp", "otlp", "http")}
        assert caps["tcp"] < 256 and caps["otlp"] < 128 and caps["http"] < 64
    else:
        assert caps == {"unix": 256, "tcp": 256, "otlp": 128, "http": 64}
