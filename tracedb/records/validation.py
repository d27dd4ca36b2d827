"""What the store accepts: event types, ids, intents, and the JSON encoding of caller values.

Every recording path (sync, asyncio, the sidecar's staged batches, OTLP ingest, imports) checks
through these functions, and the wire protocol's limits are these constants, so a value refused on
one path is refused on all of them, before anything is written (docs/values.md).
"""

from __future__ import annotations

import math
import re
import sqlite3
import threading
from typing import Any, Mapping, Optional

import orjson

from tracedb.errors import InvalidInputError
from tracedb.records.record import CALL_EVENT_TYPES, ROUTER_EVENT_TYPES

# Ids are caller-chosen strings, bounded so that PostgreSQL indexes stay small and a runaway id is
# refused at the API instead of in the database (the models declare the same lengths).
ID_LENGTH = 128
TYPE_LENGTH = 128
# The intent is a name (it is listed, filtered on and shown on every page), not a payload.
INTENT_LENGTH = 1024
# Containers inside containers, counting the value itself: orjson writes at most 254, and every
# client wraps a payload in its request once, so one level less is what every way in can carry.
MAX_DEPTH = 253

KNOWN_EVENT_TYPES = ROUTER_EVENT_TYPES | CALL_EVENT_TYPES
# Matched with fullmatch: `$` would also match before a trailing newline ("myapp.step\n").
NAMESPACED_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)+")
PRINTABLE_ID = re.compile(r"[\x21-\x7e]+")
# A new execution id: an id becomes a file name (`export -o DIR`, IntentusNet's <id>.json), a URL
# path and a log field, so it is one safe name: no "/", never "." or ".." or hidden, no "..".
NEW_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
ID_ALPHABET = "letters, digits and . _ : - (a letter or digit first, no '..')"

# Payloads and responses: datetimes and dataclasses go through `default` (str) like the envelope.
DUMP_OPTS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
# The envelope is hashed with json.dumps(default=str) (see record.compute_envelope_hash); it is
# stored the same way (datetimes as their str()), so that `verify` recomputes the same hash from
# the stored envelope. Keys must be strings, as in payloads: {1: "a"} would come back {"1": "a"}.
ENVELOPE_OPTS = DUMP_OPTS

_I64 = 1 << 63
_NOT_JSON_HINT = "pass dicts, lists, strings, numbers, booleans and None only"
_NONFINITE_HINT = (
    "record it as a string (\"NaN\", \"Infinity\") or as null yourself; tracedb stores only "
    "values it gives back exactly"
)


# Namespaced types already matched (exact str only), so that an application's own types are
# matched once, not at every event; bounded like any cache of caller-chosen strings.
_VALID_TYPES: set = set()
_VALID_TYPES_MAX = 4096


def check_event_type(type_: Any) -> None:
    """`validate_event_type` for the hot path: a known or already matched type costs one lookup."""
    if type(type_) is not str or (type_ not in KNOWN_EVENT_TYPES and type_ not in _VALID_TYPES):
        validate_event_type(type_)


def validate_event_type(type_: Any) -> str:
    """A router lifecycle type, an LLM/tool call type, or any namespaced type ("myapp.cache.hit")."""
    if not isinstance(type_, str):
        raise InvalidInputError(f"event type must be a string, not {type(type_).__name__}")
    if type_ in KNOWN_EVENT_TYPES:
        return type_
    if len(type_) <= TYPE_LENGTH and NAMESPACED_TYPE.fullmatch(type_):
        if type(type_) is str:
            if len(_VALID_TYPES) >= _VALID_TYPES_MAX:
                _VALID_TYPES.clear()
            _VALID_TYPES.add(type_)
        return type_
    raise InvalidInputError(
        f"unknown event type {type_!r}",
        hint="use one of " + ", ".join(sorted(KNOWN_EVENT_TYPES))
        + ", or a namespaced type such as 'myapp.cache.hit'",
    )


def is_new_id(value: Any) -> bool:
    """Whether `value` is an id a new execution may take: 1 to ID_LENGTH of `NEW_ID`'s
    characters, never "..", so that it is safe as a file name everywhere."""
    return (
        isinstance(value, str) and 0 < len(value) <= ID_LENGTH and NEW_ID.fullmatch(value) is not None
        and ".." not in value
    )


def validate_id(value: Any, name: str) -> str:
    """A new execution id (`is_new_id`); InvalidInputError naming `name` otherwise."""
    if not is_new_id(value):
        got = repr(value[:80] + "...") if isinstance(value, str) and len(value) > 80 else repr(value)[:100]
        raise InvalidInputError(
            f"{name} must be 1 to {ID_LENGTH} {ID_ALPHABET}, got {got}",
            hint="ids become file names and URL parts; tracedb makes one (exec-<uuid7>) when none is given",
        )
    return value


