"""Run an ASGI application (Starlette) on uvicorn inside an event loop that is already running,
and the limits every listener of the wire protocol keeps.

`tracedb serve` hosts its HTTP endpoints (metrics and health, the web UI, the OTLP receiver) on the
sidecar's own event loop, next to the socket listener: one process, one loop, no threads. uvicorn's
`Server.serve()` is a coroutine, so each endpoint is a task on that loop; `HttpEndpoint` starts it,
reports the bound port (0 picks a free one) and shuts it down with the recorder.

The wire protocol's listening sockets (the Unix socket, the TCP port) accept through a
`Listener`, which runs its own accept
loop on the event loop (a reader on the listening socket; each connection handed to asyncio with
`connect_accepted_socket`):

- a connection cap, held at accept time. At the cap, a newcomer is let in only once its first
  request has arrived (a frame's newline, the blank line after HTTP headers), by closing a
  connection that has waited longest without sending one: a peer that connects and says nothing
  holds no slot anybody needs. Until then the newcomer waits in a short probation, a bare socket
  the loop watches (no transport, no protocol); the oldest there is refused when it is full or
  after PROBATION_S. A flood at the cap costs an accept(), a peek and a close() per connection;
- at most ADMISSIONS_PER_TURN connections a turn of the loop, so that a flood on one listener
  keeps every turn short and the other listeners' clients are served on each;
- running out of descriptors (EMFILE, ENFILE, ENOBUFS, ENOMEM) is counted and logged at most
  once a second. asyncio's own accept loop reports it to the loop's exception handler on every
  attempt, and again in the same loop for every connection still waiting (a traceback each:
  hundreds of megabytes of log a minute). Here a spare descriptor is let go to accept and close
  what waits, and when even that fails the listener pauses for a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import itertools
import logging
import os
import socket
import time
from typing import Optional


log = logging.getLogger("tracedb.listen")

# Newcomers at the cap waiting for their first request (per listener), and for how long at most.
PROBATION = 32
PROBATION_S = 0.5
# What a listener may hold beyond its cap: its probation, the connection being refused, the
# spare descriptor.
LISTENER_OVERHEAD_FDS = PROBATION + 2
# Connections a listener accepts in one turn of the event loop below its cap (a flood on one
# listener keeps every turn short, so that the others' clients are served on each), and sheds in
# one when out of descriptors.
ADMISSIONS_PER_TURN = 16
_SHED_PER_TURN = 64
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# How long a listener stops accepting when it is out of descriptors and cannot even shed.
_ACCEPT_PAUSE_S = 1.0

# A listener at its cap looks for a newcomer's first request in as many of its first bytes.
_PEEK_BYTES = 16 << 10

def is_loopback(host: str) -> bool:
    """Whether a listening address stays on this machine (localhost, 127.0.0.0/8, ::1): the one
    rule the socket's TCP listener, the web view and the OTLP receiver apply before listening."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- descriptors ---------------------------------------------------------------------------------


