"""Fail open: with `on_outage="continue"` an agent goes on through a recorder outage (absent,
stopped, killed, hung), the client counts what it dropped, and once the recorder is back every
execution that lost a record is flagged `recording_failure` (not replayable, events kept)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import orjson
import pytest

from tests.waiting import wait_until
from tracedb.errors import ConfigError
from tracedb.sidecar.client import Client, RecorderUnavailableError, connect_async

from tests.serving import ROOT
from .helpers import sock_path, stopped


def _replay_exit(data_dir: str, execution_id: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TRACEDB_SIDECAR", None)
    return subprocess.run(
        [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "replay", execution_id],
        capture_output=True, text=True, env=env, timeout=120,
    )


def _until_recorded(call, timeout: float = 60):
    """Call `call()` until it records (returns a seq, not None); the fail-open client probes the
    recorder again after a delay, dropping what comes meanwhile."""
    got = []

    def recorded() -> bool:
        got.append(call())
        if got[-1] is None:
            time.sleep(0.1)
        return got[-1] is not None

    wait_until(recorded, timeout, "the client to record again")
    return got[-1], len(got) - 1


def test_the_default_policy_raises_and_a_bad_policy_is_refused(tdir, monkeypatch):
    with pytest.raises(RecorderUnavailableError):
        Client("unix:" + sock_path(tdir))
    with pytest.raises(ConfigError, match="on_outage"):
        Client("unix:" + sock_path(tdir), on_outage="ignore")
    monkeypatch.setenv("TRACEDB_ON_OUTAGE", "sometimes")
    with pytest.raises(ConfigError, match="TRACEDB_ON_OUTAGE"):
        Client("unix:" + sock_path(tdir))


def test_an_absent_recorder_costs_the_agent_one_connect_timeout_then_nothing(tdir, monkeypatch, serve_process):
    monkeypatch.setenv("TRACEDB_ON_OUTAGE", "continue")  # chosen by the deployment, not the code
    t0 = time.monotonic()
    client = Client("unix:" + sock_path(tdir))
    assert time.monotonic() - t0 < 3.0
    ex = client.start("fail_open.absent", {"intent": "fail_open.absent"})
    t0 = time.monotonic()
    dropped = [ex.event("myapp.step", {"i": i}) for i in range(50)]
    assert time.monotonic() - t0 < 0.5, "calls while the recorder is known to be down must not wait"
    assert dropped == [None] * 50
    stats = client.outage_stats()
    assert stats["down"] and stats["outages"] == 1
    assert stats["unrecorded"] == 51 and stats["executions_affected"] == 1

    # The recorder starts: the client records again, starting the execution whose start it
    # dropped and flagging it before anything else of it is recorded.
    serve_process()
    seq, more_dropped = _until_recorded(lambda: ex.event("myapp.step", {"i": "after"}))
    assert seq == 1  # the recorder's numbering: nothing before it was recorded
    assert ex.finish({"status": "success", "payload": {"answer": 42}}) == 2
    record = client.get(ex.execution_id)
    assert [e.type for e in record.events] == ["myapp.step", "FINAL_RESPONSE"]
    assert record.header.replayable is False
    assert record.header.replayableReason == "recording_failure"
    assert record.envelope == {"intent": "fail_open.absent"}
    # The 50 events (and what was dropped before the recorder answered): the start, dropped
    # too, was sent once the recorder was there.
    assert client.outage_stats()["unrecorded"] == 50 + more_dropped
    assert client.outage_stats()["down"] is False
    client.close()
    out = _replay_exit(tdir, ex.execution_id)
    assert out.returncode == 6, out.stderr
    assert "recording_failure" in out.stderr


def test_failing_open_never_takes_the_data_directory_in_process(tdir, monkeypatch, serve_process):
    # No address and no recorder: a fail-open client waits for one on the data directory's
    # socket instead of recording in-process, which would hold the directory's lock and keep
    # the recorder from starting there.
    monkeypatch.delenv("TRACEDB_SIDECAR", raising=False)
    monkeypatch.setenv("TRACEDB_ON_OUTAGE", "continue")
    agents = [Client(data_dir=tdir), Client(data_dir=tdir)]
    assert not any(a.embedded for a in agents)
    runs = [a.start("fail_open.dir", {"intent": "fail_open.dir"}) for a in agents]
    assert [r.event("myapp.step", {}) for r in runs] == [None, None]
    serve_process()  # the data directory is free: the recorder starts
    for run in runs:
        seq, _ = _until_recorded(lambda run=run: run.event("myapp.step", {"after": True}))
        assert seq == 1
    for a in agents:
        a.close()


def test_a_recorder_killed_mid_run_then_restarted(tdir, serve_process):
    rec = serve_process()
    client = Client(rec.socket, on_outage="continue")
    finished = client.start("fail_open.done", {"intent": "fail_open.done"})
    finished.event("myapp.step", {"i": 0})
    running = client.start("fail_open.killed", {"intent": "fail_open.killed"})
    assert running.event("myapp.step", {"i": 0}) == 1
    rec.kill()
    t0 = time.monotonic()
    assert running.event("myapp.step", {"i": 1}) is None
    assert time.monotonic() - t0 < 6.0  # outage_timeout_s (2 s) to reconnect, plus the request
    assert finished.finish({"status": "success", "payload": {}}) is None  # dropped, at once
    serve_process()  # recovery marks both running executions incomplete
    seq, _ = _until_recorded(lambda: client.start("fail_open.next", {"intent": "fail_open.next"}).event("myapp.x", {}))
    assert seq == 1
    # Closed by recovery meanwhile: nothing more of it is recorded, and the agent is not told.
    assert running.event("myapp.step", {"i": 2}) is None
    got = client.get(running.execution_id)
    assert got.status == "incomplete"
    assert [e.payload for e in got.events] == [{"i": 0}]
    assert client.get(finished.execution_id).header.replayable is False
    client.close()


def test_a_hung_recorder_then_resumed(tdir, serve_process):
    rec = serve_process()
    client = Client(rec.socket, on_outage="continue", outage_timeout_s=2.0)
    ex = client.start("fail_open.hung", {"intent": "fail_open.hung"})
    assert ex.event("myapp.step", {"i": 1}) == 1
    with stopped(rec.proc):
        t0 = time.monotonic()
        assert ex.event("myapp.step", {"i": 2}) is None
        waited = time.monotonic() - t0
        # outage_timeout_s in all: waiting for the answer, reconnecting, waiting again.
        assert waited < 2.0 + 0.75, f"a hung recorder held the agent {waited:.1f} s"
        t0 = time.monotonic()
        assert ex.event("myapp.step", {"i": 3}) is None
        assert time.monotonic() - t0 < 0.2
    seq, _ = _until_recorded(lambda: ex.event("myapp.step", {"i": "resumed"}))
    assert ex.finish({"status": "success", "payload": {}}) == seq + 1
    record = client.get(ex.execution_id)
    assert record.status == "completed"
    assert record.header.replayable is False and record.header.replayableReason == "recording_failure"
    steps = [e.payload for e in record.events if e.type == "myapp.step"]
    assert steps[0] == {"i": 1} and steps[-1] == {"i": "resumed"}
    client.close()


def test_the_asyncio_client_fails_open_alike(tdir, serve_process):
    async def run():
        client = await connect_async("unix:" + sock_path(tdir), on_outage="continue")
        ex = await client.start("fail_open.async", {"intent": "fail_open.async"})
        assert await asyncio.gather(ex.event("myapp.a", {}), ex.event("myapp.b", {})) == [None, None]
        assert client.outage_stats()["unrecorded"] == 3
        await asyncio.to_thread(serve_process)
        deadline = time.monotonic() + 60
        while (seq := await ex.event("myapp.c", {})) is None:
            assert time.monotonic() < deadline, "the asyncio client never recorded again"
            await asyncio.sleep(0.1)
        assert seq == 1
        assert await asyncio.gather(ex.event("myapp.d", {}), ex.finish({"status": "success", "payload": {}})) == [2, 3]
        record = await client.get(ex.execution_id)
        await client.close()
        return record

    record = asyncio.run(run())
    assert [e.type for e in record.events] == ["myapp.c", "myapp.d", "FINAL_RESPONSE"]
    assert record.header.replayableReason == "recording_failure"



async def _swallowing_proxy(path: str, upstream: str, swallow: str, connections: list):
    """A unix-socket proxy to the recorder at `upstream` that never forwards a request whose op
    is `swallow`: a recorder that answers hello and start, and then hangs (stuck on its disk).
    Each connection accepted is appended to `connections`."""
    async def handle(reader, writer):
        connections.append(writer)
        up_r, up_w = await asyncio.open_unix_connection(upstream.removeprefix("unix:"))

        async def back():
            while line := await up_r.readline():
                writer.write(line)
            writer.close()

        task = asyncio.get_running_loop().create_task(back())
        try:
            while line := await reader.readline():
                if orjson.loads(line).get("op") != swallow:
                    up_w.write(line)
        finally:
            up_w.close()
            task.cancel()

    return await asyncio.start_unix_server(handle, path)


def test_the_asyncio_client_gives_up_on_a_hung_recorder_within_its_two_timeouts(tdir, serve_process):
    """Raise mode: a request unanswered for timeout_s is resent on a new connection, and fails
    reconnect_timeout_s later, however recently the resend went out (it used to wait a whole
    timeout_s after the resend: 2 x timeout_s in all)."""
    rec = serve_process()
    proxy_path = os.path.join(tdir, "proxy.sock")
    connections: list = []

    async def run():
        proxy = await _swallowing_proxy(proxy_path, rec.socket, "event", connections)
        client = await connect_async("unix:" + proxy_path, timeout_s=2.0, reconnect_timeout_s=0.5)
        try:
            ex = await client.start("hung.async", {"intent": "hung.async"})
            t0 = time.monotonic()
            with pytest.raises(RecorderUnavailableError, match="nor after reconnecting"):
                await ex.event("myapp.step", {"i": 1})
            return time.monotonic() - t0
        finally:
            await client.close()
            proxy.close()

    waited = asyncio.run(run())
    assert len(connections) >= 2  # the request was resent on a new connection
    assert 2.0 <= waited < 2.0 + 0.5 + 1.0, f"gave up after {waited:.2f} s (timeout_s 2 + reconnect_timeout_s 0.5)"
