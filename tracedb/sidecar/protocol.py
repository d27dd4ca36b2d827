"""The sidecar's wire protocol: framing, request validation, response encoding.

Newline-delimited JSON over a stream socket; docs/protocol.md is the specification this module
implements (where they disagree, this module is wrong). Pure functions and small classes, no I/O,
so the server, the client and the tests share them.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import orjson

from tracedb.errors import InvalidInputError
from tracedb.records.validation import ID_LENGTH, INTENT_LENGTH, TYPE_LENGTH, validate_id_ref

PROTOCOL_VERSION = 1

# Limits, with the defaults documented in docs/protocol.md.
DEFAULT_MAX_FRAME_BYTES = 16 << 20
DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_MAX_INFLIGHT_REQUESTS = 1024
DEFAULT_MAX_INFLIGHT_BYTES = 64 << 20
# A connection whose first frame is not whole within this is closed: a peer that connects and
# says nothing (or trickles a line that never ends) holds no slot for long.
DEFAULT_FIRST_FRAME_TIMEOUT_S = 10.0
# A connection with nothing in flight that sends nothing for this long is closed; clients
# reconnect on their next request.
DEFAULT_CONNECTION_IDLE_TIMEOUT_S = 60.0
# The HTTP listeners (`serve --http-port` and `--otlp-port`, `tracedb ui`; tracedb.sidecar.asgi): their
# connections (an OTLP exporter keeps one per process), the time a request's headers have to
# arrive, and how long a kept-alive connection (or a request body that stopped) may idle.
DEFAULT_HTTP_MAX_CONNECTIONS = 64
DEFAULT_OTLP_MAX_CONNECTIONS = 128
DEFAULT_HTTP_HEADER_TIMEOUT_S = 10.0
DEFAULT_HTTP_IDLE_TIMEOUT_S = 15.0
# The WAL refuses payloads above 64 MiB; a frame must leave room for the record's framing.
MAX_FRAME_BYTES_LIMIT = 60 << 20

DEFAULT_SOCKET_NAME = "tracedb.sock"
DEFAULT_TCP_PORT = 7411

MAX_ID_CHARS = 256
# The store's own limits (tracedb.records.validation): a value the wire takes, the store takes.
MAX_EXECUTION_ID_CHARS = ID_LENGTH
MAX_TYPE_CHARS = TYPE_LENGTH
MAX_INTENT_CHARS = INTENT_LENGTH
MAX_REASON_CHARS = 4096

# Error codes: stable, documented, the only values of `error.code`.
BAD_JSON = "bad_json"
FRAME_TOO_LARGE = "frame_too_large"
BAD_REQUEST = "bad_request"
UNKNOWN_EXECUTION = "unknown_execution"
EXECUTION_CLOSED = "execution_closed"
EXECUTION_EXISTS = "execution_exists"
SEQ_CONFLICT = "seq_conflict"
UNAUTHORIZED = "unauthorized"
UNAVAILABLE = "unavailable"
OVERLOADED = "overloaded"
INTERNAL = "internal"
ERROR_CODES = (
    BAD_JSON,
    FRAME_TOO_LARGE,
    BAD_REQUEST,
    UNKNOWN_EXECUTION,
    EXECUTION_CLOSED,
    EXECUTION_EXISTS,
    SEQ_CONFLICT,
    UNAUTHORIZED,
    UNAVAILABLE,
    OVERLOADED,
    INTERNAL,
)

OPS = ("hello", "ping", "start", "event", "finish", "invalidate", "abandon", "recording_failure", "get")
WRITE_OPS = frozenset({"start", "event", "finish", "invalidate", "abandon", "recording_failure"})

_OPT = orjson.OPT_APPEND_NEWLINE


class ProtocolError(Exception):
    """A request the server answers with an error response; `code` is one of ERROR_CODES."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _bad(message: str) -> ProtocolError:
    return ProtocolError(BAD_REQUEST, message)


# A run of 19 or more digits: the only place an integer outside 64 bits can be, which orjson
# reads as a double without a word. Most frames have none, and skip the exact check below. The
# run is looked for as 19 zeros once every digit is written as a zero: two passes in C over the
# frame, several times faster than the regular expression's scan.
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19
INT_MIN = -(1 << 63)
INT_MAX = (1 << 64) - 1  # what orjson writes: the signed and the unsigned 64-bit ranges


def _int_in_range(text: str) -> int:
    n = int(text)
    if not INT_MIN <= n <= INT_MAX:
        raise _bad(f"integer {text[:24]}{'...' if len(text) > 24 else ''} is outside 64 bits: "
                   "it cannot be stored exactly (send it as a string)")
    return n


def check_integers(frame: bytes) -> None:
    """Refuse a frame with an integer outside 64 bits (ProtocolError, bad_request): orjson has
    read it as a double, which would be stored changed. Reads the frame again, exactly, only
    when it holds a long run of digits (in a number or inside a string)."""
    if _LONG_RUN in frame.translate(_DIGITS_AS_ZERO):
        json.loads(frame, parse_int=_int_in_range)