def fd_limit() -> int:
    """The soft RLIMIT_NOFILE: how many descriptors this process may hold."""
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_fds() -> int:
    """How many descriptors this process holds now (-1 where /proc is not there)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # listdir's own
    except OSError:
        return -1


# -- logging at most once a second ---------------------------------------------------------------


class Throttle:
    """One log line a second at most for a condition that can recur thousands of times a
    second: `due()` counts an occurrence and says how many the line due now covers (0: none due)."""

    def __init__(self, interval_s: float = 1.0, clock=time.monotonic):
        self.interval_s = interval_s
        self.clock = clock
        self._next = float("-inf")
        self._count = 0

    def due(self) -> int:
        """Count one occurrence; the occurrences since the last line if one is due now, else 0."""
        self._count += 1
        now = self.clock()
        if now < self._next:
            return 0
        self._next = now + self.interval_s
        n, self._count = self._count, 0
        return n


class _Accepted(socket.socket):
    """An accepted connection: its listener's count goes down when it is closed (by its
    transport, or by the listener making room)."""

    __slots__ = ("listener",)

    def _release(self) -> None:
        listener = getattr(self, "listener", None)
        if listener is not None:
            self.listener = None
            listener._released(self)

    def close(self) -> None:
        self._release()
        super().close()

    def detach(self) -> int:
        self._release()
        return super().detach()


class Listener:
    """One or more listening sockets (`serve`), their connection cap, their counts (read by
    /metrics), and their conduct when the process runs out of descriptors (see the module doc).

    A protocol calls `arrived(conn, transport)` from connection_made: its connection waits for
    its first request, and may be closed to make room (by `conn.evict()`) until it calls
    `started(conn)`. It may `wait(conn, transport)` again (an HTTP connection kept alive
    between requests)."""

    def __init__(self, name: str, max_connections: int, *, request_end: bytes, refusal: bytes = b"",
                 admissions_per_turn: int = ADMISSIONS_PER_TURN):
        self.name = name
        self.max_connections = max_connections
        self.request_end = request_end
        self.refusal = refusal  # written to a refused connection before it is closed
        self.admissions_per_turn = admissions_per_turn
        self.open = 0  # accepted and not yet closed (probation aside)
        self.accepted = 0
        # limit: at the cap (or left in probation without a request); descriptors: shed for want
        # of descriptors
        self.refused = {"limit": 0, "descriptors": 0}
        # evicted: closed to make room; deadline: no first request (frame, headers) in time;
        # idle: nothing to do and nothing received for the idle timeout
        self.closed = {"evicted": 0, "deadline": 0, "idle": 0}
        self.accept_errors = {name: 0 for name in ("EMFILE", "ENFILE", "ENOBUFS", "ENOMEM")}
        self.waiting: dict = {}  # connection -> its socket, oldest first
        self._sockets: dict[int, _Accepted] = {}  # by descriptor: what `wait` looks up
        self._probation: dict[socket.socket, float] = {}  # newcomer -> when it came, oldest first
        self._probation_timer: Optional[asyncio.TimerHandle] = None
        self._serving: list = []  # (listening socket, protocol factory)
        self._tasks: set = set()
        self._peek = bytearray(_PEEK_BYTES)
        self._spare: Optional[int] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._log_refused = Throttle()
        self._log_exhausted = Throttle()

    def socket(self, family: int, proto: int = 0) -> socket.socket:
        """A new stream socket for this listener (bind it and listen, then `serve` it)."""
        return socket.socket(family, socket.SOCK_STREAM, proto)

    @property
    def serving(self) -> bool:
        return bool(self._serving)

    def serve(self, sock: socket.socket, protocol_factory) -> None:
        """Accept on the listening `sock` (bound, listening), on the running loop, each
        connection given to a protocol from `protocol_factory`."""
        self._loop = asyncio.get_running_loop()
        if self._spare is None:
            self._spare = _open_spare()
        sock.setblocking(False)
        self._serving.append((sock, protocol_factory))
        self._loop.add_reader(sock.fileno(), self._acceptable, sock, protocol_factory)

    def close(self) -> None:
        """Stop accepting: close the listening sockets, refuse the probation, give the spare
        descriptor back. Connections already handed over are their protocols' to close."""
        for sock, _factory in self._serving:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(sock.fileno())
            sock.close()
        self._serving = []
        for conn in list(self._probation):
            self._unpark(conn)
            conn.close()
        if self._probation_timer is not None:
            self._probation_timer.cancel()
            self._probation_timer = None
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None

    # -- what protocols tell ---------------------------------------------------------------
    def arrived(self, conn, transport) -> None:
        """A new connection's protocol is connected: it waits for its first request."""
        self.wait(conn, transport)

    def wait(self, conn, transport) -> None:
        """The connection waits for a request (it may be closed to make room)."""
        sock = transport.get_extra_info("socket")
        self.waiting.pop(conn, None)  # to the end of the line
        self.waiting[conn] = self._sockets.get(sock.fileno()) if sock is not None else None

    def started(self, conn) -> None:
        """The connection's request came: it is no longer closed to make room."""
        self.waiting.pop(conn, None)

    def _released(self, sock: _Accepted) -> None:
        self.open -= 1
        if self._sockets.get(sock.fileno()) is sock:
            del self._sockets[sock.fileno()]

    # -- accepting -------------------------------------------------------------------------
    def _acceptable(self, sock: socket.socket, factory) -> None:
        """The listening socket is readable: accept what this turn allows. What is left waits
        in the kernel's queue, in order, for the next turn (the socket stays readable).

        At the cap, a turn takes at most half the probation's room: a newcomer parked there has
        two turns at least (the next one reads what it sent) before a later one pushes it out."""
        if self._spare is None:
            self._spare = _open_spare()
        taken = 0
        while taken < (self.admissions_per_turn if self.open < self.max_connections else PROBATION // 2):
            taken += 1
            try:
                conn, _addr = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:
                if e.errno in RESOURCE_ERRNOS:
                    self._exhausted(sock, factory, e)
                    return
                raise
            if self.open < self.max_connections:
                self._admit(conn, factory)
            elif self._has_request(conn):
                if self._make_room():
                    self._admit(conn, factory)
                else:
                    self._refuse(conn, "limit")
            else:
                self._park(conn, factory)

    def _admit(self, conn: socket.socket, factory) -> None:
        conn.setblocking(False)
        out = _Accepted(conn.family, conn.type, conn.proto, fileno=conn.detach())
        out.listener = self
        self._sockets[out.fileno()] = out
        self.open += 1
        self.accepted += 1
        task = self._loop.create_task(self._connect(out, factory))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, sock: _Accepted, factory) -> None:
        try:
            await self._loop.connect_accepted_socket(factory, sock)
        except Exception as e:  # noqa: BLE001 - the peer left first, or the protocol failed
            sock.close()
            if not isinstance(e, OSError):
                log.error("a connection could not be set up", exc_info=e, extra={"listener": self.name})

    def _has_request(self, sock: socket.socket) -> Optional[bool]:
        """Whether a whole first request waits, unread, on `sock` (peeked: it stays there).
        None when the peer is gone."""
        try:
            sock.setblocking(False)
            n = sock.recv_into(self._peek, len(self._peek), socket.MSG_PEEK)
        except BlockingIOError:
            return False
        except OSError:
            return None
        if n == 0:
            return None
        return self._peek.find(self.request_end, 0, n) >= 0

    def _make_room(self) -> bool:
        """Close the connection that has waited longest for a request and has none unread (one
        that sent its request an instant ago, not read yet, is skipped). Its descriptor is
        released now: its transport is told to abort first, which takes the descriptor out of
        the loop's selector at once, and closes the socket (again: a no-op) on the next turn."""
        for conn, sock in itertools.islice(self.waiting.items(), 8):
            if sock is not None and self._has_request(sock):
                continue
            del self.waiting[conn]  # (the loop stops here: the dict changed)
            self.closed["evicted"] += 1
            conn.evict()
            if sock is not None:
                sock.close()
            return True
        return False

    # -- probation: newcomers at the cap, until their first request comes -------------------
    def _park(self, conn: socket.socket, factory) -> None:
        if len(self._probation) >= PROBATION:
            oldest = next(iter(self._probation))
            self._unpark(oldest)
            self._refuse(oldest, "limit")
        self._probation[conn] = time.monotonic()
        self._loop.add_reader(conn.fileno(), self._spoke, conn, factory)
        if self._probation_timer is None:
            self._probation_timer = self._loop.call_later(PROBATION_S, self._expire_probation)

    def _unpark(self, conn: socket.socket) -> None:
        del self._probation[conn]
        self._loop.remove_reader(conn.fileno())

    def _spoke(self, conn: socket.socket, factory) -> None:
        """A newcomer in probation sent something: let it in once its first request is whole
        (a request that does not come whole at once is refused: a client sends it at once)."""
        has = self._has_request(conn)
        self._unpark(conn)
        if has is None:
            conn.close()  # gone
        elif has and (self.open < self.max_connections or self._make_room()):
            self._admit(conn, factory)
        else:
            self._refuse(conn, "limit")

    def _expire_probation(self) -> None:
        self._probation_timer = None
        deadline = time.monotonic() - PROBATION_S
        for conn, since in list(self._probation.items()):
            if since > deadline:
                self._probation_timer = self._loop.call_later(since - deadline, self._expire_probation)
                return
            self._unpark(conn)
            self._refuse(conn, "limit")

    def _refuse(self, conn: socket.socket, why: str) -> None:
        self.refused[why] += 1
        try:
            conn.setblocking(False)
            if self.refusal:
                conn.send(self.refusal)
            # Whatever the peer sent already is read first: a TCP socket closed with unread
            # bytes sends a reset, which may destroy the refusal before the peer reads it.
            conn.shutdown(socket.SHUT_WR)
            conn.recv(65536)
        except OSError:
            pass
        finally:
            conn.close()
        if why == "limit":
            n = self._log_refused.due()
            if n:
                log.warning(
                    "connections refused: the listener is at its limit",
                    extra={"listener": self.name, "limit": self.max_connections, "refused": n},
                )

    def _exhausted(self, sock: socket.socket, factory, exc: OSError) -> None:
        """accept() failed for want of descriptors (or kernel memory): count it, shed what waits
        with the spare descriptor, log at most once a second; pause for a second if nothing could
        be shed."""
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        self.accept_errors[name] = self.accept_errors.get(name, 0) + 1
        shed = 0
        if self._spare is not None and exc.errno in (errno.EMFILE, errno.ENFILE):
            os.close(self._spare)
            self._spare = None
            try:
                for _ in range(_SHED_PER_TURN):
                    try:
                        conn, _addr = sock.accept()
                    except OSError:
                        break
                    self._refuse(conn, "descriptors")
                    shed += 1
            finally:
                self._spare = _open_spare()
        n = self._log_exhausted.due()
        if n:
            log.error(
                "cannot accept connections: %s", exc.strerror or name,
                extra={"listener": self.name, "error": name, "times": n, "shed": shed,
                       "open_fds": open_fds(), "fd_limit": fd_limit()},
            )
        if not shed:
            # Nothing could be done now: the socket would stay readable and the loop spin.
            self._loop.remove_reader(sock.fileno())
            self._loop.call_later(_ACCEPT_PAUSE_S, self._resume, sock, factory)

    def _resume(self, sock: socket.socket, factory) -> None:
        if (sock, factory) in self._serving:
            self._loop.add_reader(sock.fileno(), self._acceptable, sock, factory)


