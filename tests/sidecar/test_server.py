"""Server lifecycle and limits: socket permissions, TCP and tokens, connection limit, backpressure,
graceful shutdown (in-process, on temporary sockets)."""

from __future__ import annotations

import logging
import os
import socket
import stat

import orjson
import pytest

from tracedb.sidecar.server import ServerConfig, ServerConfigError, SidecarServer, check_config

from .conftest import make_server
from .helpers import LineClient, flood_held, release_flood, sock_path, wait_for


def test_socket_is_0600_and_a_directory_it_did_not_create_keeps_its_mode(tdir):
    data = os.path.join(tdir, "data")
    os.makedirs(data, mode=0o755)
    os.chmod(data, 0o755)
    shared = os.path.join(tdir, "shared")  # as /tmp: everyone writes, the sticky bit protects
    os.makedirs(shared)
    os.chmod(shared, 0o1777)
    created = os.path.join(tdir, "new", "sock")
    servers = [
        make_server(os.path.join(tdir, "w1"), ServerConfig(socket_path=sock_path(data))),
        make_server(os.path.join(tdir, "w2"), ServerConfig(socket_path=os.path.join(shared, "t.sock"))),
        make_server(os.path.join(tdir, "w3"), ServerConfig(socket_path=os.path.join(created, "t.sock"))),
    ]
    try:
        for path in (sock_path(data), os.path.join(shared, "t.sock"), os.path.join(created, "t.sock")):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(data).st_mode) == 0o755
        assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
        assert stat.S_IMODE(os.stat(created).st_mode) == 0o700  # created by serve: private
    finally:
        for srv in servers:
            srv.stop()
    assert not os.path.exists(sock_path(data)), "the socket is removed on shutdown"


def test_a_stale_socket_is_replaced_and_a_live_one_refused(tdir):
    path = sock_path(tdir)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)  # a socket file nobody listens on: what a SIGKILLed server leaves
    stale.close()
    srv = make_server(tdir, ServerConfig(socket_path=path))
    try:
        assert LineClient(path).call({"id": 1, "op": "ping"})["ok"]
        with pytest.raises(ServerConfigError, match="another server is listening"):
            make_server(os.path.join(tdir, "other"), ServerConfig(socket_path=path))
    finally:
        srv.stop()


def test_non_loopback_tcp_needs_allow_remote_and_a_token():
    with pytest.raises(ServerConfigError, match="non-loopback"):
        check_config(ServerConfig(tcp_host="0.0.0.0", tcp_port=0))
    with pytest.raises(ServerConfigError, match="token"):
        check_config(ServerConfig(tcp_host="0.0.0.0", tcp_port=0, allow_remote=True))
    check_config(ServerConfig(tcp_host="0.0.0.0", tcp_port=0, allow_remote=True, token="s3cret"))
    # Trusting the local users opens loopback only: a public address still needs the token.
    with pytest.raises(ServerConfigError, match="token"):
        check_config(ServerConfig(tcp_host="0.0.0.0", tcp_port=0, allow_remote=True, trust_local_users=True))


def test_loopback_tcp_needs_a_token_unless_local_users_are_trusted():
    for host in ("127.0.0.1", "::1", "localhost"):
        with pytest.raises(ServerConfigError, match="needs a bearer token") as e:
            check_config(ServerConfig(tcp_host=host, tcp_port=0))
        assert "--trust-local-users" in e.value.hint
        check_config(ServerConfig(tcp_host=host, tcp_port=0, token="s3cret"))
        check_config(ServerConfig(tcp_host=host, tcp_port=0, trust_local_users=True))
        check_config(ServerConfig(tcp_host=host, tcp_port=0), local_token=True)


def test_loopback_tcp_serves_without_a_token_when_local_users_are_trusted(tdir):
    srv = make_server(tdir, ServerConfig(tcp_host="127.0.0.1", tcp_port=0, trust_local_users=True))
    try:
        c = LineClient(tcp=srv.server.tcp_address)
        assert c.call({"id": 1, "op": "start", "intent": "I", "envelope": {}, "execution_id": "e1"})["ok"]
        assert c.call({"id": 2, "op": "event", "execution_id": "e1", "type": "t.x", "payload": {}})["seq"] == 1
    finally:
        srv.stop()


