"""`tracedb serve`: the sidecar recorder, an asyncio server speaking docs/protocol.md.

Shape of the hot path: one `data_received` call hands over everything the socket had; the frames in
it are parsed and staged synchronously, in order (the backend assigns seqs and frames WAL records
without awaiting), then the backend commits them to the WAL as one batch. When the batch's future
resolves (after fdatasync), every response of the batch is written with one `transport.write`.
No task, coroutine or callback is created per event, which is what makes the per-event CPU cost
small enough for a single Python thread to acknowledge ~100k events/s.

Backpressure: a connection stops being read while it has too many requests (or bytes) in flight,
or while its peer does not read its responses; a slow client therefore holds a bounded amount of
memory and slows nobody else down.

Limits: each listener (the socket, the TCP port) holds its connections to `max_connections` at
accept time (tracedb.sidecar.asgi.Listener). One sweep over the connections every fraction of a second
closes those that sent no whole frame within `first_frame_timeout_s` and those with nothing in
flight that sent nothing for `connection_idle_timeout_s`: the hot path only sets a flag per read.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import logging
import os
import re
import signal
import socket
import stat
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import orjson

import wal

from tracedb.sidecar.asgi import ADMISSIONS_PER_TURN, Listener, is_loopback, sweep_interval
from tracedb.errors import ServerConfigError, TraceDBError  # ServerConfigError: re-exported (its old home)
from tracedb.records.validation import set_decoded
from tracedb.sidecar import protocol as P
from tracedb.sidecar.backend import IN_BATCH, Backend, Deferred, Staged

log = logging.getLogger("tracedb.sidecar")

_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError
_NL = orjson.OPT_APPEND_NEWLINE
_TOO_LARGE = P.FrameSplitter.TOO_LARGE
# The request line of an HTTP request ("POST / HTTP/1.1"): never a frame of this protocol.
_HTTP_REQUEST = re.compile(rb"[A-Z]+ \S+ HTTP/\d")
# The operations that change an execution by a line of text: the field that holds it, and the
# backend's call that stages the change.
_CHANGES = {
    "invalidate": ("reason", "stage_invalidate"),
    "abandon": ("reason", "stage_abandon"),
    "recording_failure": ("detail", "stage_recording_failure"),
}


@dataclass
class ServerConfig:
    """Where the server listens and its limits (defaults in docs/protocol.md)."""

    socket_path: Optional[str] = None
    tcp_host: Optional[str] = None
    tcp_port: Optional[int] = None
    allow_remote: bool = False
    token: Optional[str] = None
    # The file the token was read from (what the logs name, never the token); None: TRACEDB_TOKEN.
    token_file: Optional[str] = None
    # A loopback listener takes no token: every local user may record (docs/security.md).
    trust_local_users: bool = False
    metrics_port: Optional[int] = None
    max_frame_bytes: int = P.DEFAULT_MAX_FRAME_BYTES
    max_connections: int = P.DEFAULT_MAX_CONNECTIONS
    # The TCP listener's cap: max_connections unless the descriptor budget lowers it.
    tcp_max_connections: Optional[int] = None
    max_inflight_requests: int = P.DEFAULT_MAX_INFLIGHT_REQUESTS
    max_inflight_bytes: int = P.DEFAULT_MAX_INFLIGHT_BYTES
    first_frame_timeout_s: float = P.DEFAULT_FIRST_FRAME_TIMEOUT_S
    connection_idle_timeout_s: float = P.DEFAULT_CONNECTION_IDLE_TIMEOUT_S
    # The HTTP listeners of `tracedb serve` (--http-port, --otlp-port): tracedb.sidecar.asgi.HttpEndpoint.
    http_max_connections: int = P.DEFAULT_HTTP_MAX_CONNECTIONS
    otlp_max_connections: int = P.DEFAULT_OTLP_MAX_CONNECTIONS
    http_header_timeout_s: float = P.DEFAULT_HTTP_HEADER_TIMEOUT_S
    http_idle_timeout_s: float = P.DEFAULT_HTTP_IDLE_TIMEOUT_S
    drain_timeout_s: float = 10.0
    # Set by the CLI: shown by `hello` and /health.
    data_dir: Optional[str] = None
    extra: dict = field(default_factory=dict)


def check_config(config: ServerConfig, *, local_token: bool = False) -> None:
    """Refuse unsafe or impossible listening setups before anything is opened. `local_token`:
    the data directory's token is made for the loopback listeners once the checks pass."""
    if config.socket_path is None and config.tcp_port is None:
        raise ServerConfigError("nothing to listen on", hint="give --socket or --tcp")
    if not 1 <= config.max_frame_bytes <= P.MAX_FRAME_BYTES_LIMIT:
        raise ServerConfigError(
            f"max frame size must be between 1 and {P.MAX_FRAME_BYTES_LIMIT} bytes",
            hint="the WAL takes records up to 64 MiB",
        )
    if config.tcp_port is not None:
        host = config.tcp_host or "127.0.0.1"
        if is_loopback(host):
            if not (config.token or local_token or config.trust_local_users):
                raise ServerConfigError(
                    f"the TCP listener on {host} needs a bearer token: other local users could "
                    "record through it",
                    hint="tracedb serve makes one in the data directory (token); give one with "
                    "--token-file or TRACEDB_TOKEN, or pass --trust-local-users",
                )
        else:
            if not config.allow_remote:
                raise ServerConfigError(
                    f"refusing to listen on non-loopback address {host}",
                    hint="pass --allow-remote together with a token (TRACEDB_TOKEN or --token-file)",
                )
            if not config.token:
                raise ServerConfigError(
                    f"listening on {host} needs a bearer token",
                    hint="set TRACEDB_TOKEN or pass --token-file",
                )
    for name in ("max_connections", "tcp_max_connections", "http_max_connections", "otlp_max_connections"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ServerConfigError(f"{name} must be at least 1, got {value}")
    for name in ("first_frame_timeout_s", "connection_idle_timeout_s", "http_header_timeout_s",
                 "http_idle_timeout_s"):
        if not getattr(config, name) > 0:
            raise ServerConfigError(f"{name} must be more than 0 seconds, got {getattr(config, name)}")
    if config.socket_path is not None and len(os.fsencode(config.socket_path)) > 100:
        raise ServerConfigError(
            f"socket path is too long for a Unix socket: {config.socket_path}",
            hint="choose a shorter --socket path",
        )


class Counters:
    """Plain integer counters of the hot path; the metrics collector reads them at scrape time.

    (A prometheus_client Counter takes a lock per increment: too dear per event.)
    """

    __slots__ = (
        "events_acked",
        "requests",
        "errors",
        "connections_total",
        "connections_refused",
        "bytes_in",
        "bytes_out",
        "batches",
    )

    def __init__(self) -> None:
        self.events_acked = 0
        self.requests: dict[str, int] = {op: 0 for op in P.OPS}
        self.errors: dict[str, int] = {code: 0 for code in P.ERROR_CODES}
        self.connections_total = 0
        self.connections_refused = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.batches = 0


class Connection(asyncio.Protocol):
    """One client connection: framing, staging, batched responses, backpressure."""

    def __init__(self, server: "SidecarServer", *, needs_token: bool, peer: str):
        self.server = server
        self.backend = server.backend
        self.counters = server.counters
        self.needs_token = needs_token
        self.authenticated = not needs_token
        self.peer = peer
        self.listener: Optional[Listener] = server.listeners.get(peer)
        # Read by the server's sweep: set on every read, cleared by the sweep; the time the
        # connection was opened, and since when the sweep has seen it with nothing to do.
        self.active = False
        self.awaiting_first = False  # no whole frame yet: may be closed to make room
        self.opened_at = self.quiet_since = 0.0
        self.transport: Optional[asyncio.Transport] = None
        self.splitter = P.FrameSplitter(server.config.max_frame_bytes)
        self.inflight = 0
        self.inflight_bytes = 0
        self.max_inflight = server.config.max_inflight_requests
        self.max_inflight_bytes = server.config.max_inflight_bytes
        self.read_paused = False
        self.write_paused = False
        self.closing = False  # no more requests are staged (shutdown, bad token, peer gone)
        self.eof = False  # the peer has sent everything it will send
        self.lost = False
        self.tasks: set[asyncio.Task] = set()
        # A get builds a whole record in memory: a few at a time per connection, so that a
        # client pipelining gets of a large trace cannot hold max_inflight copies of it.
        self.gets = asyncio.Semaphore(MAX_CONCURRENT_GETS)
        # Gets waiting for their turn; past MAX_QUEUED_GETS the connection's later frames are
        # held (and reading paused) until they drain: pipelined gets cannot pile up unread.
        self.gets_queued = 0
        self.held = False
        # Clear while the peer leaves its responses unread (the transport's buffer is over its
        # high-water mark): a get builds its record only once the peer has read what came before.
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.deferred: Optional[asyncio.Task] = None  # a Deferred request holding back the rest
        self.backlog: list = []  # frames read while `deferred` runs
        loop = asyncio.get_running_loop()
        self.settled = loop.create_future()  # every staged request answered, transport closing
        self.gone = loop.create_future()  # the transport is closed (responses flushed)

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        """Accept the connection, or answer `unavailable` while draining and close. (Past the
        listener's cap, the listener answered `overloaded` and closed it before it came here.)"""
        self.transport = transport
        srv = self.server
        self.counters.connections_total += 1
        if srv.draining:
            self.counters.connections_refused += 1
            self.counters.errors[P.UNAVAILABLE] += 1
            transport.write(P.encode_error(None, P.UNAVAILABLE, "the server is shutting down"))
            transport.close()
            self.lost = True
            self._mark_settled()
            self.gone.set_result(None)
            return
        srv.connections.add(self)
        self.opened_at = self.quiet_since = time.monotonic()
        if self.listener is not None:
            self.awaiting_first = True
            self.listener.arrived(self, transport)
        log.debug("connection opened", extra={"peer": self.peer})

    def connection_lost(self, exc) -> None:
        """The peer is gone; what it had sent is still recorded (its answers are dropped)."""
        self.lost = True
        self.closing = True
        self.server.connections.discard(self)
        if self.awaiting_first:
            self.awaiting_first = False
            self.listener.started(self)
        if not self.gone.done():
            self.gone.set_result(None)
        # Requests already staged stay staged: they become durable and are recorded, but their
        # responses have nowhere to go. A client that reconnects and resends gets the originals.
        self.can_write.set()  # release waiting gets: they find the connection lost
        self._maybe_settled()
        if exc is not None:
            log.debug("connection lost", extra={"peer": self.peer, "error": str(exc)})

    def pause_writing(self) -> None:
        """The peer does not read its responses: stop reading its requests until it does."""
        self.write_paused = True
        self.can_write.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        """The peer caught up with its responses: read again (unless too much is in flight)."""
        self.write_paused = False
        self.can_write.set()
        self._update_reading()

    def eof_received(self):
        """Half-close: the client sent everything; answer all of it, then close."""
        self.eof = True
        self._maybe_settled()
        return True  # keep the transport open for the responses

    def data_received(self, data: bytes) -> None:
        """Cut the bytes into frames and process them (or queue them behind a Deferred)."""
        self.counters.bytes_in += len(data)
        self.active = True
        frames = self.splitter.feed(data)
        if frames:
            if self.awaiting_first:
                self.awaiting_first = False
                self.listener.started(self)
            if self.deferred is not None or self.held:
                # A request of this connection is still being resolved: keep the order.
                self.backlog.extend(frames)
                self._update_reading()
            else:
                self.process(frames)

    # -- the hot path ----------------------------------------------------------------------
    def process(self, frames: list, carry: Optional[tuple] = None) -> None:
        """Parse, validate and stage the frames of one read; commit them as one WAL batch.

        Errors are answered at once; staged writes when their batch is durable. `carry` is the
        (rid, Staged or exception) of a Deferred that held these frames back.
        """
        t0 = time.perf_counter()
        backend = self.backend
        counters = self.counters
        req_counts = counters.requests
        immediate: list[bytes] = []
        entries: list = []  # (rid, Staged) waiting for durability
        nbytes = 0
        closing = self.closing
        if carry is not None:
            self._carry(carry, immediate, entries)
        i = 0
        n = len(frames)
        while i < n:
            frame = frames[i]
            i += 1
            rid = None
            try:
                if frame is _TOO_LARGE:
                    raise P.ProtocolError(
                        P.FRAME_TOO_LARGE,
                        f"frame exceeds the limit of {self.splitter.max_frame_bytes} bytes; "
                        "it was discarded up to its newline",
                    )
                try:
                    req = _loads(frame)
                except _JSONDecodeError as e:
                    if self.peer == "tcp" and _HTTP_REQUEST.match(frame):
                        # A browser's request: any web page may send one to a loopback port, and
                        # the lines of its body would read as requests. None of it is read.
                        self.closing = closing = True
                        self.authenticated = False
                        if self.transport is not None:
                            self.transport.pause_reading()
                        break
                    raise P.ProtocolError(P.BAD_JSON, f"frame is not valid UTF-8 JSON: {e}") from None
                if type(req) is not dict:
                    raise P.ProtocolError(P.BAD_REQUEST, "a request is a JSON object")
                rid = req.get("id")
                if rid is not None and type(rid) is not int:
                    if type(rid) is not str or len(rid) > P.MAX_ID_CHARS:
                        rid = None  # an id that cannot be echoed: answer with null
                        P.check_id(req)
                P.check_integers(frame)
                if closing:
                    if not self.authenticated:
                        break  # closing for a bad token: read no further
                    raise P.ProtocolError(P.UNAVAILABLE, "the server is shutting down; retry later")
                op = req.get("op")
                if op == "event":
                    req_counts["event"] += 1
                    if not self.authenticated:
                        raise self._unauthorized()
                    eid = req.get("execution_id")
                    typ = req.get("type")
                    seq = req.get("seq")
                    if (
                        type(eid) is not str
                        or type(typ) is not str
                        or "payload" not in req
                        or (seq is not None and (type(seq) is not int or seq < 1))
                    ):
                        self._explain_event(req)
                    payload = req["payload"]
                    set_decoded(payload)  # checked and redacted as decoded, not decoded again
                    try:
                        staged = backend.stage_event(eid, typ, payload, seq)
                    finally:
                        set_decoded(None)
                else:
                    staged = self._other(op, req)
                    if staged is None:  # answered by a task (get)
                        if self.gets_queued >= MAX_QUEUED_GETS and i < n:
                            self.held = True  # the rest waits until the gets drain
                            self.backlog = frames[i:] + self.backlog
                            self._update_reading()
                            break
                        continue
                if type(staged) is int:  # the fast path: staged in the batch, this is its seq
                    entries.append((rid, staged))
                    nbytes += len(frame)
                    continue
                if type(staged) is Deferred:
                    # Stage nothing more from this connection until it is resolved.
                    self._defer(rid, staged, frames[i:])
                    break
                if staged.durable is None:
                    immediate.append(_ok(rid, staged.fields))
                else:
                    entries.append((rid, staged))
                    nbytes += len(frame)
            except P.ProtocolError as e:
                counters.errors[e.code] += 1
                immediate.append(P.encode_error(rid, e.code, e.message))
                if e.code == P.UNAUTHORIZED and self.needs_token and not self.authenticated:
                    self.closing = closing = True
            except Exception as e:  # noqa: BLE001 - a bad request never takes the connection down
                code, message = _error_of(e)
                counters.errors[code] += 1
                immediate.append(P.encode_error(rid, code, message))
        committed = None
        try:
            committed = backend.commit()
        except Exception as e:  # noqa: BLE001 - the WAL refused the batch: fail its requests
            committed = asyncio.get_running_loop().create_future()
            committed.set_exception(e)
        if entries:
            # Futures resolve in commit order: the last one of the batch covers all the others.
            last = committed
            if last is None:
                last = entries[-1][1].durable
                if last is IN_BATCH or type(last) is int:  # pragma: no cover - a backend bug
                    raise RuntimeError("a write was staged in the batch but commit() returned nothing")
            self.inflight += len(entries)
            self.inflight_bytes += nbytes
            last.add_done_callback(
                lambda _f, entries=entries, committed=committed, nbytes=nbytes, t0=t0: self._settle(
                    entries, committed, nbytes, t0
                )
            )
            if self.inflight >= self.max_inflight or self.inflight_bytes >= self.max_inflight_bytes:
                self._update_reading()
        if immediate:
            self._write(b"".join(immediate))
        if self.closing or self.eof:
            self._maybe_settled()

    def _carry(self, carry: tuple, immediate: list, entries: list) -> None:
        rid, result = carry
        if isinstance(result, BaseException):
            code, message = _error_of(result)
            self.counters.errors[code] = self.counters.errors.get(code, 0) + 1
            immediate.append(P.encode_error(rid, code, message))
        elif type(result) is int:
            entries.append((rid, result))
        elif result.durable is None:
            immediate.append(_ok(rid, result.fields))
        else:
            entries.append((rid, result))

    def _defer(self, rid: Any, deferred: Deferred, rest: list) -> None:
        self.backlog = list(rest)
        self.inflight += 1
        task = asyncio.get_running_loop().create_task(self._resolve(rid, deferred.awaitable))
        self.deferred = task
        self.tasks.add(task)
        task.add_done_callback(self._deferred_done)

    def _deferred_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self._maybe_settled()

    async def _resolve(self, rid: Any, awaitable) -> None:
        try:
            result = await awaitable
        except Exception as e:  # noqa: BLE001 - answered as an error response
            result = e
        self.inflight -= 1
        self.deferred = None
        frames, self.backlog = self.backlog, []
        self.process(frames, carry=(rid, result))
        self._update_reading()

    def _settle(self, entries: list, committed, nbytes: int, t0: float) -> None:
        """The batch's future resolved: answer every request of the batch in one write."""
        out: list[bytes] = []
        late: list = []
        acked = 0
        errors = self.counters.errors
        batch_ok = committed is not None and committed.done() and not committed.cancelled() and committed.exception() is None
        for entry in entries:
            rid, staged = entry
            if type(staged) is int:  # an event of the batch: its answer is the seq
                if batch_ok:
                    out.append(_ok_seq(rid, staged))
                    acked += 1
                    continue
                fut = committed
            else:
                fut = staged.durable
                if fut is IN_BATCH:
                    fut = committed
            if not fut.done():
                late.append(entry)  # should not happen (commit order); answered when it resolves
                continue
            exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
            if exc is None:
                out.append(_ok_seq(rid, staged) if type(staged) is int else _ok(rid, staged.fields))
                acked += 1
            else:
                code, message = _error_of(exc)
                errors[code] = errors.get(code, 0) + 1
                out.append(P.encode_error(rid, code, message))
        self.counters.events_acked += acked
        self.counters.batches += 1
        done = len(entries) - len(late)
        self.inflight -= done
        if late:
            share = nbytes * done // len(entries)
            self.inflight_bytes -= share
            nbytes -= share
            futs = [
                committed if type(e[1]) is int or e[1].durable is IN_BATCH else e[1].durable for e in late
            ]
            gathered = asyncio.gather(*futs, return_exceptions=True)
            gathered.add_done_callback(
                lambda _f, late=late, nbytes=nbytes, t0=t0: self._settle(late, committed, nbytes, t0)
            )
        else:
            self.inflight_bytes -= nbytes
        if out:
            self._write(b"".join(out))
            self.server.observe_ack(time.perf_counter() - t0, len(out))
        self._update_reading()
        self._maybe_settled()

    # -- the other operations --------------------------------------------------------------
    def _other(self, op: Any, req: dict) -> Optional[Staged]:
        counts = self.counters.requests
        if op == "ping":
            counts["ping"] += 1
            return Staged({"pong": True})
        if op == "hello":
            counts["hello"] += 1
            return self._hello(req)
        if not self.authenticated:
            if op in counts:
                counts[op] += 1
            raise self._unauthorized()
        backend = self.backend
        if op == "start":
            counts["start"] += 1
            intent = P.req_str(req, "intent", P.MAX_INTENT_CHARS)
            envelope = P.req_object(req, "envelope")
            eid = P.req_execution_id(req, required=False)
            parent = P.req_execution_id(req, "parent_execution_id", required=False)
            forked_at = P.req_seq(req, "forked_at_seq", least=0)
            return backend.stage_start(intent, envelope, eid, parent, forked_at)
        if op == "finish":
            counts["finish"] += 1
            eid = P.req_str(req, "execution_id", P.MAX_EXECUTION_ID_CHARS)
            response = P.req_object(req, "response")
            return backend.stage_finish(eid, response, P.req_seq(req))
        change = _CHANGES.get(op)
        if change is not None:
            field, stage = change
            counts[op] += 1
            eid = P.req_str(req, "execution_id", P.MAX_EXECUTION_ID_CHARS)
            text = P.req_str(req, field, P.MAX_REASON_CHARS)
            return getattr(backend, stage)(eid, text)
        if op == "get":
            counts["get"] += 1
            eid = P.req_str(req, "execution_id", P.MAX_EXECUTION_ID_CHARS)
            self.gets_queued += 1
            self._spawn(self._get(req.get("id"), eid))
            return None
        if op is None:
            raise P.ProtocolError(P.BAD_REQUEST, "`op` is required")
        raise P.ProtocolError(
            P.BAD_REQUEST, f"unknown op {str(op)[:40]!r}; known: {', '.join(P.OPS)}"
        )

    def _hello(self, req: dict) -> Staged:
        if self.needs_token:
            token = req.get("token")
            expected = self.server.config.token or ""
            # Constant time: the comparison must not tell how many leading bytes were right.
            if type(token) is not str or not hmac.compare_digest(
                token.encode("utf-8", "surrogatepass"), expected.encode()
            ):
                raise self._unauthorized("wrong or missing token")
            self.authenticated = True
        cfg = self.server.config
        max_connections = cfg.max_connections if self.listener is None else self.listener.max_connections
        return Staged(
            {
                "protocol": P.PROTOCOL_VERSION,
                "server": "tracedb",
                "version": self.server.version,
                "limits": {
                    "max_frame_bytes": cfg.max_frame_bytes,
                    "max_inflight_requests": cfg.max_inflight_requests,
                    "max_inflight_bytes": cfg.max_inflight_bytes,
                    "max_connections": max_connections,
                },
            }
        )

    def _unauthorized(self, why: str = "send `hello` with the bearer token first") -> P.ProtocolError:
        return P.ProtocolError(P.UNAUTHORIZED, why)

    @staticmethod
    def _explain_event(req: dict) -> None:
        """The event fast path's checks failed: raise the precise bad_request."""
        P.req_str(req, "execution_id", P.MAX_EXECUTION_ID_CHARS)
        P.req_str(req, "type", P.MAX_TYPE_CHARS)
        if "payload" not in req:
            raise P.ProtocolError(P.BAD_REQUEST, "`payload` is required (null is allowed)")
        P.req_seq(req)
        raise P.ProtocolError(P.BAD_REQUEST, "malformed event")

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        self.inflight += 1
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self.inflight -= 1
        self._update_reading()
        self._maybe_settled()

    async def _get(self, rid: Any, execution_id: str) -> None:
        try:
            # Read-your-writes: whatever this connection staged before the get is durable first.
            barrier = self.backend.barrier()
            if barrier is not None and barrier is not IN_BATCH:
                await barrier
            async with self.gets:
                await self.can_write.wait()
                if self.lost:
                    return
                record = await self.backend.get(execution_id)
                line = _ok(rid, {"record": record})
                self._write(line)
                return
        except Exception as e:  # noqa: BLE001 - every failure becomes an error response
            code, message = _error_of(e)
            self.counters.errors[code] = self.counters.errors.get(code, 0) + 1
            line = P.encode_error(rid, code, message)
        finally:
            self.gets_queued -= 1
            if self.held and self.gets_queued <= MAX_QUEUED_GETS // 2:
                self.held = False
                if self.deferred is None:  # else the Deferred's resolution takes the backlog
                    frames, self.backlog = self.backlog, []
                    asyncio.get_running_loop().call_soon(self._process_held, frames)
        self._write(line)

    def _process_held(self, frames: list) -> None:
        if frames:
            self.process(frames)
        self._update_reading()

    # -- plumbing --------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self.lost or self.transport is None or self.transport.is_closing():
            return
        self.counters.bytes_out += len(data)
        self.transport.write(data)

    def _update_reading(self) -> None:
        if self.lost or self.transport is None:
            return
        want_pause = (
            self.write_paused
            or self.held
            or self.inflight + len(self.backlog) >= self.max_inflight
            or self.inflight_bytes >= self.max_inflight_bytes
        )
        if want_pause and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()
        elif (
            not want_pause
            and self.read_paused
            and self.inflight + len(self.backlog) <= self.max_inflight // 2
            and self.inflight_bytes <= self.max_inflight_bytes // 2
        ):
            self.read_paused = False
            self.transport.resume_reading()

    def _maybe_settled(self) -> None:
        if (
            (self.closing or self.eof)
            and self.inflight == 0
            and not self.tasks
            and self.deferred is None
            and not self.backlog
        ):
            if not self.lost and self.transport is not None and not self.transport.is_closing():
                self.transport.close()  # flushes what is buffered, then closes
            self._mark_settled()

    def _mark_settled(self) -> None:
        if not self.settled.done():
            self.settled.set_result(None)

    def begin_drain(self) -> None:
        """Shutdown: stage nothing more; close once every staged request is answered."""
        self.closing = True
        self._maybe_settled()

    def evict(self) -> None:
        """Closed to make room for a newcomer (its listener is at its cap): it never sent a
        whole frame, so nothing of it was staged."""
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def expire(self, why: str) -> None:
        """Closed by the sweep: no first frame in time (`deadline`), or `idle`."""
        if self.listener is not None:
            self.listener.closed[why] += 1
            self.listener.started(self)
        self.awaiting_first = False
        self.closing = True
        self.transport.close()
        log.debug("connection closed", extra={"peer": self.peer, "why": why})

    def abort(self) -> None:
        """Drop the connection now (a peer that would not take its responses in time)."""
        if self.transport is not None:
            self.transport.abort()
        self.lost = True
        self._mark_settled()
        if not self.gone.done():
            self.gone.set_result(None)


def _ok_seq(rid: Any, seq: int) -> bytes:
    """The answer to an event: {"id": rid, "ok": true, "seq": seq} (formatted directly: hot path)."""
    if type(rid) is int:
        return b'{"id":%d,"ok":true,"seq":%d}\n' % (rid, seq)
    return b'{"id":%s,"ok":true,"seq":%d}\n' % (_dumps(rid), seq)


def _ok(rid: Any, fields: dict) -> bytes:
    out = {"id": rid, "ok": True}
    out.update(fields)
    return _dumps(out, option=_NL)


# Store error codes that are not wire codes, and what a client should make of them.
MAX_CONCURRENT_GETS = 4
MAX_QUEUED_GETS = 64

_STORE_CODES = {
    "closed": P.UNAVAILABLE,  # the store is closing (shutdown)
    "in_use": P.UNAVAILABLE,
    "usage": P.INTERNAL,
    # The database behind the recorder, not the request, is at fault: a client may retry.
    "db_unavailable": P.UNAVAILABLE,
    "integrity": P.INTERNAL,
}


def _error_of(exc: BaseException) -> tuple[str, str]:
    """The wire (code, message) of an exception raised while handling a request."""
    if isinstance(exc, P.ProtocolError):
        return exc.code, exc.message
    if isinstance(exc, TraceDBError):
        code = exc.code if exc.code in P.ERROR_CODES else _STORE_CODES.get(exc.code, P.BAD_REQUEST)
        return code, str(exc)
    if isinstance(exc, wal.PayloadTooLargeError):
        return P.FRAME_TOO_LARGE, str(exc)
    if isinstance(exc, wal.WalError):
        if isinstance(exc, wal.WalFailedError) and not getattr(exc, "logged", False):
            exc.logged = True  # the WAL raises this one error for every later write: log it once
            log.error(
                "the WAL failed closed: no write is accepted any more; restart the recorder "
                "(recovery keeps every acknowledged event)",
                extra={"error": str(exc)},
            )
        return P.UNAVAILABLE, f"the recorder cannot write: {exc}"
    if isinstance(exc, asyncio.CancelledError):
        return P.UNAVAILABLE, "the request was cancelled (server shutting down)"
    log.error("internal error: %s: %s", type(exc).__name__, exc, exc_info=exc)
    return P.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


class SidecarServer:
    """Listeners, connections and shutdown around one Backend."""

    def __init__(self, backend: Backend, config: ServerConfig, *, metrics=None, version: str = "0"):
        check_config(config)
        self.backend = backend
        self.config = config
        self.metrics = metrics
        self.version = version
        self.counters = Counters()
        self.connections: set[Connection] = set()
        self.draining = False
        self.started_at = time.time()
        self._socket_inode: Optional[tuple[int, int]] = None
        self._stopped: Optional[asyncio.Event] = None
        self.tcp_address: Optional[tuple[str, int]] = None
        # One Listener per listening address family of the protocol, named as Connection.peer.
        self.listeners: dict[str, Listener] = {}
        if config.socket_path is not None:
            # The agents' listener: a larger share of each turn of the loop than the others.
            per_turn = max(ADMISSIONS_PER_TURN, config.max_connections // 4)
            self.listeners["unix"] = _listener("unix", config.max_connections, per_turn)
        if config.tcp_port is not None:
            self.listeners["tcp"] = _listener("tcp", config.tcp_max_connections or config.max_connections)
        self._sweeper: Optional[asyncio.Task] = None

    @property
    def listening(self) -> bool:
        """Whether `start` opened a listener (the socket, the TCP port)."""
        return any(listener.serving for listener in self.listeners.values())

    # -- starting --------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the Unix socket (0600; its directory 0700 if this made it) and the optional TCP listener."""
        if self._stopped is None:  # install_signal_handlers may have made it (a stop asked early)
            self._stopped = asyncio.Event()
        cfg = self.config
        if cfg.socket_path is not None:
            path = cfg.socket_path
            _prepare_socket_dir(os.path.dirname(os.path.abspath(path)))
            _remove_stale_socket(path)
            old = os.umask(0o177)  # the socket is created 0600: no window where others may connect
            try:
                sock = self._bind_unix(path)
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
            st = os.stat(path)
            self._socket_inode = (st.st_dev, st.st_ino)
            self.listeners["unix"].serve(sock, lambda: Connection(self, needs_token=False, peer="unix"))
        if cfg.tcp_port is not None:
            host = cfg.tcp_host or "127.0.0.1"
            needs_token = not (cfg.trust_local_users and is_loopback(host))

            def factory():
                return Connection(self, needs_token=needs_token, peer="tcp")

            socks = self._bind_tcp(host, cfg.tcp_port)
            self.tcp_address = socks[0].getsockname()[:2]
            for sock in socks:
                self.listeners["tcp"].serve(sock, factory)
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        log.info(
            "listening",
            extra={
                "socket": cfg.socket_path,
                "tcp": f"{self.tcp_address[0]}:{self.tcp_address[1]}" if self.tcp_address else None,
                "max_frame_bytes": cfg.max_frame_bytes,
                "max_connections": {name: lst.max_connections for name, lst in self.listeners.items()},
                "first_frame_timeout_s": cfg.first_frame_timeout_s,
                "connection_idle_timeout_s": cfg.connection_idle_timeout_s,
            },
        )

    def _bind_unix(self, path: str) -> socket.socket:
        sock = self.listeners["unix"].socket(socket.AF_UNIX)
        try:
            sock.bind(path)
            sock.listen(1024)
        except BaseException:
            sock.close()
            raise
        return sock

    def _bind_tcp(self, host: str, port: int) -> list:
        """A listening socket per address of `host` (localhost may be 127.0.0.1 and ::1), as
        asyncio's create_server binds them, for the TCP Listener to accept on."""
        listener = self.listeners["tcp"]
        socks = []
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            for family, _type, proto, _name, addr in dict.fromkeys(infos):
                sock = listener.socket(family, proto)
                socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.bind(addr)
                sock.listen(1024)
        except BaseException:
            for sock in socks:
                sock.close()
            raise
        return socks

    async def _sweep(self) -> None:
        """Close the connections that sent no whole frame within `first_frame_timeout_s`, and
        those with nothing in flight (nothing staged, read or written, reading not paused) that
        sent nothing for `connection_idle_timeout_s`: one pass over the connections every
        `sweep_interval`, so that the hot path keeps no timer per connection or frame."""
        cfg = self.config
        first, idle = cfg.first_frame_timeout_s, cfg.connection_idle_timeout_s
        interval = sweep_interval(first, idle)
        while not self.draining:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for c in list(self.connections):
                if c.closing or c.lost or self.draining:
                    continue
                if c.awaiting_first:
                    if now - c.opened_at >= first:
                        c.expire("deadline")
                    continue
                if (
                    c.active
                    or c.inflight
                    or c.backlog
                    or c.read_paused
                    or c.write_paused
                    or c.transport.get_write_buffer_size()
                ):
                    c.active = False
                    c.quiet_since = now
                elif now - c.quiet_since >= idle:
                    c.expire("idle")

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT start a graceful shutdown. Called before `start`, so that no signal
        finds the default action (death) once the listening line is logged: a stop asked before
        the server listens is kept, and it shuts down as soon as it has started."""
        loop = asyncio.get_running_loop()
        if self._stopped is None:
            self._stopped = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig)

    def request_stop(self, sig=None) -> None:
        """Ask `serve_until_stopped` to shut down."""
        if sig is not None:
            log.info("signal received, shutting down", extra={"signal": signal.Signals(sig).name})
        if self._stopped is not None:
            self._stopped.set()

    async def serve_until_stopped(self) -> None:
        """Serve until `request_stop` (or a signal), then shut down gracefully."""
        assert self._stopped is not None, "call start() first"
        await self._stopped.wait()
        await self.shutdown()

    # -- stopping --------------------------------------------------------------------------
    async def shutdown(self) -> None:
        """Stop accepting, answer every staged request, close connections, close the backend."""
        if self.draining:
            return
        self.draining = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for listener in self.listeners.values():
            listener.close()
        conns = list(self.connections)
        for c in conns:
            c.begin_drain()
        if conns:
            # Every staged request gets its answer (durable, or failed), then each transport
            # flushes and closes; a peer that does not read its responses in time is dropped.
            deadline = time.monotonic() + self.config.drain_timeout_s
            await asyncio.wait([c.settled for c in conns], timeout=self.config.drain_timeout_s)
            left = max(0.1, deadline - time.monotonic())
            await asyncio.wait([c.gone for c in conns], timeout=left)
            for c in conns:
                if not c.gone.done():
                    log.warning("connection did not drain in time; aborting it", extra={"peer": c.peer})
                    c.abort()
        self._remove_socket()
        try:
            await self.backend.close()
        finally:
            log.info(
                "stopped",
                extra={"events_acked": self.counters.events_acked, "uptime_s": round(time.time() - self.started_at, 3)},
            )

    def _remove_socket(self) -> None:
        path = self.config.socket_path
        if path is None or self._socket_inode is None:
            return
        try:
            st = os.stat(path)
            # Only our own socket: another server may have replaced it meanwhile.
            if (st.st_dev, st.st_ino) == self._socket_inode:
                os.unlink(path)
        except FileNotFoundError:
            pass

    # -- observations ----------------------------------------------------------------------
    def observe_ack(self, seconds: float, n: int) -> None:
        """One batch answered: its latency from read to response (for the ack histogram)."""
        if self.metrics is not None:
            self.metrics.observe_ack(seconds, n)


def _listener(name: str, cap: int, admissions_per_turn: int = ADMISSIONS_PER_TURN) -> Listener:
    refusal = P.encode_error(None, P.OVERLOADED, f"too many connections (limit {cap})")
    return Listener(name, cap, request_end=b"\n", refusal=refusal, admissions_per_turn=admissions_per_turn)


def _prepare_socket_dir(directory: str) -> None:
    """Create the socket's directory 0700; refuse one that anyone can write to without the
    sticky bit (another user could replace the socket). An existing directory keeps its mode:
    the socket itself is created 0600, which is what keeps other users out."""
    if not os.path.isdir(directory):
        # Often the data directory itself, made here before the store opens: each new level
        # 0700 and fsynced into its parent, as the store makes it (wal.fs.make_dirs).
        wal.fs.make_dirs(wal.OsFileSystem(), directory)
        return
    st = os.stat(directory)
    if stat.S_IMODE(st.st_mode) & 0o002 and not st.st_mode & stat.S_ISVTX:
        raise ServerConfigError(
            f"the socket directory {directory} is writable by everyone",
            hint="put the socket in a private directory (the default is the data directory)",
        )


def _remove_stale_socket(path: str) -> None:
    """Remove a socket file left by a killed server; refuse if a server still answers on it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ServerConfigError(
            f"{path} exists and is not a socket", hint="choose another --socket path"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError as e:
        if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
            os.unlink(path)
            return
        raise
    else:
        raise ServerConfigError(
            f"another server is listening on {path}",
            hint="stop it first, or give this one another --socket",
        )
    finally:
        probe.close()