# -- responses -------------------------------------------------------------------------------


def encode_error(rid: Any, code: str, message: str) -> bytes:
    """One error response line: {"id": rid, "ok": false, "error": {"code", "message"}}."""
    return orjson.dumps(
        {"id": rid, "ok": False, "error": {"code": code, "message": message}}, option=_OPT
    )


# -- framing ---------------------------------------------------------------------------------


class FrameSplitter:
    """Cuts a byte stream into lines of at most `max_frame_bytes`, without copying it twice.

    `feed(data)` returns the complete frames (without their newline) and, for each line longer
    than the limit, the marker `FrameSplitter.TOO_LARGE` in its place; the bytes of an oversized
    line are dropped as they arrive (memory stays bounded) up to its newline, after which framing
    resumes. Empty lines are skipped.
    """

    TOO_LARGE = object()

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        self.max_frame_bytes = max_frame_bytes
        self._parts: list[bytes] = []  # the current, unterminated line
        self._partial = 0  # its length
        self._discarding = False  # inside an oversized line, dropping until its newline

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete frame held in memory."""
        return self._partial

    def feed(self, data: bytes) -> list:
        """Frames completed by `data`, in order (TOO_LARGE marks an oversized one)."""
        out: list = []
        start = 0
        n = len(data)
        limit = self.max_frame_bytes
        while start < n:
            nl = data.find(b"\n", start)
            if nl < 0:
                rest = n - start
                if self._discarding:
                    return out
                if self._partial + rest > limit:
                    self._parts.clear()
                    self._partial = 0
                    self._discarding = True
                    out.append(self.TOO_LARGE)
                    return out
                self._parts.append(data[start:] if start else data)
                self._partial += rest
                return out
            if self._discarding:
                self._discarding = False
            elif self._parts:
                self._parts.append(data[start:nl])
                size = self._partial + (nl - start)
                frame = b"".join(self._parts)
                self._parts.clear()
                self._partial = 0
                if size > limit:
                    out.append(self.TOO_LARGE)
                elif size and not frame.isspace():
                    out.append(frame)
            elif nl - start > limit:
                out.append(self.TOO_LARGE)
            elif nl > start:
                frame = data[start:nl]
                if not frame.isspace():
                    out.append(frame)
            start = nl + 1
        return out


# -- requests --------------------------------------------------------------------------------


def check_id(req: dict) -> Any:
    """The request's `id` (a string, an integer or null); ProtocolError if it is anything else."""
    rid = req.get("id")
    t = type(rid)
    if t is int or rid is None:
        return rid
    if t is str:
        if len(rid) > MAX_ID_CHARS:
            raise _bad(f"`id` is longer than {MAX_ID_CHARS} characters")
        return rid
    raise _bad("`id` must be a string, an integer or null")


def _field(req: dict, name: str, required: bool) -> Any:
    """A field of a request, None when it is absent (or null) and may be."""
    v = req.get(name)
    if v is None and required:
        raise _bad(f"`{name}` is required")
    return v


def req_str(req: dict, name: str, max_chars: int, *, required: bool = True) -> Optional[str]:
    """A string field of a request, checked for presence, type and length."""
    v = _field(req, name, required)
    if v is None:
        return None
    if type(v) is not str:
        raise _bad(f"`{name}` must be a string, got {_json_type(v)}")
    if not v:
        raise _bad(f"`{name}` must not be empty")
    if len(v) > max_chars:
        raise _bad(f"`{name}` is longer than {max_chars} characters")
    return v


def req_execution_id(req: dict, name: str = "execution_id", *, required: bool = True) -> Optional[str]:
    """An execution id field: a string that can name an execution (`validate_id_ref`). What a
    new execution's id must be beyond that (`tracedb.records.validation.validate_id`) the store checks
    as it checks an id given in-process: one rule, one message, on every way in."""
    v = req_str(req, name, MAX_EXECUTION_ID_CHARS, required=required)
    if v is not None:
        try:
            validate_id_ref(v, f"`{name}`")
        except InvalidInputError as e:
            raise _bad(e.message) from None
    return v


def req_object(req: dict, name: str, *, required: bool = True) -> Optional[dict]:
    """A JSON-object field of a request."""
    v = _field(req, name, required)
    if v is None:
        return None
    if type(v) is not dict:
        raise _bad(f"`{name}` must be a JSON object, got {_json_type(v)}")
    return v


def req_seq(req: dict, name: str = "seq", *, least: int = 1) -> Optional[int]:
    """An optional integer field of at least `least`: the expected seq of an event (>= 1), or
    the seq a fork starts after (>= 0: a fork at 0 keeps none of the parent's events)."""
    v = req.get(name)
    if v is None:
        return None
    if type(v) is not int or v < least:
        raise _bad(f"`{name}` must be a positive integer" if least == 1 else f"`{name}` must be an integer >= {least}")
    return v


def _json_type(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return "null"
