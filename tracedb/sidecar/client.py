"""Recording client, sync and asyncio, with one API for a sidecar and for the embedded store.

    from tracedb.client import connect
    with connect() as rec:                      # a sidecar if one is configured, else in-process
        ex = rec.start("ProcessIntent", {"intent": "ProcessIntent", "payload": {...}})
        ex.event("tool.requested", {"tool": "search", "args": {...}})
        ex.finish({"status": "success", "payload": {...}})

Where the recording goes (`connect(sidecar=None, data_dir=None)`):
1. `sidecar=` ("unix:/path/tracedb.sock", a socket path, or "tcp://127.0.0.1:7411"), else
2. the environment variable TRACEDB_SIDECAR, else
3. the default socket `<data dir>/tracedb.sock` when a server listens there, else
4. in-process: the embedded store in the data directory (`tracedb.open`).

A TCP listener needs its bearer token; the client sends `token=`, else TRACEDB_TOKEN, else the
data directory's token file (`<data dir>/token`, made by `tracedb serve`), so that the owner's
agents need not be told it. The Unix socket needs none.

Reconnecting without duplicates: every request is idempotent, so after a transient failure (the
connection drops, the server restarts gracefully, answers `unavailable` or `overloaded`) the client
reconnects and resends every request not yet answered, in order, until `reconnect_timeout_s`
(default 30 s). The first connection is different: a recorder that was never reachable fails it
after `connect_timeout_s` (default 1 s), so an agent is not held up by a recorder that is not
running.
A connection on which a request goes unanswered for `timeout_s` (default 60 s: a recorder stuck
on its disk) counts as dropped, for the sync and the asyncio client alike.
- `start` always carries an execution id (chosen here, a UUID, when the caller gives none): a
  resent start finds the execution and answers `created: false`.
- `event` and `finish` carry the seq the client expects them to get: a resent one whose seq the
  server already recorded is answered with that original seq (`duplicate: true`), never appended.
  `Execution` handles always send it. `Client.event(execution_id, ...)` and `finish` by id send
  it when given `seq=`; without it such a request is never resent once it may have reached the
  server: it fails with `OutcomeUnknownError` (check with `get`), rather than risk a second copy.
- `invalidate` of an invalidated execution succeeds; `get` and `ping` only read.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Protocol
from urllib.parse import urlparse

import orjson

import tracedb
from tracedb import errors as E
from tracedb.config import DEFAULT_DATA_DIR, find_data_dir, load_config, read_local_token
from tracedb.errors import (  # noqa: F401 - re-exported: their public home before errors.py
    OutcomeUnknownError,
    RecorderUnavailableError,
    SeqConflictError,
    SidecarError,
)
from tracedb.recorder import handles
from tracedb.backoff import Backoff
from tracedb.records.ids import new_execution_id
from tracedb.records.record import ExecutionRecord, compute_envelope_hash
from tracedb.records.validation import DUMP_OPTS, ENVELOPE_OPTS, check_finite, dumps_checked
from tracedb.sidecar import protocol as P
from tracedb.sidecar.outage import (
    CONTINUE,
    DEFAULT_OUTAGE_TIMEOUT_S,
    DROPPED,
    PROBE_INTERVAL_S,
    PROBE_WAIT_S,
    Outage,
    arun_steps,
    outage_policy,
    run_steps,
)

log = logging.getLogger(__name__)

RETRYABLE = frozenset({P.UNAVAILABLE, P.OVERLOADED})
# How long the first connection to a recorder may take, retries included: an agent whose recorder
# was never started learns it in about a second, not after the reconnect timeout.
DEFAULT_CONNECT_TIMEOUT_S = 1.0
_OPT = orjson.OPT_APPEND_NEWLINE
# A response (a `get` of a big record) may be a long line, up to this.
_MAX_RESPONSE_BYTES = 1 << 30
_FRAME_OPTS = _OPT | DUMP_OPTS


# -- errors --------------------------------------------------------------------------------------


def _resend_safe(req: dict) -> bool:
    """Whether a request may be sent again after a failure: everything but an event or finish
    without the seq that lets the server recognise a repeat."""
    return req.get("op") not in ("event", "finish") or req.get("seq") is not None


def _outcome_unknown(address: str, op: str, execution_id, cause) -> OutcomeUnknownError:
    return OutcomeUnknownError(
        f"the connection to the recorder at {address} failed after the {op} request for "
        f"{execution_id!r} was sent ({cause}); it may or may not be recorded",
        hint="read the execution with get() to see; pass seq= (Execution handles do) so that a "
        "request can be resent without being recorded twice",
    )


def _unreachable(address: str, cause) -> RecorderUnavailableError:
    return RecorderUnavailableError(
        f"cannot reach the recorder at {address}: {cause}",
        hint="is `tracedb serve` running? check the socket path / TRACEDB_SIDECAR",
    )


_WIRE_ERRORS = {
    P.UNKNOWN_EXECUTION: E.ExecutionNotFoundError,
    P.EXECUTION_CLOSED: E.ExecutionClosedError,
    P.EXECUTION_EXISTS: E.ExecutionExistsError,
    P.BAD_REQUEST: E.InvalidInputError,
    P.SEQ_CONFLICT: SeqConflictError,
    P.UNAVAILABLE: RecorderUnavailableError,
}


def error_from_wire(error: dict, execution_id: Optional[str] = None) -> E.TraceDBError:
    """The TraceDBError for an error response: the store's own class where one exists."""
    code = str(error.get("code") or P.INTERNAL)
    message = str(error.get("message") or code)
    cls = _WIRE_ERRORS.get(code)
    if code == P.UNAUTHORIZED:
        return SidecarError(code, message, hint=(
            "the recorder's TCP listener needs its token: run from its data directory (the "
            "client reads the file token there; or pass data_dir=), set TRACEDB_TOKEN, or pass token="))
    if cls is None:
        return SidecarError(code, message)
    err = cls.__new__(cls)
    E.TraceDBError.__init__(err, message)
    err.execution_id = execution_id
    if cls is E.ExecutionClosedError:
        err.status = _status_in(message)
    return err


def _status_in(message: str) -> str:
    for status in ("completed", "incomplete", "invalidated"):
        if status in message:
            return status
    return "closed"


# -- addresses -----------------------------------------------------------------------------------


def parse_address(address: str) -> tuple[str, Any]:
    """("unix", path) or ("tcp", (host, port)) from "unix:/p", "unix:///p", "/p", "tcp://h:p", "h:p"."""
    if address.startswith("unix:"):
        path = address[5:]
        if path.startswith("//"):
            path = urlparse(address).path
        return "unix", path
    if address.startswith("tcp://"):
        u = urlparse(address)
        return "tcp", (u.hostname or "127.0.0.1", u.port or P.DEFAULT_TCP_PORT)
    if "/" in address or address.endswith(".sock"):
        return "unix", address
    host, _, port = address.rpartition(":")
    if host and port.isdigit():
        return "tcp", (host, int(port))
    raise E.ConfigError(
        f"cannot read sidecar address {address!r}",
        hint="write unix:/path/to/tracedb.sock or tcp://127.0.0.1:7411",
    )


def default_data_dir(data_dir: Optional[str]) -> str:
    """The data directory the way the command line resolves it: the argument, TRACEDB_DATA_DIR
    or the configuration, else the nearest .tracedb up from the working directory, else ./.tracedb."""
    if data_dir is not None:
        return os.fspath(data_dir)
    configured = load_config().data_dir
    if configured != DEFAULT_DATA_DIR:
        return configured
    return find_data_dir(os.getcwd()) or configured


