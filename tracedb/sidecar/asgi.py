"""Run an ASGI application (Starlette) on uvicorn inside an event loop that is already running,
and the limits every listener keeps.

`tracedb serve` hosts its HTTP endpoints (metrics and health, the web UI, the OTLP receiver) on the
sidecar's own event loop, next to the socket listener: one process, one loop, no threads. uvicorn's
`Server.serve()` is a coroutine, so each endpoint is a task on that loop; `HttpEndpoint` starts it,
reports the bound port (0 picks a free one) and shuts it down with the recorder.

`HostCheck` is the Host rule every one of these listeners applies (docs/security.md): a loopback
listener answers only to loopback names, so that a web page whose name was rebound to 127.0.0.1
reads nothing.

Every listening socket of the recorder (the wire protocol's Unix socket and TCP port, the OTLP
port, the HTTP port) and of `tracedb ui` accepts through a `Listener`, which runs its own accept
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

`descriptor_budget` derives the caps from RLIMIT_NOFILE so that the many-connection listeners
can never take the descriptors the recorder's own files and its Unix socket need.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import ipaddress
import itertools
import logging
import os
import re
import resource
import socket
import time
from typing import TYPE_CHECKING, Iterable, Optional

from tracedb.errors import ConfigError
from tracedb.imports import on_first_use
from tracedb.sidecar.protocol import DEFAULT_HTTP_HEADER_TIMEOUT_S, DEFAULT_HTTP_IDLE_TIMEOUT_S, DEFAULT_HTTP_MAX_CONNECTIONS

if TYPE_CHECKING:
    import h11
    import uvicorn
    from uvicorn.protocols.http import h11_impl
else:
    # Lazy seam (`tracedb.imports`): uvicorn and h11 load with the first HTTP listener, not with
    # every recorder and command line that reads this module's rules.
    h11 = on_first_use("h11")
    uvicorn = on_first_use("uvicorn")
    h11_impl = on_first_use("uvicorn.protocols.http.h11_impl")

log = logging.getLogger("tracedb.listen")

# The names a loopback listener answers to without being told more (with or without the port).
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")
# Set in the ASGI scope by a token check that let the request through with the token; a route
# open without it (/health) reads it to decide how much to say.
AUTHENTICATED = "tracedb.authenticated"

# Descriptors kept for everything but client connections: the WAL (segments, spares, the lock,
# directory fsyncs), the database and its connection pools (SQLite's three files per
# connection, or PostgreSQL sockets), the web view's reader, the compactor's pipes, the event
# loop's own. `tracedb serve` with every listener open holds about 26 at start.
RESERVED_FDS = 128
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

# A request line and its headers, before their end (h11's limit: past it, a 400). A listener at
# its cap looks for a newcomer's first request in as many of its first bytes.
HTTP_MAX_HEADER_BYTES = 16 << 10

_HTTP_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: 21\r\n\r\ntoo many connections\n"
)


def is_loopback(host: str) -> bool:
    """Whether a listening address stays on this machine (localhost, 127.0.0.0/8, ::1): the one
    rule the socket's TCP listener, the web view and the OTLP receiver apply before listening."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> Optional[str]:
    """The name a Host header gives, lowercased and without its port ("[::1]" for "[::1]:8470",
    "localhost" for "LocalHost:80"); None for one that is not a Host value."""
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        if end < 0:
            return None
        name, rest = h[: end + 1], h[end + 1 :]
    else:
        name, sep, port = h.partition(":")
        rest = sep + port
    if rest and not (rest[0] == ":" and rest[1:].isdigit()):
        return None
    return name or None


def normalize_host(name: str) -> str:
    """An operator's --allowed-host as a Host header names it: lowercased, no port, an IPv6
    address in brackets."""
    text = name.strip().lower()
    try:
        if ipaddress.ip_address(text.strip("[]")).version == 6:
            return f"[{text.strip('[]')}]"
    except ValueError:
        pass
    got = host_name(text)
    if got is None or not _HOST_NAME.fullmatch(got):
        raise ValueError(f"{name!r} is not a host name")
    return got


