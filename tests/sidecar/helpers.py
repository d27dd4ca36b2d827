"""Helpers for the sidecar tests: a server on its own event-loop thread, a line-based socket client."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import tempfile
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import orjson

from tests.waiting import wait_until as wait_for  # noqa: F401 - the name the sidecar tests use
from tracedb.sidecar.server import ServerConfig, SidecarServer


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def stopped(proc) -> Iterator[None]:
    """The process stopped (SIGSTOP) for the block, a recorder stuck on its disk; resumed
    (SIGCONT) after it, whatever happens inside."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def short_tempdir() -> str:
    """A private temp directory with a short path (Unix socket paths are limited to ~100 bytes)."""
    return tempfile.mkdtemp(prefix="tdb")


class ServerThread:
    """A SidecarServer running on an event loop in a background thread (for sync socket tests)."""

    def __init__(self, make_backend: Callable[[], Any], config: ServerConfig, *, metrics=None):
        self.make_backend = make_backend
        self.config = config
        self.metrics = metrics
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.server: Optional[SidecarServer] = None
        self.backend = None
        self.http = None
        self.http_port: Optional[int] = None
        self._ready = threading.Event()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main():
            try:
                self.backend = self.make_backend()
                if asyncio.iscoroutine(self.backend):
                    self.backend = await self.backend
                self.server = SidecarServer(self.backend, self.config)
                if self.metrics is not None:
                    from tracedb.sidecar.asgi import HttpEndpoint
                    from tracedb.sidecar.metrics import metrics_app

                    self.metrics.attach(self.server)
                    self.http = HttpEndpoint(metrics_app(self.metrics), port=0)
                    self.http_port = await self.http.start()
                await self.server.start()
            except BaseException as e:  # noqa: BLE001 - reported to the test thread
                self._error = e
                self._ready.set()
                return
            self.loop = asyncio.get_running_loop()
            self._ready.set()
            await self.server.serve_until_stopped()
            if self.http is not None:
                await self.http.close()

        asyncio.run(main())

    def start(self) -> "ServerThread":
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("server did not start")
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn, *args):
        """Run `fn(*args)` on the server's loop and return its result."""
        fut = asyncio.run_coroutine_threadsafe(_call(fn, *args), self.loop)
        return fut.result(30)

    def hold(self) -> None:
        """Every commit of the (fake) backend waits from now on, until `release`: a disk that stalls."""
        backend = self.backend
        self.call(lambda: setattr(backend, "hold", asyncio.get_running_loop().create_future()))

    def release(self) -> None:
        """The held commits complete."""
        backend = self.backend
        self.call(lambda: backend.hold.set_result(None))

    def stop(self) -> None:
        if self.loop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.server.request_stop)
        self._thread.join(60)
        assert not self._thread.is_alive(), "server thread did not stop"


async def _call(fn, *args):
    out = fn(*args)
    if asyncio.iscoroutine(out) or asyncio.isfuture(out):
        out = await out
    return out


class LineClient:
    """A raw blocking socket speaking NDJSON: send requests (or raw bytes), read response lines."""

    def __init__(self, path: Optional[str] = None, *, tcp: Optional[tuple] = None, timeout_s: float = 20.0):
        if tcp is not None:
            self.sock = socket.create_connection(tcp, timeout=timeout_s)
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout_s)
            self.sock.connect(path)
        self.buf = bytearray()

    def send(self, obj: Any) -> None:
        self.sock.sendall(orjson.dumps(obj) + b"\n")

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> dict:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionResetError("closed by server")
            self.buf += chunk
        nl = self.buf.index(b"\n")
        line = bytes(self.buf[:nl])
        del self.buf[: nl + 1]
        return orjson.loads(line)

    def call(self, obj: Any) -> dict:
        self.send(obj)
        return self.recv()

    def at_eof(self) -> bool:
        """True once the server has closed the connection (all pending lines consumed)."""
        while True:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return True
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def store_answers(path: str, timeout_s: float = 1.0) -> bool:
    """True once a recorder's store answers on the Unix socket `path`: a `get` (of an id no
    execution has) on a fresh connection gets its answer. `tracedb serve` listens before its store
    is open, and holds requests until it is."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        s.connect(path)
        s.sendall(b'{"id":1,"op":"hello"}\n{"id":2,"op":"get","execution_id":"tests.store-answers"}\n')
        got = b""
        while got.count(b"\n") < 2:
            chunk = s.recv(65536)
            if not chunk:
                return False
            got += chunk
        return True
    except OSError:
        return False
    finally:
        s.close()


def rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def sock_path(directory: str) -> str:
    return os.path.join(directory, "tracedb.sock")


def flood_held(srv: ServerThread, n: int, pad_bytes: int) -> tuple["LineClient", threading.Thread, Any]:
    """A client that starts execution "e", then, the backend's commits held (`srv.hold`), sends
    `n` events of `pad_bytes` each from a thread until the server stops reading its connection.
    Returns the client, the sending thread and the server's side of the connection."""
    c = LineClient(srv.config.socket_path)
    c.call({"id": 0, "op": "start", "intent": "I", "envelope": {}, "execution_id": "e"})
    srv.hold()
    frames = b"".join(
        orjson.dumps({"id": i, "op": "event", "execution_id": "e", "type": "t.x", "payload": {"pad": "x" * pad_bytes},
                      "seq": i}) + b"\n" for i in range(1, n + 1))
    c.sock.settimeout(None)
    sender = threading.Thread(target=c.send_raw, args=(frames,), daemon=True)
    sender.start()
    conn = next(iter(srv.server.connections))
    wait_for(lambda: conn.read_paused, 10, "the connection to be paused")
    return c, sender, conn