def validate_id_ref(value: Any, name: str) -> str:
    """An id that names an execution already recorded: any id ever accepted, those recorded
    under the looser rule of earlier versions included (1 to ID_LENGTH printable ASCII
    characters without spaces), so that they can still be read, closed and forked."""
    if not isinstance(value, str) or not value or len(value) > ID_LENGTH or not PRINTABLE_ID.fullmatch(value):
        raise InvalidInputError(
            f"{name} must be an execution id (1 to {ID_LENGTH} printable ASCII characters), got {value!r:.100}"
        )
    return value


def validate_intent(value: Any) -> str:
    """An intent: 1 to INTENT_LENGTH characters, no NUL (PostgreSQL's text cannot hold one),
    encodable as UTF-8 (no lone surrogates)."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"intent must be a non-empty string, got {value!r:.100}")
    if len(value) > INTENT_LENGTH:
        raise InvalidInputError(
            f"intent is {len(value)} characters long; at most {INTENT_LENGTH} are stored",
            hint="the intent names what the execution does; put the rest in the envelope",
        )
    if "\x00" in value or (not value.isascii() and not _utf8(value)):
        raise InvalidInputError(
            f"intent {value!r:.100} holds a NUL or a lone surrogate, which cannot be stored",
        )
    return value


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def validate_text(value: Any, name: str) -> str:
    """A non-empty string (a reason, a detail)."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{name} must be a non-empty string, got {value!r}")
    return value


def validate_meta(meta: Any) -> None:
    """A trace's `meta` (an importer's notes): None or a JSON object, checked as it is encoded."""
    if meta is not None and not isinstance(meta, dict):
        raise InvalidInputError(f"meta must be a JSON object (a dict), not {type(meta).__name__}")


def validate_response(response: Any) -> dict:
    """The final response: a mapping, copied."""
    if type(response) is not dict and not isinstance(response, Mapping):
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


def nonfinite_path(value: Any, path: str = "$") -> Optional[str]:
    """The path of the first NaN or infinity inside `value` (dicts, lists, tuples), else None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, dict):
        for k, v in value.items():
            found = nonfinite_path(v, f"{path}.{k}" if isinstance(k, str) else f"{path}[{k!r}]")
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = nonfinite_path(v, f"{path}[{i}]")
            if found is not None:
                return found
    return None


_SKIP = (str, int, bool, type(None))


def has_nonfinite(value: Any) -> bool:
    """Whether a NaN or an infinity is inside `value` (the quick test; `nonfinite_path` says where)."""
    t = type(value)
    if t is dict:
        items = value.values()
    elif t is list or t is tuple:
        items = value
    elif t is float:
        return value - value != 0.0  # nan - nan and inf - inf are nan
    elif isinstance(value, float):
        return not math.isfinite(value)
    elif isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return False
    for x in items:
        if type(x) in _SKIP:
            continue
        if has_nonfinite(x):
            return True
    return False


def check_finite(value: Any, what: str) -> None:
    """Refuse NaN and infinities: JSON has no such numbers, and orjson would write them as null,
    a value other than the one given. Refused, not stored altered."""
    if not has_nonfinite(value):
        return
    found = nonfinite_path(value)
    if found is not None:
        raise InvalidInputError(
            f"{what} holds a number JSON cannot represent (NaN or infinity) at {found}",
            hint=_NONFINITE_HINT,
        )


def dumps_checked(value: Any, what: str, opts: int = DUMP_OPTS, default=None) -> bytes:
    """`value`, which holds something the caller passed in, as JSON. It is parsed back once: an
    `orjson.Fragment` is written as it is, and one that is not JSON would leave the execution's
    record unreadable for good. NaN and infinities are refused (`check_finite`)."""
    return dumps_parsed(value, what, opts, default)[0]


def dumps_parsed(value: Any, what: str, opts: int = DUMP_OPTS, default=None) -> tuple[bytes, Any]:
    """`dumps_checked`, and the value parsed back from the JSON (plain dicts and lists, the
    contents of any `orjson.Fragment` included)."""
    out = dumps(value, what, opts, default)
    # orjson writes a non-finite float as null: only a document with a null can hold one.
    if b"null" in out:
        check_finite(value, what)
    try:
        return out, orjson.loads(out)
    except orjson.JSONDecodeError as e:
        raise InvalidInputError(
            f"{what} does not serialise to valid JSON ({e})",
            hint="an orjson.Fragment must hold valid JSON; pass plain values instead",
        ) from None


def dumps(value: Any, what: str, opts: int = DUMP_OPTS, default=None) -> bytes:
    """`value` as JSON; InvalidInputError naming `what` if it cannot be serialised."""
    try:
        return orjson.dumps(value, default=default, option=opts)
    except TypeError as e:
        if "Recursion limit" in str(e):
            raise InvalidInputError(
                f"{what} is nested deeper than {MAX_DEPTH} levels (or holds itself)",
                hint="flatten it, or record the deep part as a JSON string",
            ) from None
        raise InvalidInputError(f"{what} is not JSON-serialisable: {e}", hint=_NOT_JSON_HINT) from None


# A value nested MAX_DEPTH + 1 deep has that many opening brackets, two bytes each with their
# closing ones: shorter JSON text needs no count.
_DEEP_BYTES = 2 * (MAX_DEPTH + 1)


def check_depth(value: Any, text: bytes, what: str) -> None:
    """Refuse `value`, written alone as `text`, when it is nested deeper than MAX_DEPTH: orjson
    writes one level more, which a client wrapping it in a request could not send."""
    if len(text) >= _DEEP_BYTES and text.count(b"[") + text.count(b"{") > MAX_DEPTH:
        dumps((value,), what)


def check_bare_float(payload: float, type_: str) -> None:
    """A payload that is a bare float must come back from SQLite as itself. SQLite stores a JSON
    column's bare number by NUMERIC affinity: it turns 1.0, -0.0 and 1e16 into the integers 1,
    0 and 10000000000000000, and its own reading of the text is not correctly rounded for
    every float (3.611192091442987e-308 comes back one unit in the last place away)."""
    if payload.is_integer() and -_I64 <= payload < _I64:
        _refuse_bare(type_, f"float {payload!r}", "an integer")
    got = _sqlite_real(orjson.dumps(payload).decode())
    if got != payload:
        _refuse_bare(type_, f"float {payload!r}", repr(got))


# Each thread's in-memory SQLite connection for `_sqlite_real` (opening one costs ~20 µs).
_sqlite_of_thread = threading.local()


def _sqlite_real(text: str) -> float:
    """The float SQLite reads `text` as (NUMERIC affinity and CAST take the same path)."""
    conn = getattr(_sqlite_of_thread, "conn", None)
    if conn is None:
        conn = _sqlite_of_thread.conn = sqlite3.connect(":memory:")
    return conn.execute("SELECT CAST(? AS REAL)", (text,)).fetchone()[0]


def _refuse_bare(type_: str, shown: str, given_back: str) -> None:
    """Refuse a bare number payload (`shown`: "float 1.0", "number 1.50") the database would
    give back as `given_back`."""
    raise InvalidInputError(
        f"payload of event {type_!r} is the bare {shown}, which the database would give back as {given_back}",
        hint="wrap it in an object ({\"value\": ...}): inside an object it is kept exactly",
    )


def payload_json(payload: Any, type_: str) -> bytes:
    """An event's payload as the JSON text stored in its step, checked as every path checks it."""
    return payload_parsed(payload, type_)[0]


