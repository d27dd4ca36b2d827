"""End to end through a real `tracedb serve` process: signals, crash recovery, metrics, the demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import orjson
import pytest

import tracedb
from tracedb.sidecar.client import Client

from tests.serving import ROOT
from .helpers import LineClient, free_port, wait_for

ENV = {"intent": "ProcessIntent", "payload": {"n": 1}}


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TRACEDB_SIDECAR", None)
    return subprocess.run([sys.executable, "-m", "tracedb", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_sigterm_answers_pending_requests_and_exits_cleanly(serve_process, tdir):
    srv = serve_process()
    with Client("unix:" + srv.socket) as client:
        ex = client.start("ProcessIntent", ENV, execution_id="exec-done")
        ex.event("tool.requested", {"tool": "search"})
        ex.finish({"status": "success"})
        running = client.start("ProcessIntent", ENV, execution_id="exec-open")
        running.event("AGENT_ATTEMPT_START", {"agent": "a"})
    c = LineClient(srv.socket)
    pipeline = b"".join(
        orjson.dumps({"id": i, "op": "event", "execution_id": "exec-open", "type": "t.x", "payload": {"i": i}, "seq": i + 1}) + b"\n"
        for i in range(1, 51)
    )
    c.send_raw(pipeline)
    first = c.recv()  # the server has read the pipeline: now ask it to stop
    code, err = srv.terminate()
    got = [first]
    while True:
        try:
            got.append(c.recv())
        except ConnectionResetError:
            break
    assert code == 0, err
    assert not os.path.exists(srv.socket)
    # Every request was answered: acknowledged, or refused as the server shut down; none hang.
    assert sorted(r["id"] for r in got) == list(range(1, 51))
    acked = [r["id"] for r in got if r["ok"]]
    assert all(r["error"]["code"] == "unavailable" for r in got if not r["ok"])
    logs = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert {"listening", "stopped"} <= {entry["msg"] for entry in logs}
    with tracedb.open(tdir) as store:
        done = store.get("exec-done")
        assert done.status == "completed" and done.header.replayable
        open_ = store.get("exec-open")
        # A clean stop closes what was still recording as incomplete, every acknowledged event kept.
        assert open_.status == "incomplete" and open_.header.replayableReason == "execution_incomplete"
        assert [e.payload for e in open_.events[1:]] == [{"i": i} for i in sorted(acked)]


def test_sigterm_the_moment_the_socket_appears_is_a_clean_stop(tdir):
    # A supervisor may stop the recorder as soon as it sees the socket: the signal handlers are
    # in place before anything listens, so that is a graceful stop, never the default death.
    import signal
    import time

    from .helpers import sock_path

    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TRACEDB_SIDECAR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracedb", "--data-dir", tdir, "serve", "--http-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    deadline = time.monotonic() + 60
    while not os.path.exists(sock_path(tdir)):
        assert proc.poll() is None and time.monotonic() < deadline, "serve never created its socket"
        time.sleep(0.0005)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"Traceback" not in err
    # The recorder alone handles the signal (its HTTP server does not take it over, nor raise
    # it again when it stops): one stop, logged once.
    assert err.count(b"signal received") == 1, err.decode()[-2000:]


def test_sigterm_with_every_http_endpoint_is_one_graceful_stop(serve_process):
    # The web view and the OTLP receiver run on uvicorn, which would take SIGTERM over while it
    # serves and raise it again when it stops: the recorder keeps the signal to itself.
    pytest.importorskip("opentelemetry.proto")
    rec = serve_process("--http-port", "0", "--otlp-port", "0")
    code, err = rec.terminate()
    assert code == 0, err[-2000:]
    assert err.count("signal received") == 1, err[-3000:]
    assert "Traceback" not in err


def test_replay_of_a_running_execution_says_it_is_still_running(serve_process, tdir):
    rec = serve_process()
    with Client(rec.socket) as client:
        ex = client.start("ProcessIntent", ENV)
        ex.event("tool.requested", {"name": "search"})
        out = {}

        def refused_as_running() -> bool:
            r = _cli("--data-dir", tdir, "replay", ex.execution_id)
            out["r"] = r
            return r.returncode == 6 and "still running" in r.stderr

        wait_for(refused_as_running, 60)
        assert "trace get --follow" in out["r"].stderr
        ex.finish({"status": "success", "payload": {"n": 1}})


def test_verify_next_to_a_recorder_reports_no_made_up_applied_lsn(serve_process, tdir):
    rec = serve_process()
    with Client(rec.socket) as client:
        client.start("ProcessIntent", ENV).finish({"status": "success", "payload": {}})
    r = _cli("--data-dir", tdir, "verify", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["wal"]["live"] is True and report["wal"]["applied_lsn"] is None, report


def test_sigkill_mid_execution_then_restart_recovers(serve_process, tdir):
    srv = serve_process()
    with Client("unix:" + srv.socket) as client:
        done = client.start("ProcessIntent", ENV, execution_id="exec-complete")
        done.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
        done.finish({"status": "success", "payload": {"x": 1}})
        mid = client.start("ProcessIntent", ENV, execution_id="exec-mid")
        mid.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
        mid.event("AGENT_ATTEMPT_START", {"agent": "processor-a"})
    srv.kill()
    srv2 = serve_process()
    with Client("unix:" + srv2.socket) as client:
        rec = client.get("exec-mid")
        assert rec.status == "incomplete"
        assert (rec.header.replayable, rec.header.replayableReason) == (False, "execution_incomplete")
        assert [e.type for e in rec.events] == ["INTENT_RECEIVED", "AGENT_ATTEMPT_START"]
        # A resend of an event recorded before the crash is still answered with its seq.
        assert client.event("exec-mid", "AGENT_ATTEMPT_START", {"agent": "processor-a"}, seq=2) == 2
        with pytest.raises(tracedb.ExecutionClosedError):
            client.event("exec-mid", "AGENT_ATTEMPT_END", {"agent": "processor-a"})
        ok = client.get("exec-complete")
        assert ok.header.replayable and ok.finalResponse == {"status": "success", "payload": {"x": 1}}
    code, err = srv2.terminate()
    assert code == 0, err


def _owner_get(srv, url: str) -> bytes:
    """GET as the recorder's owner: with the data directory's token, as Prometheus sends it."""
    with open(os.path.join(srv.data_dir, "token")) as f:
        token = f.read().strip()
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    return urllib.request.urlopen(req, timeout=10).read()


def test_metrics_and_health(serve_process):
    port = free_port()
    srv = serve_process("--metrics-port", str(port))
    with Client("unix:" + srv.socket) as client:
        ex = client.start("ProcessIntent", ENV)
        for i in range(5):
            ex.event("tool.requested", {"i": i})
        try:
            client.event("exec-nope", "tool.requested", {})
        except tracedb.ExecutionNotFoundError:
            pass
    text = _owner_get(srv, f"http://127.0.0.1:{port}/metrics").decode()
    for name in (
        "tracedb_events_acked_total", "tracedb_events_per_second", "tracedb_wal_fsync_seconds_bucket",
        "tracedb_wal_group_records_bucket", "tracedb_wal_uncompacted_bytes", "tracedb_compaction_lag_seconds",
        "tracedb_compaction_lag_records", "tracedb_open_executions", "tracedb_connections",
    ):
        assert name in text, name
    assert 'tracedb_errors_total{code="unknown_execution"} 1.0' in text
    assert "tracedb_open_executions 1.0" in text
    assert "tracedb_events_acked_total 6.0" in text
    health = json.loads(_owner_get(srv, f"http://127.0.0.1:{port}/health"))
    assert health["status"] == "ok" and health["open_executions"] == 1
    with pytest.raises(urllib.error.HTTPError) as nf:
        _owner_get(srv, f"http://127.0.0.1:{port}/nope")
    assert nf.value.code == 404
    code, err = srv.terminate()
    assert code == 0, err


def test_the_http_port_serves_the_web_view_metrics_and_health_on_one_server(serve_process):
    port = free_port()
    srv = serve_process("--http-port", str(port))
    with Client("unix:" + srv.socket) as client:
        ex = client.start("ProcessIntent", ENV)
        ex.event("tool.requested", {"name": "<script>x</script>"})
        eid = ex.execution_id
    base = f"http://127.0.0.1:{port}"
    assert "tracedb_events_acked_total 2.0" in _owner_get(srv, base + "/metrics").decode()
    assert json.loads(_owner_get(srv, base + "/health"))["status"] == "ok"

    def listed() -> bool:  # the recorder compacts in the background
        return eid in _owner_get(srv, base + "/").decode()

    wait_for(listed, 30, "the execution on the list page")
    page = _owner_get(srv, f"{base}/e/{eid}").decode()
    assert "ProcessIntent" in page and "&lt;script&gt;x&lt;/script&gt;" in page and "<script>x" not in page
    token = open(os.path.join(srv.data_dir, "token")).read().strip()
    with pytest.raises(urllib.error.HTTPError) as post:
        urllib.request.urlopen(urllib.request.Request(base + "/metrics", data=b"x", method="POST",
                                                      headers={"Authorization": f"Bearer {token}"}), timeout=10)
    assert post.value.code == 405
    code, err = srv.terminate()
    assert code == 0, err


def test_a_second_server_on_the_same_data_directory_exits_5(serve_process, tdir):
    serve_process()
    other_sock = os.path.join(tdir, "other.sock")
    r = _cli("--data-dir", tdir, "serve", "--socket", other_sock)
    assert r.returncode == 5
    assert "error:" in r.stderr and "hint:" in r.stderr


def test_refuses_a_public_address_without_allow_remote(tdir):
    r = _cli("--data-dir", tdir, "serve", "--tcp", "0.0.0.0:7411")
    assert r.returncode == 1
    assert "non-loopback" in r.stderr and "hint:" in r.stderr


def test_demo_records_completed_executions_and_one_crash(tdir):
    r = _cli("--data-dir", tdir, "demo", "--start-server", "--executions", "2", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    states = [(e["status"], e["replayable"], e["replayable_reason"]) for e in summary["executions"]]
    assert states == [("completed", True, None)] * 2 + [("incomplete", False, "execution_incomplete")]
    crashed = summary["executions"][-1]
    assert crashed["last_event"] == "tool.requested"  # killed inside the tool call
    with tracedb.open(tdir) as store:
        rec = store.get(summary["executions"][0]["execution_id"])
        types = [e.type for e in rec.events]
        assert {"llm.requested", "llm.responded", "tool.requested", "tool.responded"} <= set(types)
        assert types[-1] == "FINAL_RESPONSE"


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_help_ends_with_an_example(command):
    r = _cli(command, "--help")
    assert r.returncode == 0
    body = r.stdout.split("Options:")[0]
    assert "Example:" in body and "tracedb" in body.split("Example:")[1]


def test_bench_entry_point_runs(tdir):
    from benchmarks import sidecar as bench

    out = bench.run(clients=(2,), seconds=0.3, window=4, workdir=tdir, quiet=True, warmup=0.2)
    r = out["sidecar"][2]
    assert r["acked"] > 0 and r["errors"] == 0 and r["server_exit"] == 0
    assert r["p50_ms"] <= r["p99_ms"] and r["rss_mb"] > 0
