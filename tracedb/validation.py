"""What the store accepts: event types, ids, and the JSON encoding of caller values.

Every recording path (sync, asyncio, the sidecar's staged batches, imports) checks through these
functions, so a value refused on one path is refused on all of them, before anything is written.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import orjson

from .errors import InvalidInputError
from .record import CALL_EVENT_TYPES, ROUTER_EVENT_TYPES

# Ids are caller-chosen strings, bounded so that PostgreSQL indexes stay small and a runaway id is
# refused at the API instead of in the database (the models declare the same lengths).
ID_LENGTH = 128
TYPE_LENGTH = 128

KNOWN_EVENT_TYPES = ROUTER_EVENT_TYPES | CALL_EVENT_TYPES
NAMESPACED_TYPE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)+$")
PRINTABLE_ID = re.compile(r"^[\x21-\x7e]+$")

# Payloads and responses: datetimes and dataclasses go through `default` (str) like the envelope.
DUMP_OPTS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
# The envelope is hashed with json.dumps(default=str) (see record.compute_envelope_hash); it is
# stored the same way, so that `verify` recomputes the same hash from the stored envelope.
ENVELOPE_OPTS = DUMP_OPTS | orjson.OPT_NON_STR_KEYS

_I64 = 1 << 63
_NOT_JSON_HINT = "pass dicts, lists, strings, numbers, booleans and None only"


def validate_event_type(type_: Any) -> str:
    """A router lifecycle type, an LLM/tool call type, or any namespaced type ("myapp.cache.hit")."""
    if not isinstance(type_, str):
        raise InvalidInputError(f"event type must be a string, not {type(type_).__name__}")
    if type_ in KNOWN_EVENT_TYPES:
        return type_
    if len(type_) <= TYPE_LENGTH and NAMESPACED_TYPE.match(type_):
        return type_
    raise InvalidInputError(
        f"unknown event type {type_!r}",
        hint="use one of " + ", ".join(sorted(KNOWN_EVENT_TYPES))
        + ", or a namespaced type such as 'myapp.cache.hit'",
    )


def validate_id(value: Any, name: str) -> str:
    """An execution id: 1 to ID_LENGTH printable ASCII characters without spaces."""
    if not isinstance(value, str) or not value or len(value) > ID_LENGTH or not PRINTABLE_ID.match(value):
        raise InvalidInputError(
            f"{name} must be 1 to {ID_LENGTH} printable ASCII characters without spaces, got {value!r}"
        )
    return value


def validate_text(value: Any, name: str) -> str:
    """A non-empty string (a reason, a detail)."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{name} must be a non-empty string, got {value!r}")
    return value


def validate_response(response: Any) -> dict:
    """The final response: a mapping, copied."""
    if not isinstance(response, Mapping):
        raise InvalidInputError(
            f"the final response must be a dict, not {type(response).__name__}",
            hint='for example {"status": "success", "payload": {...}}',
        )
    return dict(response)


def check_bare_int(payload: int, type_: str) -> None:
    """A payload that is a bare integer must fit in 64 signed bits: SQLite stores a JSON column's
    bare number as a number (NUMERIC affinity), and one above 2**63 - 1 as an inexact REAL."""
    if not -_I64 <= payload < _I64:
        raise InvalidInputError(
            f"payload of event {type_!r} is the bare integer {payload}, outside the 64-bit signed range",
            hint="wrap it in an object ({\"value\": ...}) or a string: inside an object it is kept exactly",
        )


def dumps_checked(value: Any, what: str, opts: int = DUMP_OPTS, default=None) -> bytes:
    """`value`, which holds something the caller passed in, as JSON. It is parsed back once: an
    `orjson.Fragment` is written as it is, and one that is not JSON would leave the execution's
    record unreadable for good."""
    out = dumps(value, what, opts, default)
    try:
        orjson.loads(out)
    except orjson.JSONDecodeError as e:
        raise InvalidInputError(
            f"{what} does not serialise to valid JSON ({e})",
            hint="an orjson.Fragment must hold valid JSON; pass plain values instead",
        ) from None
    return out


def dumps(value: Any, what: str, opts: int = DUMP_OPTS, default=None) -> bytes:
    """`value` as JSON; InvalidInputError naming `what` if it cannot be serialised."""
    try:
        return orjson.dumps(value, default=default, option=opts)
    except TypeError as e:
        raise InvalidInputError(f"{what} is not JSON-serialisable: {e}", hint=_NOT_JSON_HINT) from None


def payload_json(payload: Any, type_: str) -> bytes:
    """An event's payload as the JSON text stored in its step, checked as every path checks it."""
    if type(payload) is int:
        check_bare_int(payload, type_)
    return dumps_checked(payload, f"payload of event {type_!r}")