def resolve_sidecar(sidecar: Optional[str], data_dir: Optional[str]) -> Optional[str]:
    """The sidecar address to use, or None for in-process recording (see the module doc)."""
    if sidecar:
        return sidecar
    env = os.environ.get("TRACEDB_SIDECAR")
    if env:
        return env
    path = os.path.join(default_data_dir(data_dir), P.DEFAULT_SOCKET_NAME)
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(1.0)
            probe.connect(path)
            return "unix:" + path
        except OSError:
            return None  # a stale socket of a stopped server: record in-process
        finally:
            probe.close()
    return None


def _token_for(address: str, token: Optional[str], data_dir: Optional[str]) -> Optional[str]:
    """The token a connection to `address` sends: `token`, else TRACEDB_TOKEN, else, for TCP, the
    data directory's token file: the owner's own agents are not told it. (The Unix socket
    needs none: its file mode keeps other users out.)"""
    if token is not None:
        return token
    env = os.environ.get("TRACEDB_TOKEN")
    if env or parse_address(address)[0] != "tcp":
        return env or None
    return read_local_token(default_data_dir(data_dir))


def _address_for(policy: str, sidecar: Optional[str], data_dir: Optional[str], embedded: Optional[bool]) -> Optional[str]:
    """Where a client records: `resolve_sidecar`, except that a client that fails open never falls
    back to recording in-process (it would hold the data directory, and a recorder could not
    start there): with no recorder answering, it waits for one on the data directory's socket."""
    if embedded:
        return None
    address = resolve_sidecar(sidecar, data_dir)
    if address is None and policy == CONTINUE and embedded is None:
        address = "unix:" + os.path.join(default_data_dir(data_dir), P.DEFAULT_SOCKET_NAME)
    return address


@dataclass(frozen=True)
class _Plan:
    """Where a client records and how long it waits, resolved once for the sync and the asyncio
    client alike: `address` None records in-process into `data_dir`; `fail_open` is
    on_outage="continue", whose timeouts are already cut to `outage_timeout_s`."""

    address: Optional[str]
    data_dir: Optional[str]
    token: Optional[str]
    timeout_s: float
    reconnect_timeout_s: float
    connect_timeout_s: float
    fail_open: bool
    outage_timeout_s: float

    def transport(self) -> dict:
        """The keyword arguments of a connection to the sidecar."""
        return dict(token=self.token, timeout_s=self.timeout_s, reconnect_timeout_s=self.reconnect_timeout_s,
                    connect_timeout_s=self.connect_timeout_s)


def _plan(sidecar, data_dir, token, timeout_s, reconnect_timeout_s, connect_timeout_s, embedded, on_outage,
          outage_timeout_s) -> _Plan:
    """`connect()`'s arguments resolved (see the module doc and `Client`)."""
    policy = outage_policy(on_outage)
    address = _address_for(policy, sidecar, data_dir, embedded)
    if address is None:
        return _Plan(None, default_data_dir(data_dir), None, timeout_s, reconnect_timeout_s, connect_timeout_s,
                     False, outage_timeout_s)
    fail_open = policy == CONTINUE
    if fail_open:
        # Waiting for an answer, then reconnecting and waiting again: outage_timeout_s in all.
        timeout_s = min(timeout_s, outage_timeout_s / 2)
        reconnect_timeout_s = min(reconnect_timeout_s, outage_timeout_s / 2)
    return _Plan(address, data_dir, _token_for(address, token, data_dir), timeout_s, reconnect_timeout_s,
                 connect_timeout_s, fail_open, outage_timeout_s)


def _request_event(execution_id: str, type: str, payload: Any, seq: Optional[int]) -> dict:
    req = {"id": None, "op": "event", "execution_id": execution_id, "type": type, "payload": payload}
    if seq is not None:
        req["seq"] = seq
    return req


def _request_finish(execution_id: str, response: dict, seq: Optional[int]) -> dict:
    req = {"id": None, "op": "finish", "execution_id": execution_id, "response": response}
    if seq is not None:
        req["seq"] = seq
    return req


def _request_change(op: str, execution_id: str, text: str) -> dict:
    return {"id": None, "op": op, "execution_id": execution_id, _CHANGES[op][0]: text}


def _request_start(rid, intent, envelope, execution_id, parent_execution_id, forked_at_seq) -> dict:
    # The envelope is written as the store writes (and hashes) it in-process, a datetime as its
    # str(): one envelope gets one hash on every way in (docs/values.md).
    envelope = orjson.Fragment(dumps_checked(envelope, "envelope", ENVELOPE_OPTS, default=str))
    req = {"id": rid, "op": "start", "intent": intent, "envelope": envelope, "execution_id": execution_id}
    if parent_execution_id is not None:
        req["parent_execution_id"] = parent_execution_id
        req["forked_at_seq"] = forked_at_seq
    return req


def _encode(req: dict, max_frame_bytes: int) -> bytes:
    try:
        # The store's encoding options: a datetime in a payload is refused, as in-process.
        frame = orjson.dumps(req, option=_FRAME_OPTS)
    except (TypeError, orjson.JSONEncodeError) as e:
        raise E.InvalidInputError(
            f"cannot record a value that is not JSON: {e}",
            hint="payloads must be JSON: dicts, lists, str, int (64-bit), float, bool, None",
        ) from None
    if b"null" in frame:
        # orjson writes NaN and infinities as null: refused, as the embedded store refuses them,
        # rather than recorded as another value (only a frame with a null can hold one).
        check_finite(req, f"the {req.get('op')} request")
    if len(frame) > max_frame_bytes:
        raise _frame_too_large(len(frame), max_frame_bytes)
    return frame


def _frame_too_large(size: int, max_frame_bytes: int, why: str = "") -> SidecarError:
    return SidecarError(
        P.FRAME_TOO_LARGE,
        f"request of {size} bytes exceeds the server's frame limit of {max_frame_bytes}{why}",
        hint="raise `tracedb serve --max-frame-bytes`, or record large blobs by reference",
    )


# -- sync ----------------------------------------------------------------------------------------


