"""The client library: one API for a sidecar and for in-process recording; reconnects without
duplicating events."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from tracedb import errors as E
from tracedb.sidecar.client import (
    Client,
    OutcomeUnknownError,
    RecorderUnavailableError,
    SeqConflictError,
    connect,
    connect_async,
    parse_address,
    resolve_sidecar,
)

from .helpers import CuttingProxy, SilentRecorder, sock_path

ENV = {"intent": "ProcessIntent", "payload": {"q": "capital of France"}}


def record_one(client) -> str:
    ex = client.start("ProcessIntent", ENV)
    assert ex.event("INTENT_RECEIVED", {"intent": "ProcessIntent"}) == 1
    assert ex.event("tool.requested", {"tool": "search", "args": {"q": "x"}}) == 2
    assert ex.finish({"status": "success", "payload": {"answer": "Paris"}}) == 3
    return ex.execution_id


def check_recorded(record) -> None:
    assert record.status == "completed"
    assert record.header.replayable is True
    assert [e.type for e in record.events] == ["INTENT_RECEIVED", "tool.requested", "FINAL_RESPONSE"]
    assert record.finalResponse == {"status": "success", "payload": {"answer": "Paris"}}


def test_sync_client_through_the_sidecar(store_server):
    with connect("unix:" + sock_path(store_server.config.data_dir)) as client:
        assert not client.embedded and client.ping()
        eid = record_one(client)
        check_recorded(client.get(eid))
        with pytest.raises(E.ExecutionClosedError) as closed:
            client.event(eid, "tool.requested", {})
        assert closed.value.code == "execution_closed" and closed.value.status == "completed"
        with pytest.raises(E.ExecutionNotFoundError):
            client.get("exec-missing")
        with pytest.raises(E.InvalidInputError):
            client.event(eid, "tool.requested", {"not json": object()})
        with pytest.raises(E.ExecutionExistsError):
            client.start("Other", {"x": 1}, execution_id=eid)
        again = client.start("ProcessIntent", ENV, execution_id=eid)  # a resent start
        assert again.execution_id == eid and again.last_seq == 3
        client.invalidate(eid, "operator says so")
        assert client.get(eid).header.replayableReason == "manually_invalidated"


def test_sync_client_in_process_without_a_sidecar(tdir, monkeypatch):
    monkeypatch.delenv("TRACEDB_SIDECAR", raising=False)
    assert resolve_sidecar(None, tdir) is None
    with Client(data_dir=tdir) as client:
        assert client.embedded
        eid = record_one(client)
        check_recorded(client.get(eid))
        ex = client.start("ProcessIntent", ENV)
        ex.event("AGENT_ATTEMPT_START", {"agent": "a"})
        ex.abandon("agent crashed")
        assert client.get(ex.execution_id).header.replayableReason == "execution_incomplete"


def test_async_client_through_the_sidecar_and_in_process(store_server, tdir):
    async def scenario(client):
        ex = await client.start("ProcessIntent", ENV)
        # Pipelined: all three are sent before the first answer comes back.
        seqs = await asyncio.gather(
            ex.event("INTENT_RECEIVED", {"intent": "ProcessIntent"}),
            ex.event("tool.requested", {"tool": "search", "args": {"q": "x"}}),
        )
        assert seqs == [1, 2]
        assert await ex.finish({"status": "success", "payload": {"answer": "Paris"}}) == 3
        check_recorded(await client.get(ex.execution_id))
        with pytest.raises(E.ExecutionClosedError):
            await client.event(ex.execution_id, "tool.requested", {})

    async def main():
        remote = await connect_async("unix:" + sock_path(store_server.config.data_dir))
        assert not remote.embedded
        await scenario(remote)
        await remote.close()
        local = await connect_async(data_dir=os.path.join(tdir, "local"))
        assert local.embedded
        await scenario(local)
        await local.close()

    asyncio.run(main())


def test_the_data_directory_socket_is_found(store_server, monkeypatch):
    monkeypatch.delenv("TRACEDB_SIDECAR", raising=False)
    d = store_server.config.data_dir
    assert resolve_sidecar(None, d) == "unix:" + sock_path(d)
    monkeypatch.setenv("TRACEDB_SIDECAR", "tcp://127.0.0.1:7411")
    assert resolve_sidecar(None, d) == "tcp://127.0.0.1:7411"
    assert parse_address("unix:///a/b.sock") == ("unix", "/a/b.sock")
    assert parse_address("/a/b.sock") == ("unix", "/a/b.sock")
    assert parse_address("tcp://127.0.0.1:9") == ("tcp", ("127.0.0.1", 9))
    assert parse_address("localhost:9") == ("tcp", ("localhost", 9))


def test_sync_client_reconnects_and_resends_without_duplicates(store_server, tdir):
    proxy = CuttingProxy(sock_path(store_server.config.data_dir), os.path.join(tdir, "proxy.sock"))
    with Client("unix:" + proxy.path, reconnect_timeout_s=10) as client:
        ex = client.start("ProcessIntent", ENV)
        assert ex.event("tool.requested", {"n": 1}) == 1
        proxy.cut_after(0)  # the next answer is lost with its connection
        assert ex.event("tool.responded", {"n": 2}) == 2
        assert proxy.cuts == 1 and client._recorder.remote.reconnects == 1
        proxy.cut_after(0)
        assert ex.finish({"status": "success"}) == 3
        rec = client.get(ex.execution_id)
    assert [(e.seq, e.type, e.payload) for e in rec.events] == [
        (1, "tool.requested", {"n": 1}),
        (2, "tool.responded", {"n": 2}),
        (3, "FINAL_RESPONSE", {"status": "success"}),
    ]
    proxy.close()


async def _events_through(proxy, n: int, disturb, **options):
    """`n` events pipelined through `proxy` by the asyncio client, `disturb()` called once the
    execution started; each must get its seq. The record, and how often the client reconnected."""
    client = await connect_async("unix:" + proxy.path, reconnect_timeout_s=10, **options)
    ex = await client.start("ProcessIntent", ENV)
    disturb()
    seqs = await asyncio.wait_for(asyncio.gather(*(ex.event("tool.responded", {"i": i}) for i in range(n))), timeout=20)
    assert seqs == list(range(1, n + 1))
    reconnects = client._recorder.remote.reconnects
    rec = await client.get(ex.execution_id)
    await client.close()
    return rec, reconnects


def test_async_client_resends_a_pipeline_cut_in_the_middle(store_server, tdir):
    proxy = CuttingProxy(sock_path(store_server.config.data_dir), os.path.join(tdir, "proxy.sock"))
    rec, reconnects = asyncio.run(_events_through(proxy, 60, lambda: proxy.cut_after(20)))
    assert proxy.cuts == 1 and reconnects >= 1
    assert [e.payload for e in rec.events] == [{"i": i} for i in range(60)]
    assert [e.seq for e in rec.events] == list(range(1, 61))
    proxy.close()


def test_async_client_reconnects_when_answers_stop_coming_and_records_nothing_twice(store_server, tdir):
    proxy = CuttingProxy(sock_path(store_server.config.data_dir), os.path.join(tdir, "proxy.sock"))
    # The connection stays open; answers stop after the third.
    rec, reconnects = asyncio.run(_events_through(proxy, 10, lambda: proxy.stall_after(3), timeout_s=0.5))
    assert proxy.stalls == 1 and reconnects >= 1
    assert [e.payload for e in rec.events] == [{"i": i} for i in range(10)]
    proxy.close()


def test_async_client_fails_requests_a_silent_recorder_never_answers(tdir):
    # A "recorder" that says hello and then never answers anything.
    recorder = SilentRecorder(os.path.join(tdir, "silent.sock"), hello=True)

    async def main():
        client = await connect_async(recorder.address, timeout_s=0.3, reconnect_timeout_s=0.8)
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(RecorderUnavailableError) as e:
            await asyncio.wait_for(client.ping(), timeout=10)
        waited = asyncio.get_running_loop().time() - t0
        await client.close()
        return e.value, waited

    err, waited = asyncio.run(main())
    recorder.close()
    assert "no answer from the recorder" in str(err) and err.code == "unavailable"
    assert 0.3 <= waited < 5 and len(recorder.connections) >= 2  # it reconnected and resent before giving up


def test_a_resent_event_that_differs_is_a_conflict_not_a_duplicate(store_server):
    with Client("unix:" + sock_path(store_server.config.data_dir)) as client:
        ex = client.start("ProcessIntent", ENV)
        ex.event("tool.requested", {"n": 1})
        with pytest.raises(SeqConflictError):
            client.event(ex.execution_id, "tool.requested", {"n": 999}, seq=1)
        assert client.event(ex.execution_id, "tool.requested", {"n": 1}, seq=1) == 1


def test_client_gives_up_after_the_reconnect_timeout(tdir):
    with pytest.raises(RecorderUnavailableError) as e:
        Client("unix:" + sock_path(tdir), reconnect_timeout_s=0.2)
    assert e.value.code == "unavailable"


def test_an_event_by_id_without_seq_is_never_resent_once_it_may_be_recorded(store_server, tdir):
    # Without a seq the server cannot tell a resend from a new event: resending could record it
    # twice. The client says the outcome is unknown instead; with seq= it resends safely.
    proxy = CuttingProxy(sock_path(store_server.config.data_dir), os.path.join(tdir, "proxy.sock"))
    with Client("unix:" + proxy.path, reconnect_timeout_s=10) as client:
        eid = client.start("ProcessIntent", ENV).execution_id
        proxy.cut_after(0)  # the answer to the next request is lost with its connection
        with pytest.raises(OutcomeUnknownError, match="may or may not be recorded"):
            client.event(eid, "tool.requested", {"k": 1})
        proxy.cut_after(0)
        assert client.event(eid, "tool.responded", {"k": 2}, seq=2) == 2
        proxy.cut_after(0)
        with pytest.raises(OutcomeUnknownError):
            client.finish(eid, {"status": "success"})
        rec = client.get(eid)
    assert [(e.seq, e.type) for e in rec.events] == [(1, "tool.requested"), (2, "tool.responded"), (3, "FINAL_RESPONSE")]
    assert proxy.cuts == 3
    proxy.close()


def test_async_event_by_id_without_seq_fails_instead_of_being_resent(store_server, tdir):
    proxy = CuttingProxy(sock_path(store_server.config.data_dir), os.path.join(tdir, "proxy.sock"))

    async def main():
        client = await connect_async("unix:" + proxy.path, reconnect_timeout_s=10)
        eid = (await client.start("ProcessIntent", ENV)).execution_id
        proxy.cut_after(0)
        with pytest.raises(OutcomeUnknownError):
            await client.event(eid, "tool.requested", {"k": 1})
        assert await client.event(eid, "tool.responded", {"k": 2}, seq=2) == 2
        rec = await client.get(eid)
        await client.close()
        return rec

    rec = asyncio.run(main())
    assert [(e.seq, e.payload) for e in rec.events] == [(1, {"k": 1}), (2, {"k": 2})]
    proxy.close()


def test_async_client_fails_pending_requests_the_restarted_recorder_refuses(tdir, serve_process):
    # After a restart with another token, the reconnect's hello is refused: the requests waiting
    # for it fail at once with that error, not after the watchdog with a misleading one.
    from benchmarks.sidecar import free_port

    port = free_port()
    server = serve_process("--tcp", f"127.0.0.1:{port}", env={"TRACEDB_TOKEN": "tok-a"})

    async def main():
        client = await connect_async(f"tcp://127.0.0.1:{port}", token="tok-a", timeout_s=30, reconnect_timeout_s=30)
        ex = await client.start("ProcessIntent", ENV)
        assert server.terminate()[0] == 0
        serve_process("--tcp", f"127.0.0.1:{port}", env={"TRACEDB_TOKEN": "tok-b"})
        t0 = time.monotonic()
        with pytest.raises(E.TraceDBError) as info:
            await ex.event("tool.requested", {})
        await client.close()
        return info.value, time.monotonic() - t0

    err, waited = asyncio.run(main())
    assert getattr(err, "code", None) == "unauthorized" and waited < 10


def test_async_client_fails_a_pending_request_over_the_restarted_recorders_frame_limit(tdir, serve_process):
    server = serve_process()

    async def main():
        client = await connect_async("unix:" + server.socket, timeout_s=30, reconnect_timeout_s=30)
        ex = await client.start("ProcessIntent", ENV)
        assert server.terminate()[0] == 0
        big = ex.event("tool.requested", {"blob": "x" * 100_000})  # waits for the reconnect
        serve_process("--max-frame-bytes", "65536")
        t0 = time.monotonic()
        with pytest.raises(E.TraceDBError) as info:
            await big
        waited = time.monotonic() - t0
        await client.close()
        return info.value, waited

    err, waited = asyncio.run(main())
    assert getattr(err, "code", None) == "frame_too_large" and waited < 10


def test_a_sync_client_idle_across_a_restart_sends_an_event_without_seq_on_a_new_connection(tdir, serve_process):
    # The server closed the idle connection when it stopped: an event without seq, which must
    # not be resent once it may have arrived, is sent on a fresh connection instead of failing.
    server = serve_process()
    with Client("unix:" + server.socket, reconnect_timeout_s=10) as idle:
        assert idle.ping()
        assert server.terminate()[0] == 0
        server = serve_process()
        with Client("unix:" + server.socket) as other:
            eid = other.start("ProcessIntent", ENV).execution_id
        assert idle.event(eid, "tool.requested", {"k": 1}) == 1
        assert [e.seq for e in idle.get(eid).events] == [1]