def allowed_hosts(listen_host: str, extra: Iterable[str] = ()) -> Optional[frozenset]:
    """The Host names a listener on `listen_host` answers to; None for any.

    Loopback: the loopback names and `extra`. Anything else (--allow-remote, where every request
    carries the token): any name, unless `extra` names some, then those, the address itself and
    the loopback names. A rebinding page cannot send the token, and the token's cookie belongs
    to the name the owner opened, so there the token is the guard."""
    added = {normalize_host(h) for h in extra}
    if is_loopback(listen_host):
        return frozenset(LOOPBACK_NAMES) | added
    if not added:
        return None
    return frozenset(LOOPBACK_NAMES) | added | {normalize_host(listen_host)}


class HostCheck:
    """ASGI middleware: a request whose Host header names no allowed host gets 403 and a body
    that says why, before any route sees it."""

    def __init__(self, app, allowed: Iterable[str], *, flag: str = "--allowed-host"):
        self.app = app
        self.allowed = frozenset(allowed)
        self.flag = flag

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":  # no listener here serves websockets: routing refuses them
            return await self.app(scope, receive, send)
        given = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"]
        if len(given) == 1 and host_name(given[0]) in self.allowed:
            return await self.app(scope, receive, send)
        shown = repr(given[0][:100]) if len(given) == 1 else ("missing" if not given else "given twice")
        names = ", ".join(sorted(self.allowed))
        body = (
            f"403 Forbidden: the Host header ({shown}) is not a name this server answers to "
            f"({names}); a page that rebinds its own name to this address reads nothing here. "
            f"Open it by one of those names, or add the name with {self.flag} NAME.\n"
        ).encode()
        await send({
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store")],
        })
        await send({"type": "http.response.body", "body": body})


def bearer_token(headers) -> Optional[str]:
    """The token of an `Authorization: Bearer TOKEN` header (the scheme in any case), or None."""
    auth = headers.get("authorization", "")
    scheme, _, token = auth.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


# -- descriptors ---------------------------------------------------------------------------------


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (systemd leaves services at 1024);
    returns (the soft limit before, the soft limit now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:  # Linux refuses an unlimited RLIMIT_NOFILE: its ceiling is fs.nr_open
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            return soft, soft
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            return soft, soft
        return soft, target
    return soft, soft


def fd_limit() -> int:
    """The soft RLIMIT_NOFILE: how many descriptors this process may hold."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_fds() -> int:
    """How many descriptors this process holds now (-1 where /proc is not there)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # listdir's own
    except OSError:
        return -1


def descriptor_budget(limit: int, reserved: dict[str, int], wanted: dict[str, int]) -> dict[str, int]:
    """The connection caps that fit in `limit` descriptors: RESERVED_FDS for the process's own
    files, then the `reserved` listeners (the Unix socket the agents use) in full, then the
    `wanted` listeners (TCP, OTLP, HTTP), lowered in proportion when they do not all fit.
    Raises ConfigError when not even the reserve fits."""
    caps = dict(reserved)
    room = limit - RESERVED_FDS - sum(c + LISTENER_OVERHEAD_FDS for c in reserved.values())
    need = sum(c + LISTENER_OVERHEAD_FDS for c in wanted.values())
    if room < len(wanted) * (LISTENER_OVERHEAD_FDS + 1):
        raise ConfigError(
            f"the limit of {limit} open files is too low to keep {RESERVED_FDS} for the recorder's "
            f"own files and {sum(reserved.values())} connections for its socket",
            hint="raise the limit (systemd: LimitNOFILE=; a shell: ulimit -n) or lower max_connections",
        )
    if need <= room:
        caps.update(wanted)
        return caps
    share = room - len(wanted) * LISTENER_OVERHEAD_FDS
    total = sum(wanted.values())
    for name, cap in wanted.items():
        caps[name] = max(1, share * cap // total)
    return caps


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


class _ThrottleFilter(logging.Filter):
    """uvicorn logs a warning for each bad request ("Invalid HTTP request received.", an
    unsupported upgrade): a peer sending garbage in a loop would fill the log. Each message passes
    at most once a second, saying how many like it it stands for."""

    def __init__(self) -> None:
        super().__init__()
        self._throttles: dict[tuple, Throttle] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        throttle = self._throttles.get(key)
        if throttle is None:
            if len(self._throttles) > 1000:  # messages are fixed formats; this is never reached
                self._throttles.clear()
            throttle = self._throttles[key] = Throttle()
        n = throttle.due()
        if not n:
            return False
        if n > 1:
            record.msg, record.args = "%s (%d like it since the last)", (record.getMessage(), n - 1)
        return True


def _throttle_uvicorn_logs() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _ThrottleFilter) for f in logger.filters):
        logger.addFilter(_ThrottleFilter())


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
        # newcomer -> (when it came, its protocol factory), oldest first
        self._probation: dict[socket.socket, tuple[float, object]] = {}
        self._probation_timer: Optional[asyncio.TimerHandle] = None
        self._serving: list = []  # (listening socket, protocol factory)
        self._tasks: set = set()
        self._peek = bytearray(HTTP_MAX_HEADER_BYTES)
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
            self._leave_probation(oldest)
        self._probation[conn] = (time.monotonic(), factory)
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

    def _leave_probation(self, conn: socket.socket) -> None:
        """Out of probation, pushed by newcomers or its time up: let in a newcomer whose whole
        request waits unread (its reader's turn has not come yet: under a flood the loop's turns
        are long) when room can be made; refuse it otherwise."""
        factory = self._probation[conn][1]
        self._unpark(conn)
        has = self._has_request(conn)
        if has is None:
            conn.close()  # gone
        elif has and self._make_room():
            self._admit(conn, factory)
        else:
            self._refuse(conn, "limit")

    def _expire_probation(self) -> None:
        self._probation_timer = None
        deadline = time.monotonic() - PROBATION_S
        for conn, (since, _factory) in list(self._probation.items()):
            if since > deadline:
                self._probation_timer = self._loop.call_later(since - deadline, self._expire_probation)
                return
            self._leave_probation(conn)

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