def _open_spare() -> Optional[int]:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def sweep_interval(*timeouts_s: float) -> float:
    """How often a sweep looks at its connections: a quarter of the shortest timeout, within
    50 ms and 1 s."""
    return min(1.0, max(0.05, min(timeouts_s) / 4))


class HttpEndpoint:
    """One uvicorn server for `app` on `host:port`, run as a task on the current event loop."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 0, name: str = "http"):
        self.app = app
        self.host = host
        self.port = port
        self.name = name
        self._server = None
        self._task: Optional[asyncio.Task] = None

    async def start(self) -> int:
        """Listen, and return the bound port. A busy address raises OSError(EADDRINUSE)."""
        import socket

        import uvicorn

        # Bind here, not inside uvicorn: a busy port is then an OSError the caller turns into
        # one error line, instead of uvicorn's log line and SystemExit.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
        # without it a response written in two parts waits out the peer's delayed ACK (40 ms).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_config=None,  # the recorder's logging configuration stays in charge
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        # The recorder owns SIGTERM and SIGINT (a graceful stop of everything, in order): uvicorn
        # must not take them over while it serves, nor raise them again when it stops.
        self._server.capture_signals = contextlib.nullcontext
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                exc = self._task.exception() if not self._task.cancelled() else None
                raise exc or OSError(errno.EADDRINUSE, f"{self.name} endpoint did not start")
            await asyncio.sleep(0.005)
        return self.port

    async def close(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=5)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - shutting down regardless
            self._task.cancel()
        self._server = None
        self._task = None