# The one value known to be a plain JSON tree already (dicts, lists, str, int, float, bool, None:
# just decoded from a request's JSON by orjson), which `payload_parsed` need not parse back.
_decoded: list = [None]


def set_decoded(value: Any) -> None:
    """Tell `payload_parsed` that `value` was just decoded from JSON text by orjson (the
    sidecar, around the staging of one request): its checks run on it as it is, without a
    second decoding.
    `set_decoded(None)` when done. Any other value (another thread's) is parsed back as ever."""
    _decoded[0] = value


def payload_parsed(payload: Any, type_: str) -> tuple[bytes, Any]:
    """`payload_json`, and the payload parsed back from that JSON (see `dumps_parsed`); a
    payload given to `set_decoded` is its own parse."""
    t = type(payload)
    if t is int:
        check_bare_int(payload, type_)  # before orjson, whose refusal of 2**64 says less
    what = _PAYLOAD_WHAT.get(type_)
    if what is None:
        what = _payload_what(type_)
    if payload is _decoded[0] and (t is dict or t is list):
        # orjson refuses NaN, infinities and numbers that read as one (1e999): a value it
        # decoded holds none, and needs no check_finite.
        out = (dumps(payload, what), payload)
    else:
        out = dumps_parsed(payload, what)  # a non-finite float is refused here, as such
        # A bare number is checked as it was parsed back: given as an int subclass (an
        # IntEnum's member) or as an orjson.Fragment's text, it is stored as that number.
        parsed = out[1]
        pt = type(parsed)
        if pt is int and t is not int:
            check_bare_int(parsed, type_)
        elif pt is float:
            check_bare_float(parsed, type_)
        if (pt is int or pt is float) and t is not pt:
            # SQLite keeps a bare number as the number, not as its text: "1.50" would read
            # back as 1.5, and an integer orjson reads as a float (2**64) as that float.
            canonical = orjson.dumps(parsed)
            if canonical != out[0]:
                _refuse_bare(type_, f"number {out[0].decode()}", canonical.decode())
    check_depth(payload, out[0], what)
    return out


def check_response(response: Any) -> None:
    """Refuse a final response the store could not record (as its record wraps it once)."""
    dumps_checked((response,), "final response")


# "payload of event 'llm.requested'", per event type: the description errors name, made once.
_PAYLOAD_WHAT: dict = {}


def _payload_what(type_: str) -> str:
    what = f"payload of event {type_!r}"
    if len(_PAYLOAD_WHAT) >= _VALID_TYPES_MAX:
        _PAYLOAD_WHAT.clear()
    _PAYLOAD_WHAT[type_] = what
    return what