def release_flood(srv: ServerThread, c: "LineClient", n: int, sender: threading.Thread) -> None:
    """`srv.release()`, then every one of `flood_held`'s `n` events is answered, in order."""
    srv.release()
    got = [c.recv() for _ in range(n)]
    assert [r["seq"] for r in got] == list(range(1, n + 1))
    sender.join(10)


class SilentRecorder:
    """A Unix socket at `path` that accepts connections and never answers a request: a recorder
    stuck on its disk. `hello`: it answers each connection's first line (the client's hello), so
    that the client connects, and nothing after it."""

    def __init__(self, path: str, *, hello: bool = False):
        self.address = "unix:" + path
        self.connections: list[socket.socket] = []
        self._hello = hello
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self._listener.accept()
            except OSError:
                return
            self.connections.append(c)
            if self._hello:
                rid = orjson.loads(c.makefile("rb").readline())["id"]
                c.sendall(orjson.dumps({"id": rid, "ok": True, "limits": {"max_frame_bytes": 1 << 20}}) + b"\n")

    def close(self) -> None:
        self._listener.close()
        for c in self.connections:
            c.close()


class CuttingProxy:
    """A Unix-socket proxy between a client and the server that can cut a connection on cue.

    `cut_after(n)`: the proxy forwards `n` more response lines to the client, then drops the
    next response line and closes both sides of that connection: the request was received and
    staged by the server, its answer never reaches the client (a transient failure). Later
    connections are forwarded untouched.

    `stall_after(n)`: the same, except that the connection stays open and silent: every later
    answer on it is dropped (a recorder that stopped answering without closing).
    """

    def __init__(self, upstream: str, path: str):
        self.upstream = upstream
        self.path = path
        self._cut_after: Optional[int] = None
        self._stall_after: Optional[int] = None
        self.cuts = 0
        self.stalls = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(16)
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after(self, n: int) -> None:
        with self._lock:
            self._cut_after = n

    def stall_after(self, n: int) -> None:
        with self._lock:
            self._stall_after = n

    def _accept(self) -> None:
        while not self._closed:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(self.upstream)
            self.connections += 1
            threading.Thread(target=self._pump, args=(down, up), daemon=True).start()
            threading.Thread(target=self._pump_back, args=(up, down), daemon=True).start()

    @staticmethod
    def _received(sock: socket.socket) -> Iterator[bytes]:
        """What `sock` receives, until its peer closes."""
        while True:
            data = sock.recv(65536)
            if not data:
                return
            yield data

    @staticmethod
    def _shut_down(*socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            for data in self._received(src):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._shut_down(src, dst)

    def _pump_back(self, up: socket.socket, down: socket.socket) -> None:
        buf = b""
        stalled = False
        try:
            for data in self._received(up):
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    with self._lock:
                        m = self._stall_after
                        if m is not None and not stalled:
                            if m == 0:
                                self._stall_after = None
                                self.stalls += 1
                                stalled = True
                            else:
                                self._stall_after = m - 1
                        n = self._cut_after
                        if n is not None:
                            if n == 0:
                                self._cut_after = None
                                self.cuts += 1
                                raise ConnectionAbortedError("cut")
                            self._cut_after = n - 1
                    if not stalled:
                        down.sendall(line + b"\n")
        except OSError:
            pass
        finally:
            self._shut_down(up, down)
            up.close()
            down.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
