"""The wire protocol's listeners under abuse, in-process on real sockets: the first-frame deadline,
the idle timeout (and what it spares), room made at the connection cap, the project's clients
across an idle close, and the descriptor budget."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import orjson
import pytest

from tests.waiting import wait_until, wait_until_async
from tracedb.sidecar.asgi import LISTENER_OVERHEAD_FDS, RESERVED_FDS, descriptor_budget
from tracedb.errors import ConfigError
from tracedb.sidecar.client import connect, connect_async
from tracedb.sidecar.metrics import SidecarMetrics
from tracedb.sidecar.server import ServerConfig

from .conftest import make_server
from .helpers import LineClient, flood_held, release_flood, sock_path

pytestmark = pytest.mark.timeout(120)


def _closed_at(c: LineClient, timeout_s: float) -> float:
    """When the server closed the connection (time.monotonic()); fails after `timeout_s`."""
    c.sock.settimeout(timeout_s)
    try:
        assert c.at_eof()
    except socket.timeout:
        raise AssertionError(f"the server did not close the connection within {timeout_s} s") from None
    return time.monotonic()


def _still_open(c: LineClient) -> bool:
    c.sock.setblocking(False)
    try:
        return c.sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    finally:
        c.sock.setblocking(True)


def test_a_connection_that_never_completes_its_first_frame_is_closed_at_the_deadline(tdir):
    srv = make_server(tdir, ServerConfig(socket_path=sock_path(tdir), first_frame_timeout_s=0.5))
    try:
        listener = srv.server.listeners["unix"]
        t0 = time.monotonic()
        silent = LineClient(sock_path(tdir))
        trickling = LineClient(sock_path(tdir))
        talking = LineClient(sock_path(tdir))
        assert talking.call({"id": 1, "op": "ping"})["ok"]
        stop = threading.Event()

        def trickle():  # a frame that never ends, one byte at a time
            for b in b'{"id": 2, "op": "ping", "pad": "' + b"x" * 1000:
                if stop.wait(0.02):
                    return
                try:
                    trickling.sock.send(bytes([b]))
                except OSError:
                    return

        threading.Thread(target=trickle, daemon=True).start()
        try:
            for c in (silent, trickling):
                assert _closed_at(c, 10) - t0 >= 0.5
        finally:
            stop.set()
        assert listener.closed["deadline"] == 2
        # A connection that sent a whole frame is past the deadline's reach.
        assert _still_open(talking) and talking.call({"id": 3, "op": "ping"})["ok"]
    finally:
        srv.stop()


def test_an_idle_connection_is_closed_after_the_idle_timeout_not_before(tdir):
    metrics = SidecarMetrics()
    srv = make_server(tdir, ServerConfig(socket_path=sock_path(tdir), connection_idle_timeout_s=0.6), metrics=metrics)
    try:
        c = LineClient(sock_path(tdir))
        assert c.call({"id": 1, "op": "ping"})["ok"]
        last = time.monotonic()
        assert _closed_at(c, 10) - last >= 0.6
        assert srv.server.listeners["unix"].closed["idle"] == 1
        assert 'tracedb_listener_closed_total{listener="unix",reason="idle"} 1.0' in metrics.render().decode()
    finally:
        srv.stop()


def test_the_idle_timeout_spares_a_connection_waiting_for_its_acknowledgements(tdir):
    srv = make_server(tdir, ServerConfig(socket_path=sock_path(tdir), connection_idle_timeout_s=0.4))
    try:
        c = LineClient(sock_path(tdir))
        c.call({"id": 0, "op": "start", "intent": "I", "envelope": {}, "execution_id": "e"})
        srv.hold()  # the disk "stalls": answers wait
        c.send({"id": 1, "op": "event", "execution_id": "e", "type": "t.x", "payload": {}, "seq": 1})
        conn = next(iter(srv.server.connections))
        wait_until(lambda: conn.inflight == 1, 10, "the event to be staged")
        # A witness that went quiet after this connection: once the sweep closed it for idling,
        # it has looked at the waiting connection, quiet for longer, and kept it.
        witness = LineClient(sock_path(tdir))
        assert witness.call({"id": 1, "op": "ping"})["ok"]
        _closed_at(witness, 10)
        assert _still_open(c)
        srv.release()
        assert c.recv() == {"id": 1, "ok": True, "seq": 1}
        _closed_at(c, 10)  # then idle, and closed
        assert srv.server.listeners["unix"].closed["idle"] == 2
    finally:
        srv.stop()


def test_the_idle_timeout_spares_a_connection_the_server_stopped_reading(tdir):
    cfg = ServerConfig(socket_path=sock_path(tdir), connection_idle_timeout_s=0.4, max_inflight_requests=8)
    srv = make_server(tdir, cfg)
    try:
        # Paused for requests in flight: the disk holds the answers.
        n = 200
        c, sender, conn = flood_held(srv, n, pad_bytes=2000)
        # Paused because its peer reads no answers: pings pile up answers it leaves unread.
        d = LineClient(sock_path(tdir))
        wait_until(lambda: len(srv.server.connections) == 2, 10, "the second connection")
        d.sock.setblocking(False)
        pings = b'{"id":1,"op":"ping"}\n' * 20000
        sent = 0
        conn_d = next(x for x in srv.server.connections if x is not conn)
        while not conn_d.read_paused:
            try:
                sent += d.sock.send(pings[sent % len(pings):])
            except BlockingIOError:
                wait_until(lambda: conn_d.read_paused or _writable(d.sock), 10, "room to send, or a pause")
        witness = LineClient(sock_path(tdir))
        assert witness.call({"id": 1, "op": "ping"})["ok"]
        _closed_at(witness, 10)
        assert _still_open(c) and conn in srv.server.connections and conn_d in srv.server.connections
        release_flood(srv, c, n, sender)
        d.sock.setblocking(True)
        d.sock.settimeout(20)
        answered = 0
        while answered < sent // len(b'{"id":1,"op":"ping"}\n'):
            assert d.recv() == {"id": 1, "ok": True, "pong": True}
            answered += 1
    finally:
        srv.stop()


def _writable(sock: socket.socket) -> bool:
    import select

    return bool(select.select([], [sock], [], 0)[1])


def test_at_the_cap_a_newcomer_is_served_by_closing_a_connection_that_sent_nothing(tdir):
    srv = make_server(tdir, ServerConfig(socket_path=sock_path(tdir), max_connections=3))
    try:
        silent = [LineClient(sock_path(tdir)) for _ in range(3)]
        wait_until(lambda: len(srv.server.connections) == 3, 10, "three connections")
        newcomer = LineClient(sock_path(tdir))
        assert newcomer.call({"id": 1, "op": "ping"}) == {"id": 1, "ok": True, "pong": True}
        _closed_at(silent[0], 10)  # the one that waited longest made room
        assert _still_open(silent[1]) and _still_open(silent[2])
        listener = srv.server.listeners["unix"]
        assert listener.closed["evicted"] == 1 and listener.refused["limit"] == 0
        # Once every connection has spoken, a newcomer is refused, as before.
        for c in silent[1:]:
            assert c.call({"id": 1, "op": "ping"})["ok"]
        late = LineClient(sock_path(tdir))
        assert late.recv()["error"]["code"] == "overloaded"
        assert late.at_eof()
        assert listener.refused["limit"] == 1 and listener.open == 3
    finally:
        srv.stop()


def test_at_the_cap_a_newcomer_that_speaks_late_is_let_in_and_a_silent_one_refused_after_probation(tdir):
    from tracedb.sidecar.asgi import PROBATION_S

    srv = make_server(tdir, ServerConfig(socket_path=sock_path(tdir), max_connections=2))
    try:
        listener = srv.server.listeners["unix"]
        talking = LineClient(sock_path(tdir))
        assert talking.call({"id": 1, "op": "ping"})["ok"]
        silent = LineClient(sock_path(tdir))
        wait_until(lambda: len(srv.server.connections) == 2, 10, "two connections")
        late = LineClient(sock_path(tdir))  # at the cap, and silent for now: held unread
        wait_until(lambda: len(listener._probation) == 1, 10, "the newcomer to wait in probation")
        assert late.call({"id": 1, "op": "ping"}) == {"id": 1, "ok": True, "pong": True}
        _closed_at(silent, 10)
        assert listener.closed["evicted"] == 1
        # Nothing to close now (both connections spoke): a silent newcomer is refused once its
        # probation is over.
        t0 = time.monotonic()
        refused = LineClient(sock_path(tdir))
        assert refused.recv()["error"]["code"] == "overloaded"
        assert time.monotonic() - t0 >= PROBATION_S
        assert refused.at_eof() and listener.refused["limit"] == 1
    finally:
        srv.stop()


# The TCP listener takes a bearer token (docs/security.md); the Unix socket ignores it.
TOKEN = "limits-test-token"


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_the_sync_client_reconnects_after_an_idle_close_without_losing_or_repeating(tdir, transport):
    cfg = ServerConfig(socket_path=sock_path(tdir), tcp_host="127.0.0.1", tcp_port=0, data_dir=tdir,
                       connection_idle_timeout_s=0.3, token=TOKEN)
    srv = make_server(tdir, cfg, backend="store")
    try:
        address = f"unix:{sock_path(tdir)}" if transport == "unix" else f"tcp://127.0.0.1:{srv.server.tcp_address[1]}"
        listener = srv.server.listeners[transport]
        with connect(address, token=TOKEN) as client:
            ex = client.start("I", {"q": 1}, "exec-idle")
            assert ex.event("t.a", {"n": 1}) == 1
            wait_until(lambda: listener.closed["idle"] == 1, 10, "the idle connection to be closed")
            assert ex.event("t.a", {"n": 2}) == 2  # resent on a new connection
            other = client.start("I", {"q": 2}, "exec-noseq")
            wait_until(lambda: listener.closed["idle"] == 2, 10, "the idle connection to be closed again")
            # Without seq an event cannot be resent safely; it must not be lost to the close.
            assert client.event("exec-noseq", "t.b", {"n": 1}) == 1
            assert ex.finish({"status": "ok"}) == 3
            assert other.last_seq == 0 and client._recorder.remote.reconnects == 2
            rec = client.get("exec-idle")
            noseq = client.get("exec-noseq")
        assert [(e.seq, e.payload) for e in rec.events] == [(1, {"n": 1}), (2, {"n": 2}), (3, {"status": "ok"})]
        assert [(e.seq, e.payload) for e in noseq.events] == [(1, {"n": 1})]
    finally:
        srv.stop()


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_the_async_client_reconnects_after_an_idle_close_without_losing_or_repeating(tdir, transport):
    cfg = ServerConfig(socket_path=sock_path(tdir), tcp_host="127.0.0.1", tcp_port=0, data_dir=tdir,
                       connection_idle_timeout_s=0.3, token=TOKEN)
    srv = make_server(tdir, cfg, backend="store")
    address = f"unix:{sock_path(tdir)}" if transport == "unix" else f"tcp://127.0.0.1:{srv.server.tcp_address[1]}"
    listener = srv.server.listeners[transport]

    async def main():
        client = await connect_async(address, token=TOKEN)
        try:
            ex = await client.start("I", {"q": 1}, "exec-idle")
            assert await ex.event("t.a", {"n": 1}) == 1
            await wait_until_async(lambda: listener.closed["idle"] == 1, 10, "the idle connection to be closed")
            # Pipelined on the connection the client opens again.
            assert await asyncio.gather(ex.event("t.a", {"n": 2}), ex.event("t.a", {"n": 3})) == [2, 3]
            await client.start("I", {"q": 2}, "exec-noseq")
            await wait_until_async(lambda: listener.closed["idle"] == 2, 10, "the idle connection to be closed again")
            await wait_until_async(lambda: client._recorder.remote._writer is None, 10, "the client to see the close")
            assert await client.event("exec-noseq", "t.b", {"n": 1}) == 1
            assert await ex.finish({"status": "ok"}) == 4
            assert client._recorder.remote.reconnects == 2
            return await client.get("exec-idle"), await client.get("exec-noseq")
        finally:
            await client.close()

    try:
        rec, noseq = asyncio.run(main())
        assert [(e.seq, e.payload) for e in rec.events] == [
            (1, {"n": 1}), (2, {"n": 2}), (3, {"n": 3}), (4, {"status": "ok"})]
        assert [(e.seq, e.payload) for e in noseq.events] == [(1, {"n": 1})]
    finally:
        srv.stop()


def test_the_descriptor_budget_keeps_the_reserve_and_the_socket_and_shares_the_rest():
    wanted = {"tcp": 256, "otlp": 128, "http": 64}
    # Enough for everything: the caps asked for. The defaults fit systemd's default limit.
    assert descriptor_budget(4096, {"unix": 256}, wanted) == {"unix": 256, **wanted}
    assert descriptor_budget(1024, {"unix": 256}, wanted) == {"unix": 256, **wanted}
    assert RESERVED_FDS + sum(c + LISTENER_OVERHEAD_FDS for c in (256, *wanted.values())) == 968
    # Too little: the socket keeps its cap, the others share what the reserve leaves, in proportion.
    caps = descriptor_budget(640, {"unix": 256}, wanted)
    assert caps["unix"] == 256
    assert caps["tcp"] > caps["otlp"] > caps["http"] >= 1
    assert caps["tcp"] < 256 and caps["otlp"] < 128 and caps["http"] < 64
    held = RESERVED_FDS + sum(c + LISTENER_OVERHEAD_FDS for c in caps.values())
    assert 640 - 3 <= held <= 640  # what rounding down leaves
    with pytest.raises(ConfigError) as e:
        descriptor_budget(300, {"unix": 256}, wanted)
    assert "LimitNOFILE" in e.value.hint


def test_out_of_descriptors_waiting_connections_are_shed_counted_and_logged_once_a_second(tdir):
    """asyncio's accept loop logged a traceback per attempt when the process had no descriptor
    left (hundreds of MB a minute); the listener sheds what waits with its spare descriptor."""
    import os
    import resource
    import subprocess
    import sys

    from tests.serving import ROOT

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    log_path = os.path.join(tdir, "server.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.sidecar.emfile_server", tdir], cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=ROOT), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard)),
        )

    def ask(command: str):
        proc.stdin.write(command.encode() + b"\n")
        proc.stdin.flush()
        return orjson.loads(proc.stdout.readline())

    clients: list[socket.socket] = []
    try:
        port = orjson.loads(proc.stdout.readline())["tcp"]
        assert ask("fill")["filled"] > 0
        t0 = time.monotonic()
        for _ in range(300):
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            u.settimeout(10)
            u.connect(sock_path(tdir))
            clients.append(u)
        for c in clients:  # each is shed: told it is refused, and closed
            try:
                while c.recv(65536):
                    pass
            except ConnectionResetError:
                pass
            except socket.timeout:
                raise AssertionError("a connection the server could not accept was left waiting") from None
        elapsed = time.monotonic() - t0
        metrics = ask("metrics")
        assert ask("free")["freed"] > 0
        served = LineClient(sock_path(tdir))
        assert served.call({"id": 1, "op": "ping"})["ok"]
        served.close()
        proc.stdin.close()  # quit
        assert proc.wait(30) == 0
    finally:
        for c in clients:
            c.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with open(log_path, "rb") as f:
        log_text = f.read().decode()
    assert "socket.accept() out of system resource" not in log_text  # asyncio's traceback
    lines = [orjson.loads(line) for line in log_text.splitlines() if line.startswith("{")]
    for name in ("unix", "tcp"):
        said = [doc for doc in lines if doc["msg"].startswith("cannot accept connections") and doc["listener"] == name]
        assert 1 <= len(said) <= elapsed + 2
        assert said[0]["error"] == "EMFILE"
        assert f'tracedb_listener_refused_total{{listener="{name}",reason="descriptors"}} 300.0' in metrics
        errors = f'tracedb_listener_accept_errors_total{{errno="EMFILE",listener="{name}"}} '
        assert float(metrics.split(errors)[1].split()[0]) >= 1


def test_serve_refuses_to_start_when_the_limit_of_open_files_cannot_hold_the_reserve(tdir):
    import os
    import resource
    import subprocess
    import sys

    from tests.serving import ROOT

    out = subprocess.run(
        [sys.executable, "-m", "tracedb", "--data-dir", tdir, "serve"], cwd=ROOT, capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=ROOT), timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300)),
    )
    assert out.returncode == 1, out.stderr
    assert "error: the limit of 300 open files is too low" in out.stderr
    assert "hint: raise the limit (systemd: LimitNOFILE=" in out.stderr
    assert not os.path.exists(sock_path(tdir))


def test_the_documented_sidecar_keys_are_read_with_their_defaults():
    import os
    import tomllib
    from types import SimpleNamespace

    from tracedb.cli.serve import sidecar_file_settings
    from tracedb.sidecar import protocol as P

    from tests.serving import ROOT

    with open(os.path.join(ROOT, "config", "tracedb.toml"), "rb") as f:
        table = tomllib.load(f)["sidecar"]
    got = sidecar_file_settings(SimpleNamespace(extra={"sidecar": table}))
    assert {k: got[k] for k in ("max_connections", "first_frame_timeout_s", "connection_idle_timeout_s",
                                "otlp_max_connections", "http_max_connections", "http_header_timeout_s",
                                "http_idle_timeout_s")} == {
        "max_connections": P.DEFAULT_MAX_CONNECTIONS,
        "first_frame_timeout_s": P.DEFAULT_FIRST_FRAME_TIMEOUT_S,
        "connection_idle_timeout_s": P.DEFAULT_CONNECTION_IDLE_TIMEOUT_S,
        "otlp_max_connections": P.DEFAULT_OTLP_MAX_CONNECTIONS,
        "http_max_connections": P.DEFAULT_HTTP_MAX_CONNECTIONS,
        "http_header_timeout_s": P.DEFAULT_HTTP_HEADER_TIMEOUT_S,
        "http_idle_timeout_s": P.DEFAULT_HTTP_IDLE_TIMEOUT_S,
    }


def test_serve_takes_the_limits_from_its_flags(serve_process):
    proc = serve_process("--tcp", "127.0.0.1:0", "--otlp-port", "0", "--http-port", "0", "--max-connections", "9",
                         "--otlp-max-connections", "7", "--http-max-connections", "5",
                         "--connection-idle-timeout", "0.5")
    c = LineClient(proc.socket)
    assert c.call({"id": 1, "op": "hello"})["limits"]["max_connections"] == 9
    last = time.monotonic()
    assert _closed_at(c, 10) - last >= 0.5  # idle
    code, err = proc.terminate()
    assert code == 0, err
    log = [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]
    fds = next(doc for doc in log if doc["msg"] == "file descriptors")
    assert fds["max_connections"] == {"unix": 9, "tcp": 9, "otlp": 7, "http": 5}
    listening = next(doc for doc in log if doc["msg"] == "listening")
    assert listening["connection_idle_timeout_s"] == 0.5