def test_a_browsers_request_to_the_tcp_port_records_nothing(tdir):
    # Any web page may POST to a loopback port; a body of protocol lines must not be read as
    # requests, even where loopback takes no token.
    srv = make_server(tdir, ServerConfig(tcp_host="127.0.0.1", tcp_port=0, trust_local_users=True))
    try:
        body = b'{"id": 1, "op": "start", "intent": "FromAPage", "envelope": {}, "execution_id": "e-page"}\n'
        c = LineClient(tcp=srv.server.tcp_address)
        c.send_raw(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert c.at_eof() and bytes(c.buf) == b"", "closed without an answer"
        c = LineClient(tcp=srv.server.tcp_address)
        r = c.call({"id": 2, "op": "event", "execution_id": "e-page", "type": "t.x", "payload": {}})
        assert r["error"]["code"] == "unknown_execution"
    finally:
        srv.stop()


def test_tcp_with_a_token_requires_hello_with_that_token(tdir):
    srv = make_server(tdir, ServerConfig(tcp_host="127.0.0.1", tcp_port=0, token="s3cret"))
    try:
        addr = srv.server.tcp_address
        c = LineClient(tcp=addr)
        r = c.call({"id": 1, "op": "start", "intent": "I", "envelope": {}})
        assert r["error"]["code"] == "unauthorized"
        assert c.at_eof(), "an unauthenticated request closes the connection"
        c = LineClient(tcp=addr)
        assert c.call({"id": 1, "op": "hello", "token": "s3creT"})["error"]["code"] == "unauthorized"
        assert c.at_eof()
        c = LineClient(tcp=addr)
        assert c.call({"id": 1, "op": "hello", "token": "s3cret"})["ok"]
        assert c.call({"id": 2, "op": "start", "intent": "I", "envelope": {}, "execution_id": "e"})["ok"]
        # The Unix socket is not configured here; the counters saw the refusals.
        assert srv.server.counters.errors["unauthorized"] == 2
    finally:
        srv.stop()


def test_connections_over_the_limit_get_overloaded(tdir):
    srv = make_server(tdir, ServerConfig(socket_path=sock_path(tdir), max_connections=2))
    try:
        a, b = LineClient(sock_path(tdir)), LineClient(sock_path(tdir))
        assert a.call({"id": 1, "op": "ping"})["ok"] and b.call({"id": 1, "op": "ping"})["ok"]
        c = LineClient(sock_path(tdir))
        r = c.recv()
        assert r["ok"] is False and r["error"]["code"] == "overloaded"
        assert c.at_eof()
        a.close()
        wait_for(lambda: len(srv.server.connections) == 1, what="the closed connection to be dropped")
        d = LineClient(sock_path(tdir))
        assert d.call({"id": 1, "op": "ping"})["ok"]
    finally:
        srv.stop()


def test_in_flight_limit_stops_reading_the_connection(tdir):
    cfg = ServerConfig(socket_path=sock_path(tdir), max_inflight_requests=8)
    srv = make_server(tdir, cfg)
    try:
        n = 2000
        c, sender, conn = flood_held(srv, n, pad_bytes=500)
        # Far fewer than the 2000 sent are held in the server's memory.
        assert conn.inflight < n // 2
        release_flood(srv, c, n, sender)
    finally:
        srv.stop()


def test_shutdown_answers_every_pending_request_then_closes(tdir):
    srv = make_server(tdir, ServerConfig(socket_path=sock_path(tdir)))
    c = LineClient(sock_path(tdir))
    c.call({"id": 0, "op": "start", "intent": "I", "envelope": {}, "execution_id": "e"})
    srv.hold()
    c.send_raw(b"".join(
        orjson.dumps({"id": i, "op": "event", "execution_id": "e", "type": "t.x", "payload": {}, "seq": i}) + b"\n"
        for i in (1, 2, 3)
    ))
    conn = next(iter(srv.server.connections))
    wait_for(lambda: conn.inflight == 3, what="three staged requests")
    srv.loop.call_soon_threadsafe(srv.server.request_stop)
    wait_for(lambda: srv.server.draining, what="the shutdown to begin")
    # Requests arriving during the drain are refused, not left hanging.
    c.send({"id": 4, "op": "event", "execution_id": "e", "type": "t.x", "payload": {}, "seq": 4})
    assert c.recv() == {"id": 4, "ok": False, "error": {"code": "unavailable", "message": "the server is shutting down; retry later"}}
    srv.release()
    got = sorted((c.recv() for _ in range(3)), key=lambda r: r["id"])
    assert got == [{"id": i, "ok": True, "seq": i} for i in (1, 2, 3)]
    assert c.at_eof()
    srv.stop()
    assert srv.backend.closed


def test_server_needs_something_to_listen_on():
    with pytest.raises(ServerConfigError):
        SidecarServer(object(), ServerConfig())


def test_a_half_closed_connection_gets_every_answer_then_eof(tdir):
    srv = make_server(tdir, ServerConfig(socket_path=sock_path(tdir), data_dir=tdir), backend="store")
    try:
        c = LineClient(sock_path(tdir))
        reqs = [{"id": 0, "op": "start", "intent": "I", "envelope": {}, "execution_id": "e-half"}]
        reqs += [{"id": i, "op": "event", "execution_id": "e-half", "type": "t.x", "payload": {}, "seq": i} for i in range(1, 5)]
        # A resend (resolved off the hot path, holding back what follows), then one more event.
        reqs.append({"id": 10, "op": "event", "execution_id": "e-half", "type": "t.x", "payload": {}, "seq": 2})
        reqs.append({"id": 5, "op": "event", "execution_id": "e-half", "type": "t.x", "payload": {}, "seq": 5})
        reqs.append({"id": 6, "op": "get", "execution_id": "e-half"})
        c.send_raw(b"".join(orjson.dumps(r) + b"\n" for r in reqs))
        c.sock.shutdown(socket.SHUT_WR)  # the client is done sending
        got = {r["id"]: r for r in (c.recv() for _ in reqs)}
        assert all(r["ok"] for r in got.values())
        assert got[10] == {"id": 10, "ok": True, "seq": 2, "duplicate": True}
        assert got[5]["seq"] == 5
        assert [e["seq"] for e in got[6]["record"]["events"]] == [1, 2, 3, 4, 5]
        assert c.at_eof()
    finally:
        srv.stop()


class _FlakyFs:
    """The real file calls, but fdatasync fails with EIO once `fail` is set."""

    def __init__(self):
        import wal

        self._os = wal.OsFileSystem()
        self.fail = False

    def __getattr__(self, name):
        return getattr(self._os, name)

    def fdatasync(self, fd):
        if self.fail:
            import errno

            raise OSError(errno.EIO, "injected I/O error")
        self._os.fdatasync(fd)


def test_a_failing_disk_fails_the_writes_in_flight_and_the_server_keeps_answering(tdir):
    from tracedb.sidecar.metrics import SidecarMetrics

    from .fake_backend import MemoryBackend
    from .helpers import ServerThread

    fs = _FlakyFs()
    metrics = SidecarMetrics()
    logged: list[logging.LogRecord] = []
    catch = logging.Handler(logging.ERROR)
    catch.emit = logged.append
    logging.getLogger("tracedb.sidecar").addHandler(catch)
    srv = ServerThread(lambda: MemoryBackend(os.path.join(tdir, "wal"), fs=fs),
                       ServerConfig(socket_path=sock_path(tdir)), metrics=metrics).start()
    try:
        c = LineClient(sock_path(tdir))
        assert c.call({"id": 1, "op": "start", "intent": "I", "envelope": {}, "execution_id": "e"})["ok"]
        fs.fail = True
        r = c.call({"id": 2, "op": "event", "execution_id": "e", "type": "t.x", "payload": {}, "seq": 1})
        assert r["ok"] is False and r["error"]["code"] == "unavailable", r
        assert c.call({"id": 3, "op": "ping"})["ok"]
        # The WAL refuses everything from now on (fail closed): later writes fail at once.
        r = c.call({"id": 4, "op": "event", "execution_id": "e", "type": "t.x", "payload": {}})
        assert r["error"]["code"] == "unavailable"
        status, body = srv.call(metrics.health)
        assert status == 503 and body["status"] == "failed"
        # One error line says so, however many writes it refuses.
        failures = [r for r in logged if "WAL failed closed" in r.getMessage()]
        assert len(failures) == 1 and "injected I/O error" in failures[0].error
    finally:
        logging.getLogger("tracedb.sidecar").removeHandler(catch)
        srv.stop()


def test_with_recording_disabled_requests_are_answered_and_nothing_is_kept(tdir):
    # `enabled = false` (TRACING_ENABLED=false): the server answers as if it recorded, writes
    # nothing, and keeps serving the connection.
    srv = make_server(tdir, ServerConfig(socket_path=sock_path(tdir), data_dir=tdir), backend="store", enabled=False)
    try:
        c = LineClient(sock_path(tdir))
        env = {"intent": "ProcessIntent", "payload": {}}
        r = c.call({"id": 1, "op": "start", "intent": "ProcessIntent", "envelope": env, "execution_id": "exec-off"})
        assert r["ok"] and r["created"] is True
        r = c.call({"id": 2, "op": "event", "execution_id": "exec-off", "type": "tool.requested", "payload": {}, "seq": 1})
        assert r == {"id": 2, "ok": True, "seq": 1}
        assert c.call({"id": 3, "op": "finish", "execution_id": "exec-off", "response": {"status": "success"}})["ok"]
        assert c.call({"id": 4, "op": "get", "execution_id": "exec-off"})["error"]["code"] == "unknown_execution"
        assert c.call({"id": 5, "op": "ping"})["ok"]
    finally:
        srv.stop()