# -- HTTP ----------------------------------------------------------------------------------------

_H11 = None


def _h11_protocol():
    """uvicorn's h11 protocol with what it lacks: a deadline for request headers, a body that
    stops arriving, and a place in its listener's `waiting` while it waits for a request."""
    global _H11
    if _H11 is not None:
        return _H11
    idle, send_body, done = h11.IDLE, h11.SEND_BODY, (h11.DONE, h11.MUST_CLOSE, h11.CLOSED)

    class LimitedH11(h11_impl.H11Protocol):
        listener: Listener  # set per endpoint (a subclass each)

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            now = time.monotonic()
            self.deadline: Optional[float] = now + self.header_timeout_s  # for the first request's headers
            self.draining_body = False
            self.active = False
            self.quiet_since = now
            self.listener.arrived(self, transport)

        def connection_lost(self, exc) -> None:
            self.listener.started(self)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            self.active = True
            if self.deadline is None and self.conn.their_state is idle:
                # The first bytes of the next request on a kept-alive connection (uvicorn stops
                # its keep-alive timer here): its headers have the same time to arrive.
                self.deadline = time.monotonic() + self.header_timeout_s
            super().data_received(data)
            if self.deadline is None:
                return
            state = self.conn.their_state
            if self.draining_body:
                if state is send_body:
                    return
                self.draining_body = False
                if state is idle:
                    # The unwanted body is in, and each of its bytes stopped uvicorn's
                    # keep-alive timer: the next request's headers get the deadline instead.
                    self.deadline = time.monotonic() + self.header_timeout_s
                    return
            if state is not idle:
                self.deadline = None  # the request's headers are in
                self.listener.started(self)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing():
                return
            state = self.conn.their_state
            if state is send_body:
                # Answered before the whole body came (413, 429, a route that reads none): the
                # peer has the header deadline to finish it, as h11 cannot start the next cycle.
                self.deadline = time.monotonic() + self.header_timeout_s
                self.draining_body = True
                self.listener.wait(self, self.transport)
            elif state is idle and self.deadline is None and not self.transport.get_write_buffer_size():
                # Kept alive, its answer written: it may be closed to make room for a newcomer.
                self.listener.wait(self, self.transport)

        def evict(self) -> None:
            self.transport.abort()

        def sweep(self, now: float, idle_timeout_s: float) -> Optional[str]:
            """Why this connection should be closed now, if it should."""
            if self.deadline is not None:
                return "deadline" if now >= self.deadline else None
            if self.active or self.flow.read_paused:
                self.active = False
                self.quiet_since = now
                return None
            if (
                self.conn.their_state is send_body
                and self.conn.our_state not in done
                and now - self.quiet_since >= idle_timeout_s
            ):
                return "idle"  # a request body that stopped arriving
            return None

    _H11 = LimitedH11
    return _H11