class _SyncConn:
    """One blocking connection: send a frame, read lines until the response with our id."""

    def __init__(self, address: str, token: Optional[str], timeout_s: float):
        kind, where = parse_address(address)
        if kind == "unix":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            s = socket.socket(socket.AF_INET6 if ":" in where[0] else socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(timeout_s)
        try:
            s.connect(where)
        except BaseException:
            s.close()
            raise
        self.sock = s
        self.buf = bytearray()
        self.max_frame_bytes = P.DEFAULT_MAX_FRAME_BYTES

    def roundtrip(self, rid: Any, frame: bytes) -> dict:
        """Send one request frame and return the response with id `rid`. An OSError raised
        before the frame was wholly handed to the socket carries `not_sent = True`: the server
        cannot have read a request that has no newline yet."""
        try:
            self.sock.sendall(frame)
        except OSError as e:
            e.not_sent = True
            raise
        while True:
            nl = self.buf.find(b"\n")
            while nl < 0:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionResetError("the server closed the connection")
                self.buf += chunk
                nl = self.buf.find(b"\n")
            line = bytes(self.buf[:nl])
            del self.buf[: nl + 1]
            resp = orjson.loads(line)
            if resp.get("id") == rid or resp.get("id") is None:
                return resp
            # A late answer to a request resent after a timeout: already handled.

    def closed_by_peer(self) -> bool:
        """True if the server closed this idle connection (it restarted, say): readable with
        nothing pending means end of file. No request is in flight when this is asked."""
        try:
            readable, _w, _x = select.select([self.sock], [], [], 0)
            return bool(readable) and not self.sock.recv(1, socket.MSG_PEEK)
        except OSError:
            return True

    def close(self) -> None:
        """Close the socket."""
        try:
            self.sock.close()
        except OSError:
            pass


class _SyncSidecar:
    """The sync transport to a sidecar: reconnects and resends on transient failures."""

    def __init__(self, address: str, *, token=None, timeout_s=60.0, reconnect_timeout_s=30.0,
                 connect_timeout_s=DEFAULT_CONNECT_TIMEOUT_S, connect_now: bool = True):
        self.address = address
        self.token = token if token is not None else os.environ.get("TRACEDB_TOKEN")
        self.timeout_s = timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.conn: Optional[_SyncConn] = None
        self.lock = threading.Lock()
        self.next_id = 0
        self.reconnects = 0
        self.max_frame_bytes = P.DEFAULT_MAX_FRAME_BYTES
        self.known_down: Optional[Callable[[], bool]] = None  # a fail-open client's outage state
        if not connect_now:
            return  # connected by the first request
        with self.lock:
            # A recorder that was never reachable fails the first connection fast.
            self._connect(time.monotonic() + connect_timeout_s, min(timeout_s, connect_timeout_s))

    def _connect(self, deadline: float, attempt_timeout_s: Optional[float] = None) -> None:
        backoff = Backoff(deadline=deadline)
        last: Optional[BaseException] = None
        while True:
            try:
                conn = _SyncConn(self.address, self.token, attempt_timeout_s or self.timeout_s)
                self.next_id += 1
                hello = {"id": self.next_id, "op": "hello", "client": "tracedb-py"}
                if self.token:
                    hello["token"] = self.token
                resp = conn.roundtrip(self.next_id, orjson.dumps(hello, option=_OPT))
                if not resp.get("ok"):
                    conn.close()
                    err = resp.get("error") or {}
                    if err.get("code") in RETRYABLE:
                        raise ConnectionRefusedError(err.get("message"))
                    raise error_from_wire(err)
                conn.max_frame_bytes = self.max_frame_bytes = resp["limits"]["max_frame_bytes"]
                conn.sock.settimeout(self.timeout_s)
                self.conn = conn
                return
            except (OSError, ValueError) as e:
                last = e
            delay = backoff.next_delay()
            if delay is None:
                raise _unreachable(self.address, last) from last
            time.sleep(delay)

    def request(self, req: dict, execution_id: Optional[str] = None) -> dict:
        """Send one request and return its success fields; raise the mapped error otherwise."""
        with self.lock:
            if self.known_down is not None and req.get("op") in P.WRITE_OPS and self.known_down():
                # Another thread found the recorder down while this one waited for the lock.
                raise RecorderUnavailableError(f"the recorder at {self.address} is down")
            self.next_id += 1
            rid = req["id"] = self.next_id
            frame = _encode(req, self.max_frame_bytes)
            safe = _resend_safe(req)
            deadline = None
            backoff: Optional[Backoff] = None
            while True:
                try:
                    if self.conn is not None and not safe and self.conn.closed_by_peer():
                        self.conn.close()  # do not send what cannot be resent into a dead socket
                        self.conn = None
                    if self.conn is None:
                        self._connect(deadline or time.monotonic() + self.reconnect_timeout_s)
                        self.reconnects += 1
                    if deadline is not None:  # a resend waits no longer than the reconnect deadline
                        self.conn.sock.settimeout(max(0.01, min(self.timeout_s, deadline - time.monotonic())))
                    resp = self.conn.roundtrip(rid, frame)
                    if deadline is not None:
                        self.conn.sock.settimeout(self.timeout_s)
                except (OSError, ValueError) as e:  # reset, EOF, timeout, garbage: reconnect, resend
                    # Not sent: connecting failed, or the frame never wholly left.
                    sent = self.conn is not None and not getattr(e, "not_sent", False)
                    if self.conn is not None:
                        self.conn.close()
                        self.conn = None
                    if sent and not safe:
                        raise _outcome_unknown(self.address, req["op"], req.get("execution_id"), e) from e
                    deadline = deadline or time.monotonic() + self.reconnect_timeout_s
                    if time.monotonic() >= deadline:
                        raise RecorderUnavailableError(f"recorder at {self.address} failed: {e}") from e
                    continue
                if resp.get("ok"):
                    return resp
                err = resp.get("error") or {}
                if err.get("code") in RETRYABLE:  # the server is draining or full: back off, retry
                    deadline = deadline or time.monotonic() + self.reconnect_timeout_s
                    backoff = backoff or Backoff(deadline=deadline)
                    delay = backoff.next_delay()
                    if delay is not None:
                        time.sleep(delay)
                        continue
                raise error_from_wire(err, execution_id)

    def close(self) -> None:
        """Close the connection (requests in progress in other threads fail)."""
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None


class Execution(handles.Execution):
    """One execution being recorded (sync). Obtained from `Client.start`.

    It counts the seq of its next event, and sends it with each event and finish, so that a
    request resent after a reconnect is recognised and never recorded twice."""

    def __init__(self, client: "Client", execution_id: str, envelope_hash: str, next_seq: int = 1):
        super().__init__(client, execution_id, envelope_hash)
        self._next_seq = next_seq
        self._lock = threading.Lock()

    def event(self, type: str, payload: Any = None) -> Optional[int]:
        """Record one event; returns its seq once it is durable (None: not recorded, the client
        fails open and the recorder is unreachable)."""
        with self._lock:
            got = self.recorder.event(self.execution_id, type, payload, seq=self._next_seq)
            if got is not None:
                self._next_seq = got + 1
            return got

    def finish(self, response: dict) -> Optional[int]:
        """Record the final response (FINAL_RESPONSE); returns its seq once durable (None: not
        recorded, as for `event`)."""
        with self._lock:
            got = self.recorder.finish(self.execution_id, response, seq=self._next_seq)
            if got is not None:
                self._next_seq = got + 1
            return got

    @property
    def last_seq(self) -> int:
        """The seq of the last event recorded through this handle (0 before the first)."""
        return self._next_seq - 1


# -- where a client records: one recorder, chosen once ---------------------------------------------

NO_OUTAGE = {"down": False, "outages": 0, "unrecorded": 0, "executions_affected": 0}
# The status changes of the by-id API: the request's op, its text field, the store's method.
_CHANGES = {
    "invalidate": ("reason", "invalidate"),
    "abandon": ("reason", "abandon"),
    "recording_failure": ("detail", "mark_recording_failure"),
}


class Recorder(Protocol):
    """What a `Client` records through, chosen once at `connect()`: the embedded store or a
    sidecar. Each method does what the Client's of the same name does; `start` returns the
    execution's id, its envelope hash and the seq its next event gets; `change` is `invalidate`,
    `abandon` or `recording_failure` (`_CHANGES`)."""

    address: Optional[str]
    embedded: bool

    def start(self, intent: str, envelope: dict, execution_id: Optional[str],
              parent_execution_id: Optional[str], forked_at_seq: Optional[int]) -> tuple[str, str, int]: ...

    def event(self, execution_id: str, type: str, payload: Any, seq: Optional[int]) -> Optional[int]: ...

    def finish(self, execution_id: str, response: dict, seq: Optional[int]) -> Optional[int]: ...

    def change(self, op: str, execution_id: str, text: str) -> None: ...

    def get(self, execution_id: str) -> ExecutionRecord: ...

    def ping(self) -> bool: ...

    def outage_stats(self) -> dict: ...

    def close(self) -> None: ...


class _Embedded:
    """Records in-process, into the embedded store (`tracedb.open`)."""

    address = None
    embedded = True

    def __init__(self, store):
        self.store = store

    def start(self, intent, envelope, execution_id, parent_execution_id, forked_at_seq):
        ex = self.store.start(intent, envelope, execution_id,
                              parent_execution_id=parent_execution_id, forked_at_seq=forked_at_seq)
        return ex.execution_id, ex.envelope_hash, 1

    def event(self, execution_id, type, payload, seq):
        return self.store.event(execution_id, type, payload)

    def finish(self, execution_id, response, seq):
        return self.store.finish(execution_id, response)

    def change(self, op, execution_id, text):
        getattr(self.store, _CHANGES[op][1])(execution_id, text)

    def get(self, execution_id):
        return self.store.get(execution_id)

    def ping(self):
        return True

    def outage_stats(self):
        return dict(NO_OUTAGE)

    def close(self):
        self.store.close()


class _ViaSidecar:
    """Records through a sidecar (`tracedb serve`), under the outage policy."""

    embedded = False

    def __init__(self, plan: _Plan):
        self.address = plan.address
        self.outage: Optional[Outage] = Outage(plan.address) if plan.fail_open else None
        self.outage_timeout_s = plan.outage_timeout_s
        self.prober: Optional[threading.Thread] = None
        self.closing = threading.Event()
        try:
            self.remote = _SyncSidecar(plan.address, **plan.transport())
        except RecorderUnavailableError as e:
            if self.outage is None:
                raise
            self.remote = _SyncSidecar(plan.address, connect_now=False, **plan.transport())
            self._failed(e)
        if self.outage is not None:
            self.remote.known_down = lambda o=self.outage: o.down

    def start(self, intent, envelope, execution_id, parent_execution_id, forked_at_seq):
        execution_id = new_execution_id() if execution_id is None else execution_id
        req = _request_start(None, intent, envelope, execution_id, parent_execution_id, forked_at_seq)
        resp = self._write(req, execution_id)
        if resp is None:  # dropped (fail open): the handle goes on, its records dropped likewise
            return execution_id, compute_envelope_hash(envelope), 1
        return resp["execution_id"], resp["envelope_hash"], resp.get("last_seq", 0) + 1

    def event(self, execution_id, type, payload, seq):
        resp = self._write(_request_event(execution_id, type, payload, seq), execution_id)
        return None if resp is None else resp["seq"]

    def finish(self, execution_id, response, seq):
        resp = self._write(_request_finish(execution_id, response, seq), execution_id)
        return None if resp is None else resp["seq"]

    def change(self, op, execution_id, text):
        self._write(_request_change(op, execution_id, text), execution_id)

    def get(self, execution_id):
        resp = self.remote.request({"id": None, "op": "get", "execution_id": execution_id}, execution_id)
        return ExecutionRecord.from_dict(resp["record"])

    def ping(self):
        return bool(self.remote.request({"id": None, "op": "ping"}).get("ok"))

    def outage_stats(self):
        return dict(NO_OUTAGE) if self.outage is None else self.outage.stats()

    def _write(self, req: dict, execution_id: Optional[str]) -> Optional[dict]:
        """Send a write request under the outage policy: its response, or None if it was dropped."""
        o = self.outage
        if o is None:
            return self.remote.request(req, execution_id)
        if o.down:
            o.drop(execution_id, req)
            return None
        x = o.lost.get(execution_id) if execution_id is not None else None
        try:
            if x is None:
                return self.remote.request(req, execution_id)
            with x.lock:
                resp = run_steps(o.send(x, req), lambda r: self.remote.request(r, execution_id))
        except RecorderUnavailableError as e:
            self._failed(e)
            o.drop(execution_id, req)
            return None
        if resp is DROPPED:
            o.drop(execution_id, req)
            return None
        return resp

    # -- the outage prober (a background thread while the recorder is down) ----------------

    def _failed(self, cause: BaseException) -> None:
        if self.outage.failed(cause) and not self.closing.is_set():
            self.prober = threading.Thread(target=self._probe, name="tracedb-outage-probe", daemon=True)
            self.prober.start()

    def _probe(self) -> None:
        """Until the recorder answers, try it; then tell it about every execution that lost
        records (the agent's threads never wait for this)."""
        o = self.outage
        try:
            while not self.closing.is_set():
                if o.down:
                    if not self._answers():
                        self.closing.wait(PROBE_INTERVAL_S)
                        continue
                    o.recovered()
                try:
                    for x in o.untold():
                        with x.lock:
                            if x.untold:
                                run_steps(o.tell(x), lambda r, eid=x.execution_id: self.remote.request(r, eid))
                except RecorderUnavailableError as e:
                    o.failed(e)
                    continue
                if o.prober_done():
                    return
        except BaseException:  # noqa: BLE001 - the agent goes on; the next failure starts a prober
            log.exception("tracedb: the outage prober stopped")
        o.prober_stopped()

    def _answers(self) -> bool:
        """One probe on a connection of its own: True once the recorder's store answers."""
        try:
            conn = _SyncConn(self.address, self.remote.token, PROBE_WAIT_S)
        except OSError:
            return False
        try:
            for rid, req in enumerate(_probe_requests(self.remote.token, self.outage, "tracedb-py-probe"), 1):
                resp = conn.roundtrip(rid, orjson.dumps(req, option=_OPT))
                if rid == 1 and not resp.get("ok"):
                    return False
            return resp.get("ok") or (resp.get("error") or {}).get("code") not in RETRYABLE
        except (OSError, ValueError):
            return False
        finally:
            conn.close()

    def close(self) -> None:
        prober = self.prober
        if prober is not None:
            deadline = time.monotonic() + self.outage_timeout_s
            while prober.is_alive() and not (self.outage.down and time.monotonic() >= deadline):
                prober.join(PROBE_INTERVAL_S)
            self.closing.set()
            prober.join()
        self.closing.set()
        if self.outage is not None:
            _unflagged(self.outage)
        self.remote.close()


def _probe_requests(token: Optional[str], outage: Outage, client: str) -> list[dict]:
    """A probe's two requests (ids 1 and 2): hello, then a `get` that only an open store answers."""
    hello = {"id": 1, "op": "hello", "client": client}
    if token:
        hello["token"] = token
    return [hello, {"id": 2, "op": "get", "execution_id": outage.probe_id()}]


def _unflagged(o: Outage) -> None:
    left = o.untold()
    if left:
        log.error(
            "tracedb: closed with %d execution(s) that lost records the recorder never heard of "
            "(it was unreachable): it closes them incomplete (execution_incomplete) when its idle "
            "timeout passes or it stops", len(left),
            extra={"address": o.address, "execution_ids": [x.execution_id for x in left[:20]]},
        )


class Client:
    """Records executions through a sidecar or, with none configured, in-process (sync API).

    Where it records is chosen once, when it is made (see the module doc): every call then goes
    to that one recorder. Thread-safe: calls from several threads are serialised on one connection.

    `on_outage` (or TRACEDB_ON_OUTAGE) chooses what a call does when the sidecar cannot be
    reached: "raise" (default) raises RecorderUnavailableError; "continue" fails open: the agent
    goes on, the record is dropped (the call returns None), counted in `outage_stats()` and
    logged, and the execution is flagged `recording_failure`, with what was lost and when, once
    the recorder is back (its dropped finish sent then). In that mode each call waits at most
    `outage_timeout_s` (default 2 s) for the recorder, and none waits while it is known to be
    down: a background prober watches for it. See tracedb/sidecar/outage.py, docs/clients.md.
    """

    def __init__(
        self,
        sidecar: Optional[str] = None,
        *,
        data_dir: Optional[str] = None,
        token: Optional[str] = None,
        timeout_s: float = 60.0,
        reconnect_timeout_s: float = 30.0,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        embedded: Optional[bool] = None,
        on_outage: Optional[str] = None,
        outage_timeout_s: float = DEFAULT_OUTAGE_TIMEOUT_S,
    ):
        plan = _plan(sidecar, data_dir, token, timeout_s, reconnect_timeout_s, connect_timeout_s, embedded,
                     on_outage, outage_timeout_s)
        if plan.address is None:
            self._recorder: Recorder = _Embedded(tracedb.open(plan.data_dir))
        else:
            self._recorder = _ViaSidecar(plan)

    @property
    def address(self) -> Optional[str]:
        """The sidecar's address; None when recording in-process."""
        return self._recorder.address

    @property
    def embedded(self) -> bool:
        """True when recording in-process (no sidecar)."""
        return self._recorder.embedded

    def outage_stats(self) -> dict:
        """With on_outage="continue": whether the recorder is down, how many outages, how many
        records were dropped (less those the recorder turned out to have kept) and how many
        executions they touched (all zero otherwise)."""
        return self._recorder.outage_stats()

    def start(
        self,
        intent: str,
        envelope: dict,
        execution_id: Optional[str] = None,
        *,
        parent_execution_id: Optional[str] = None,
        forked_at_seq: Optional[int] = None,
    ) -> Execution:
        """Start recording an execution; returns once the start is durable."""
        eid, envelope_hash, next_seq = self._recorder.start(
            intent, envelope, execution_id, parent_execution_id, forked_at_seq)
        return Execution(self, eid, envelope_hash, next_seq)

    def execution(self, execution_id: str, envelope_hash: str = "", next_seq: int = 1) -> Execution:
        """A handle on an execution started elsewhere (e.g. by a previous client)."""
        return Execution(self, execution_id, envelope_hash, next_seq)

    def event(self, execution_id: str, type: str, payload: Any = None, *, seq: Optional[int] = None) -> Optional[int]:
        """Record one event of an execution by id; returns its seq once durable (None: not
        recorded, the client fails open and the recorder is unreachable). Give `seq` (the seq it
        should get) to make it safe to resend: without it, a connection lost after sending raises
        `OutcomeUnknownError` instead of resending (see the module doc)."""
        return self._recorder.event(execution_id, type, payload, seq)

    def finish(self, execution_id: str, response: dict, *, seq: Optional[int] = None) -> Optional[int]:
        """Record an execution's final response by id; returns its seq once durable (None as for
        `event`). Without `seq`, a lost connection raises `OutcomeUnknownError`, as for `event`."""
        return self._recorder.finish(execution_id, response, seq)

    def invalidate(self, execution_id: str, reason: str) -> None:
        """Mark an execution manually invalidated (not replayable)."""
        self._recorder.change("invalidate", execution_id, reason)

    def abandon(self, execution_id: str, reason: str) -> None:
        """Mark a running execution incomplete (execution_incomplete) because its agent died:
        what recovery does after a crash, now instead of after the idle timeout."""
        self._recorder.change("abandon", execution_id, reason)

    def mark_recording_failure(self, execution_id: str, detail: str) -> None:
        """Flag an execution not replayable because records of it were lost (recording_failure,
        `detail` as its note); its status does not change."""
        self._recorder.change("recording_failure", execution_id, detail)

    def get(self, execution_id: str) -> ExecutionRecord:
        """The execution's whole record."""
        return self._recorder.get(execution_id)

    def ping(self) -> bool:
        """True when the recorder answers."""
        return self._recorder.ping()

    def close(self) -> None:
        """Close the connection (or the embedded store). A fail-open client still telling the
        recorder about executions that lost records finishes that first; while the recorder is
        down it waits for it `outage_timeout_s` at most (see docs/clients.md)."""
        self._recorder.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect(sidecar: Optional[str] = None, **kwargs) -> Client:
    """A sync recording client; see the module doc for where it records."""
    return Client(sidecar, **kwargs)


# -- asyncio -------------------------------------------------------------------------------------


class _Pending:
    __slots__ = ("rid", "op", "resend_safe", "frame", "future", "execution_id", "deadline", "sent_at", "sent")

    def __init__(self, rid, op, resend_safe, frame, future, execution_id, now):
        self.rid = rid
        self.op = op
        self.resend_safe = resend_safe
        self.frame = frame
        self.future = future
        self.execution_id = execution_id
        self.deadline: Optional[float] = None
        self.sent_at = now  # when last written to a connection
        self.sent = False  # written to a connection at least once


class _AsyncSidecar:
    """The asyncio transport: pipelined requests matched by id, resent in order after a reconnect."""

    def __init__(self, address: str, *, token=None, reconnect_timeout_s=30.0, timeout_s=60.0,
                 connect_timeout_s=DEFAULT_CONNECT_TIMEOUT_S):
        self.address = address
        self.token = token if token is not None else os.environ.get("TRACEDB_TOKEN")
        self.connect_timeout_s = connect_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.timeout_s = timeout_s
        self.pending: dict[int, _Pending] = {}  # insertion order is send order
        self.next_id = 0
        self.reconnects = 0
        self.max_frame_bytes = P.DEFAULT_MAX_FRAME_BYTES
        self._writer: Optional[asyncio.StreamWriter] = None
        self._reader_task: Optional[asyncio.Task] = None
        self._connecting: Optional[asyncio.Task] = None
        self._closed = False
        self._watchdog: Optional[asyncio.TimerHandle] = None
        self._outbox: list[_Pending] = []  # submitted, written by the next `_flush`

    async def connect(self) -> None:
        """Connect (retrying until `connect_timeout_s`: a recorder that was never reachable fails
        fast) and say hello."""
        await self._reconnect(time.monotonic() + self.connect_timeout_s, initial=True)

    async def open(self):
        """A new connection's (reader, writer)."""
        kind, where = parse_address(self.address)
        limit = 1 << 30  # responses (a `get` of a big record) may be long lines
        if kind == "unix":
            return await asyncio.open_unix_connection(where, limit=limit)
        reader, writer = await asyncio.open_connection(where[0], where[1], limit=limit)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    async def _reconnect(self, deadline: float, initial: bool = False) -> None:
        backoff = Backoff(deadline=deadline)
        last: Optional[BaseException] = None
        attempt_timeout_s = min(self.timeout_s, self.connect_timeout_s) if initial else self.timeout_s
        while not self._closed:
            writer = None
            try:
                reader, writer = await asyncio.wait_for(self.open(), timeout=attempt_timeout_s)
                self.next_id += 1
                hello = {"id": self.next_id, "op": "hello", "client": "tracedb-py-async"}
                if self.token:
                    hello["token"] = self.token
                writer.write(orjson.dumps(hello, option=_OPT))
                line = await asyncio.wait_for(reader.readline(), timeout=attempt_timeout_s)
                if not line:
                    raise ConnectionResetError("the server closed the connection")
                resp = orjson.loads(line)
                if not resp.get("ok"):
                    writer.close()
                    err = resp.get("error") or {}
                    if err.get("code") in RETRYABLE:
                        raise ConnectionRefusedError(err.get("message"))
                    refused = error_from_wire(err)  # unauthorized: waiting will not help
                    self._fail_all(refused)
                    raise refused
                self.max_frame_bytes = resp["limits"]["max_frame_bytes"]
                self._writer = writer
                self._reader_task = asyncio.get_running_loop().create_task(self._read(reader, writer))
                if not initial:
                    self.reconnects += 1
                # Resend, in order, everything not yet answered: the server recognises repeats.
                # Not what it could not recognise, nor a frame over the server's limit now.
                now = time.monotonic()
                for p in list(self.pending.values()):
                    if p.sent and not p.resend_safe:
                        self._fail_one(p, _outcome_unknown(self.address, p.op, p.execution_id, "connection lost"))
                    elif len(p.frame) > self.max_frame_bytes:
                        self._fail_one(p, _frame_too_large(
                            len(p.frame), self.max_frame_bytes, " (the recorder restarted with a lower one)"
                        ))
                    else:
                        p.sent_at = now
                        p.sent = True
                        writer.write(p.frame)
                return
            except asyncio.CancelledError:
                if writer is not None and self._writer is not writer:
                    writer.close()
                raise
            except (OSError, ValueError, asyncio.TimeoutError) as e:
                last = e
            delay = backoff.next_delay()
            if delay is None:
                err = _unreachable(self.address, last)
                self._fail_all(err)
                raise err
            await asyncio.sleep(delay)

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            rest = b""
            while True:
                # Whatever has arrived, cut into lines here: a batch's answers come in one read.
                chunk = await reader.read(1 << 18)
                if not chunk:
                    break
                if rest:
                    chunk = rest + chunk
                end = chunk.rfind(b"\n")
                if end < 0:
                    if len(chunk) > _MAX_RESPONSE_BYTES:
                        raise ValueError("a response line longer than 1 GiB")
                    rest = chunk
                    continue
                rest = chunk[end + 1:]
                loads = orjson.loads
                for line in chunk[:end].split(b"\n"):
                    resp = loads(line)
                    # The common answer, inline: a success for a request still pending.
                    p = self.pending.get(resp.get("id")) if resp.get("ok") is True else None
                    if p is None:
                        self._answer(resp)
                        continue
                    del self.pending[p.rid]
                    if not p.future.done():
                        p.future.set_result(resp)
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
                if not self._closed and self.pending:
                    self._start_reconnect()

    def _answer(self, resp: dict) -> None:
        """One response: resolve (or fail, or schedule the resend of) its request."""
        p = self.pending.get(resp.get("id"))
        if p is None:
            if resp.get("id") is None and not resp.get("ok"):
                # A frame the server could not read an id from: none this client sends.
                log.warning("tracedb: the recorder at %s answered an unreadable request: %s",
                            self.address, resp.get("error"))
            return  # an answer to a request answered before (resent twice)
        if resp.get("ok"):
            del self.pending[p.rid]
            if not p.future.done():
                p.future.set_result(resp)
            return
        err = resp.get("error") or {}
        if err.get("code") in RETRYABLE:
            now = time.monotonic()
            p.deadline = p.deadline or now + self.reconnect_timeout_s
            if now < p.deadline:
                # Left pending: resent after a pause, or with the rest after a reconnect.
                asyncio.get_running_loop().call_later(0.05, self._resend, p)
                return
        del self.pending[p.rid]
        if not p.future.done():
            p.future.set_exception(error_from_wire(err, p.execution_id))

    def _resend(self, p: _Pending) -> None:
        if self.pending.get(p.rid) is p and self._writer is not None:
            p.sent_at = time.monotonic()
            self._writer.write(p.frame)

    def _arm_watchdog(self, delay: Optional[float] = None) -> None:
        if self._watchdog is None and not self._closed:
            tick = self.timeout_s / 4 if delay is None else max(0.01, min(delay, self.timeout_s / 4))
            self._watchdog = asyncio.get_running_loop().call_later(tick, self._watch)

    def _watch(self) -> None:
        """A connection on which a request went unanswered for `timeout_s` is taken for dead,
        as the sync client's socket timeout does: closed, reconnected, everything resent. A
        request still unanswered `reconnect_timeout_s` after that fails with
        RecorderUnavailableError, resent or not: a request never waits much past
        `timeout_s + reconnect_timeout_s`."""
        self._watchdog = None
        if self._closed or not self.pending:
            return
        now = time.monotonic()
        reconnect = False
        for p in list(self.pending.values()):
            if p.deadline is not None and now >= p.deadline:
                self._fail_one(p, RecorderUnavailableError(
                    f"no answer from the recorder at {self.address} within "
                    f"{self.timeout_s:g} s, nor after reconnecting for {self.reconnect_timeout_s:g} s",
                    hint="the recorder may be stuck on its disk: check `tracedb serve`'s log and /health",
                ))
            elif now - p.sent_at >= self.timeout_s:
                reconnect = True
                if p.deadline is None:
                    p.deadline = now + self.reconnect_timeout_s
        if reconnect and self._writer is not None:
            log.warning(
                "tracedb: no answer from the recorder at %s for %g s; reconnecting",
                self.address, self.timeout_s,
            )
            self._writer.transport.abort()  # the reader sees the end and reconnects
        deadlines = [p.deadline for p in self.pending.values() if p.deadline is not None]
        self._arm_watchdog(min(deadlines) - now if deadlines else None)

    def recorder_back(self) -> None:
        """A fail-open client's probe got an answer: a reconnect begun while the recorder was
        down starts over, with a deadline of its own, so that it does not fail requests sent now."""
        task = self._connecting
        if task is not None and not task.done():
            task.cancel()
            self._connecting = None
            if self.pending:
                self._start_reconnect()

    def _start_reconnect(self) -> None:
        if self._connecting is None or self._connecting.done():
            deadline = time.monotonic() + self.reconnect_timeout_s
            task = asyncio.get_running_loop().create_task(self._reconnect(deadline))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._connecting = task

    def _fail_one(self, p: _Pending, err: BaseException) -> None:
        del self.pending[p.rid]
        if not p.future.done():
            p.future.set_exception(err)

    def _fail_all(self, err: BaseException) -> None:
        pending, self.pending = self.pending, {}
        for p in pending.values():
            if not p.future.done():
                p.future.set_exception(err)

    def submit(self, req: dict, execution_id: Optional[str] = None) -> asyncio.Future:
        """Send one request now (in call order); the future resolves to its success fields."""
        if self._closed:
            raise RecorderUnavailableError("the client is closed")
        self.next_id += 1
        rid = req["id"] = self.next_id
        frame = _encode(req, self.max_frame_bytes)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        op = req["op"]
        # `_resend_safe`, inline: the hot path's events always carry their seq.
        safe = (op != "event" and op != "finish") or req.get("seq") is not None
        p = self.pending[rid] = _Pending(rid, op, safe, frame, fut, execution_id, time.monotonic())
        if self._writer is not None:
            # Frames sent in one turn of the loop leave in one write: one system call for all
            # of them, and the server reads them as one batch.
            out = self._outbox
            out.append(p)
            if len(out) == 1:
                loop.call_soon(self._flush)
        else:
            self._start_reconnect()  # sent with the rest once connected
        if self._watchdog is None:
            self._arm_watchdog()
        return fut

    def _flush(self) -> None:
        """Write the frames submitted since the last flush, in order; those a reconnect has
        sent meanwhile (or answered, or failed) are not written again."""
        out, self._outbox = self._outbox, []
        writer = self._writer
        if writer is None:
            return  # the reconnect sends what is still pending
        pending = self.pending
        frames = []
        for p in out:
            if not p.sent and pending.get(p.rid) is p:
                p.sent = True
                frames.append(p.frame)
        if frames:
            writer.write(frames[0] if len(frames) == 1 else b"".join(frames))

    async def request(self, req: dict, execution_id: Optional[str] = None) -> dict:
        """Send one request and await its success fields (or the mapped error)."""
        return await self.submit(req, execution_id)

    async def close(self) -> None:
        """Close the connection; requests still unanswered fail with RecorderUnavailableError."""
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._connecting is not None:
            self._connecting.cancel()
        if self._writer is not None:
            self._flush()  # what was submitted is sent, as it was before this call
            w, self._writer = self._writer, None
            w.close()
            try:
                await w.wait_closed()
            except OSError:
                pass
        if self._reader_task is not None:
            try:
                await self._reader_task
            except Exception:  # noqa: BLE001 - closing
                pass
        self._fail_all(RecorderUnavailableError("the client was closed with requests unanswered"))


class AsyncExecution(handles.AsyncExecution):
    """One execution being recorded (asyncio). Obtained from `AsyncClient.start`.

    `event` and `finish` send their request at call time, in call order, and return an awaitable
    of the seq: calls may be pipelined (`asyncio.gather(ex.event(...), ex.event(...))`).
    """

    def __init__(self, client: "AsyncClient", execution_id: str, envelope_hash: str, next_seq: int = 1):
        super().__init__(client, execution_id, envelope_hash)
        self._next_seq = next_seq
        self._sender: AsyncRecorder = client._recorder

    def event(self, type: str, payload: Any = None) -> Awaitable[Optional[int]]:
        """Record one event (sent now); await it for its seq, which comes once it is durable
        (None: not recorded, the client fails open and the recorder is unreachable)."""
        return self._sender.send_event(self.execution_id, type, payload, self._take(), self)

    def finish(self, response: dict) -> Awaitable[Optional[int]]:
        """Record the final response (FINAL_RESPONSE, sent now); await it for its seq (None as
        for `event`)."""
        return self._sender.send_finish(self.execution_id, response, self._take(), self)

    @property
    def last_seq(self) -> int:
        """The seq of the last event sent through this handle (0 before the first)."""
        return self._next_seq - 1

    def _take(self) -> Optional[int]:
        if self._sender.embedded:
            return None
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def _rewind(self, seq: int) -> None:
        """The request sent with `seq` failed: later calls reuse that seq. Requests already sent
        behind the failed one fail with seq_conflict and rewind to the same point."""
        self._next_seq = min(self._next_seq, seq)

    def _resync(self, next_seq: int) -> None:
        """The recorder's next seq for this execution, learnt after records were dropped."""
        self._next_seq = next_seq


class _FailOpen:
    """The awaitable of a request sent by a fail-open client: resolves to the seq, or to None
    when the recorder turned out to be unreachable (the record was counted as dropped when its
    request failed, awaited or not)."""

    __slots__ = ("_aw",)

    def __init__(self, aw):
        self._aw = aw

    def __await__(self):
        try:
            return (yield from self._aw.__await__())
        except RecorderUnavailableError:
            return None


class _SeqAwaitable:
    """The awaitable of a sent event: resolves to its seq; on failure rewinds the execution's
    seq counter to the seq it was sent with."""

    __slots__ = ("_fut", "_seq", "_execution")

    def __init__(self, fut: asyncio.Future, seq: Optional[int], execution: Optional[AsyncExecution]):
        self._fut = fut
        self._seq = seq
        self._execution = execution

    def __await__(self):
        try:
            resp = yield from self._fut.__await__()
        except E.TraceDBError:
            if self._execution is not None and self._seq is not None:
                self._execution._rewind(self._seq)
            raise
        return resp["seq"]


class AsyncRecorder(Protocol):
    """What an `AsyncClient` records through, chosen once at `connect_async()`: `Recorder`,
    awaited, except that `send_event` and `send_finish` send at call time and return an
    awaitable of the seq (so that calls can be pipelined); `execution` is the handle whose seq
    counter a failed send rewinds."""

    address: Optional[str]
    embedded: bool

    async def start(self, intent: str, envelope: dict, execution_id: Optional[str],
                    parent_execution_id: Optional[str], forked_at_seq: Optional[int]) -> tuple[str, str, int]: ...

    def send_event(self, execution_id: str, type: str, payload: Any, seq: Optional[int],
                   execution: Optional["AsyncExecution"]) -> Awaitable[Optional[int]]: ...

    def send_finish(self, execution_id: str, response: dict, seq: Optional[int],
                    execution: Optional["AsyncExecution"]) -> Awaitable[Optional[int]]: ...

    async def change(self, op: str, execution_id: str, text: str) -> None: ...

    async def get(self, execution_id: str) -> ExecutionRecord: ...

    async def ping(self) -> bool: ...

    def outage_stats(self) -> dict: ...

    async def close(self) -> None: ...


class _AsyncEmbedded:
    """Records in-process, into the embedded store's asyncio twin (`tracedb.open_async`)."""

    address = None
    embedded = True

    def __init__(self, astore):
        self.astore = astore

    async def start(self, intent, envelope, execution_id, parent_execution_id, forked_at_seq):
        ex = await self.astore.start(intent, envelope, execution_id,
                                     parent_execution_id=parent_execution_id, forked_at_seq=forked_at_seq)
        return ex.execution_id, ex.envelope_hash, 1

    def send_event(self, execution_id, type, payload, seq, execution):
        # A task starts in creation order: call order is kept in-process too.
        return asyncio.ensure_future(self.astore.event(execution_id, type, payload))

    def send_finish(self, execution_id, response, seq, execution):
        return asyncio.ensure_future(self.astore.finish(execution_id, response))

    async def change(self, op, execution_id, text):
        await getattr(self.astore, _CHANGES[op][1])(execution_id, text)

    async def get(self, execution_id):
        return await self.astore.get(execution_id)

    async def ping(self):
        return True

    def outage_stats(self):
        return dict(NO_OUTAGE)

    async def close(self):
        await self.astore.close()


class _AsyncViaSidecar:
    """Records through a sidecar (`tracedb serve`), pipelined, under the outage policy."""

    embedded = False

    def __init__(self, plan: _Plan):
        self.address = plan.address
        # Executions' exchanges with the recorder take turns on the loop, not on threads.
        self.outage: Optional[Outage] = Outage(plan.address, new_lock=asyncio.Lock) if plan.fail_open else None
        self.outage_timeout_s = plan.outage_timeout_s
        self.prober: Optional[asyncio.Task] = None
        self.closing = False
        self.remote = _AsyncSidecar(plan.address, **plan.transport())

    async def connect(self) -> None:
        """Connect now: a recorder that never answers fails this, unless the client fails open."""
        try:
            await self.remote.connect()
        except RecorderUnavailableError as e:
            if self.outage is None:
                raise
            self._failed(e)

    async def start(self, intent, envelope, execution_id, parent_execution_id, forked_at_seq):
        execution_id = new_execution_id() if execution_id is None else execution_id
        req = _request_start(None, intent, envelope, execution_id, parent_execution_id, forked_at_seq)
        resp = await self._write(req, execution_id)
        if resp is None:  # dropped (fail open)
            return execution_id, compute_envelope_hash(envelope), 1
        return resp["execution_id"], resp["envelope_hash"], resp.get("last_seq", 0) + 1

    def send_event(self, execution_id, type, payload, seq, execution):
        return self._submit_seq(_request_event(execution_id, type, payload, seq), execution_id, seq, execution)

    def send_finish(self, execution_id, response, seq, execution):
        return self._submit_seq(_request_finish(execution_id, response, seq), execution_id, seq, execution)

    async def change(self, op, execution_id, text):
        await self._write(_request_change(op, execution_id, text), execution_id)

    async def get(self, execution_id):
        resp = await self.remote.request({"id": None, "op": "get", "execution_id": execution_id}, execution_id)
        return ExecutionRecord.from_dict(resp["record"])

    async def ping(self):
        return bool((await self.remote.request({"id": None, "op": "ping"})).get("ok"))

    def outage_stats(self):
        return dict(NO_OUTAGE) if self.outage is None else self.outage.stats()

    async def _write(self, req: dict, execution_id: Optional[str], seq: Optional[int] = None,
                     execution: Optional[AsyncExecution] = None) -> Optional[dict]:
        """`_ViaSidecar._write`, awaited: the response, or None if the record was dropped."""
        o = self.outage
        if o is None:
            return await self.remote.request(req, execution_id)
        resp = DROPPED
        if not o.down:
            x = o.lost.get(execution_id) if execution_id is not None else None
            try:
                if x is None:
                    return await self.remote.request(req, execution_id)
                async with x.lock:
                    resp = await arun_steps(o.send(x, req), lambda r: self.remote.request(r, execution_id))
            except RecorderUnavailableError as e:
                self._failed(e)
                resp = DROPPED
        if resp is DROPPED:
            o.drop(execution_id, req)
            if execution is not None and seq is not None:
                execution._rewind(seq)
            return None
        if execution is not None and resp.get("seq") is not None:
            execution._resync(resp["seq"] + 1)
        return resp

    def _submit_seq(self, req: dict, execution_id: str, seq: Optional[int], execution):
        o = self.outage
        if o is not None and (o.down or execution_id in o.lost):
            # Fail open, with the recorder down or an execution that lost records: the slow
            # path, in a task (tasks start in call order).
            return asyncio.ensure_future(self._seq_of(self._write(req, execution_id, seq, execution)))
        try:
            fut = self.remote.submit(req, execution_id)
        except E.TraceDBError:
            if execution is not None and seq is not None:
                execution._rewind(seq)  # never sent: its seq is free again
            raise
        aw = _SeqAwaitable(fut, seq, execution)
        if o is None:
            return aw
        fut.add_done_callback(functools.partial(self._dropped_if_unavailable, req, execution_id, seq, execution))
        return _FailOpen(aw)

    @staticmethod
    async def _seq_of(write) -> Optional[int]:
        resp = await write
        return None if resp is None else resp["seq"]

    def _dropped_if_unavailable(self, req: dict, execution_id: str, seq: Optional[int], execution, fut) -> None:
        """Done callback of a fail-open request sent on the fast path: a request the recorder did
        not answer in time is a dropped record, counted as its request fails (in send order)."""
        if fut.cancelled():
            return
        e = fut.exception()
        if isinstance(e, RecorderUnavailableError):
            self._failed(e)
            self.outage.drop(execution_id, req)
            if execution is not None and seq is not None:
                execution._rewind(seq)

    # -- the outage prober (a task while the recorder is down) ------------------------------

    def _failed(self, cause: BaseException) -> None:
        if self.outage.failed(cause) and not self.closing:
            self.prober = asyncio.get_running_loop().create_task(self._probe())

    async def _probe(self) -> None:
        """As `_ViaSidecar._probe`, on the loop; executions are told about concurrently."""
        o = self.outage
        try:
            while not self.closing:
                if o.down:
                    if not await self._answers():
                        await asyncio.sleep(PROBE_INTERVAL_S)
                        continue
                    self.remote.recorder_back()
                    o.recovered()
                try:
                    await asyncio.gather(*(self._tell(x) for x in o.untold()))
                except RecorderUnavailableError as e:
                    o.failed(e)
                    continue
                if o.prober_done():
                    return
        except asyncio.CancelledError:
            pass
        except Exception:  # noqa: BLE001 - the agent goes on; the next failure starts a prober
            log.exception("tracedb: the outage prober stopped")
        o.prober_stopped()

    async def _tell(self, x) -> None:
        async with x.lock:
            if x.untold:
                await arun_steps(self.outage.tell(x), lambda r: self.remote.request(r, x.execution_id))

    async def _answers(self) -> bool:
        """As `_ViaSidecar._answers`."""
        remote = self.remote
        writer = None
        try:
            reader, writer = await asyncio.wait_for(remote.open(), timeout=PROBE_WAIT_S)
            for req in _probe_requests(remote.token, self.outage, "tracedb-py-async-probe"):
                writer.write(orjson.dumps(req, option=_OPT))
            deadline = time.monotonic() + PROBE_WAIT_S
            while True:
                line = await asyncio.wait_for(reader.readline(), timeout=max(0.01, deadline - time.monotonic()))
                if not line:
                    return False
                resp = orjson.loads(line)
                if not resp.get("ok") and (resp.get("error") or {}).get("code") in RETRYABLE:
                    return False
                if resp.get("id") == 2:
                    return True
                if not resp.get("ok"):
                    return False
        except (OSError, ValueError, asyncio.TimeoutError):
            return False
        finally:
            if writer is not None:
                writer.close()

    async def close(self) -> None:
        prober = self.prober
        if prober is not None:
            deadline = time.monotonic() + self.outage_timeout_s
            while not prober.done() and not (self.outage.down and time.monotonic() >= deadline):
                await asyncio.wait([prober], timeout=PROBE_INTERVAL_S)
            self.closing = True
            prober.cancel()
            await asyncio.gather(prober, return_exceptions=True)
        self.closing = True
        if self.outage is not None:
            _unflagged(self.outage)
        await self.remote.close()


class AsyncClient:
    """The asyncio twin of `Client`: the same names, parameters and results, awaited. Create with
    `await connect_async()`; where it records is chosen then, once."""

    def __init__(self, recorder: AsyncRecorder):
        self._recorder = recorder

    @classmethod
    async def create(
        cls,
        sidecar: Optional[str] = None,
        *,
        data_dir: Optional[str] = None,
        token: Optional[str] = None,
        timeout_s: float = 60.0,
        reconnect_timeout_s: float = 30.0,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        embedded: Optional[bool] = None,
        on_outage: Optional[str] = None,
        outage_timeout_s: float = DEFAULT_OUTAGE_TIMEOUT_S,
    ) -> "AsyncClient":
        """Connect (or open the embedded store); the arguments are `Client`'s."""
        plan = _plan(sidecar, data_dir, token, timeout_s, reconnect_timeout_s, connect_timeout_s, embedded,
                     on_outage, outage_timeout_s)
        if plan.address is None:
            return cls(_AsyncEmbedded(await tracedb.open_async(plan.data_dir)))
        recorder = _AsyncViaSidecar(plan)
        await recorder.connect()
        return cls(recorder)

    @property
    def address(self) -> Optional[str]:
        """The sidecar's address; None when recording in-process."""
        return self._recorder.address

    @property
    def embedded(self) -> bool:
        """True when recording in-process (no sidecar)."""
        return self._recorder.embedded

    def outage_stats(self) -> dict:
        """As `Client.outage_stats`."""
        return self._recorder.outage_stats()

    async def start(
        self,
        intent: str,
        envelope: dict,
        execution_id: Optional[str] = None,
        *,
        parent_execution_id: Optional[str] = None,
        forked_at_seq: Optional[int] = None,
    ) -> AsyncExecution:
        """Start recording an execution; returns once the start is durable."""
        eid, envelope_hash, next_seq = await self._recorder.start(
            intent, envelope, execution_id, parent_execution_id, forked_at_seq)
        return AsyncExecution(self, eid, envelope_hash, next_seq)

    def execution(self, execution_id: str, envelope_hash: str = "", next_seq: int = 1) -> AsyncExecution:
        """A handle on an execution started elsewhere."""
        return AsyncExecution(self, execution_id, envelope_hash, next_seq)

    async def event(self, execution_id: str, type: str, payload: Any = None, *,
                    seq: Optional[int] = None) -> Optional[int]:
        """As `Client.event`: its seq once durable, None when a fail-open client dropped it."""
        return await self._recorder.send_event(execution_id, type, payload, seq, None)

    async def finish(self, execution_id: str, response: dict, *, seq: Optional[int] = None) -> Optional[int]:
        """As `Client.finish`."""
        return await self._recorder.send_finish(execution_id, response, seq, None)

    async def invalidate(self, execution_id: str, reason: str) -> None:
        """Mark an execution manually invalidated (not replayable)."""
        await self._recorder.change("invalidate", execution_id, reason)

    async def abandon(self, execution_id: str, reason: str) -> None:
        """Mark a running execution incomplete because its agent died (see Client.abandon)."""
        await self._recorder.change("abandon", execution_id, reason)

    async def mark_recording_failure(self, execution_id: str, detail: str) -> None:
        """As `Client.mark_recording_failure`."""
        await self._recorder.change("recording_failure", execution_id, detail)

    async def get(self, execution_id: str) -> ExecutionRecord:
        """The execution's whole record."""
        return await self._recorder.get(execution_id)

    async def ping(self) -> bool:
        """True when the recorder answers."""
        return await self._recorder.ping()

    async def close(self) -> None:
        """Close the connection (or the embedded store); a fail-open client first finishes
        telling the recorder what was lost, as `Client.close`."""
        await self._recorder.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


async def connect_async(sidecar: Optional[str] = None, **kwargs) -> AsyncClient:
    """An asyncio recording client; see the module doc for where it records."""
    return await AsyncClient.create(sidecar, **kwargs)