class HttpEndpoint:
    """One uvicorn server for `app` on `host:port`, run as a task on the current event loop.

    Its limits: `max_connections` (held by its Listener), request headers within
    `header_timeout_s` of the connection (or of the next request's first byte), a kept-alive
    connection closed after `idle_timeout_s` without a request (uvicorn's `timeout_keep_alive`),
    as is a request whose body stops arriving for as long."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 0, name: str = "http",
                 max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS,
                 header_timeout_s: float = DEFAULT_HTTP_HEADER_TIMEOUT_S,
                 idle_timeout_s: float = DEFAULT_HTTP_IDLE_TIMEOUT_S):
        self.app = app
        self.host = host
        self.port = port
        self.name = name
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.listener = Listener(name, max_connections, request_end=b"\r\n\r\n", refusal=_HTTP_REFUSAL)
        self._server = None
        self._task: Optional[asyncio.Task] = None
        self._sweeper: Optional[asyncio.Task] = None

    async def start(self) -> int:
        """Listen, and return the bound port. A busy address raises OSError(EADDRINUSE)."""
        # Bind here, not inside uvicorn: a busy port is then an OSError the caller turns into
        # one error line, instead of uvicorn's log line and SystemExit.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
        # without it a response written in two parts waits out the peer's delayed ACK (40 ms).
        sock = self.listener.socket(family, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(1024)
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        protocol = type("LimitedH11", (_h11_protocol(),),
                        {"listener": self.listener, "header_timeout_s": self.header_timeout_s})
        config = uvicorn.Config(
            self.app,
            log_config=None,  # the recorder's logging configuration stays in charge
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
            http=protocol,
            ws="none",
            timeout_keep_alive=self.idle_timeout_s,
            h11_max_incomplete_event_size=HTTP_MAX_HEADER_BYTES,
            # The listener holds the connections to their cap; this bounds the requests running
            # (a 503 past it). uvicorn counts a connection closed to make room until its
            # transport reports it lost, on the next turn: up to as many again.
            limit_concurrency=2 * self.listener.max_connections + LISTENER_OVERHEAD_FDS,
        )
        _throttle_uvicorn_logs()
        self._server = server = uvicorn.Server(config)
        # The recorder owns SIGTERM and SIGINT (a graceful stop of everything, in order): uvicorn
        # must not take them over while it serves, nor raise them again when it stops.
        server.capture_signals = contextlib.nullcontext
        loop = asyncio.get_running_loop()
        # No socket for uvicorn to serve: the Listener accepts, and makes each connection's
        # protocol as uvicorn's own server does (its state shared, no lifespan state).
        self._task = loop.create_task(server.serve(sockets=[]))
        while not server.started:
            if self._task.done():
                sock.close()
                exc = self._task.exception() if not self._task.cancelled() else None
                raise exc or OSError(errno.EADDRINUSE, f"{self.name} endpoint did not start")
            await asyncio.sleep(0.005)
        self.listener.serve(sock, functools.partial(
            config.http_protocol_class, config=config, server_state=server.server_state, app_state={}))
        self._sweeper = loop.create_task(self._sweep())
        return self.port

    async def _sweep(self) -> None:
        """Close the connections past their header deadline or idle too long, once every
        `sweep_interval`: no timer per request."""
        listener = self.listener
        interval = sweep_interval(self.header_timeout_s, self.idle_timeout_s)
        while self._server is not None:
            await asyncio.sleep(interval)
            server = self._server
            if server is None:
                return
            now = time.monotonic()
            for conn in list(server.server_state.connections):
                sweep = getattr(conn, "sweep", None)
                if sweep is None or conn.transport is None or conn.transport.is_closing():
                    continue
                why = sweep(now, self.idle_timeout_s)
                if why is not None:
                    listener.closed[why] += 1
                    listener.started(conn)
                    conn.transport.close()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is None or self._task is None:
            return
        self.listener.close()  # no new connections; uvicorn closes the others
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=5)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - shutting down regardless
            self._task.cancel()
        self._server = None
        self._task = None
