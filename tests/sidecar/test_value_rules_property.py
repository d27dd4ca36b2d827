"""One set of value rules: the same generated values (ids, intents, event types, envelopes,
payloads, final responses, with odd ones among them: deep nesting, huge integers, NaN and
infinities, lone surrogates, keys that are not strings, long strings) sent through every way in
get the same answer, accepted or refused:

- the embedded store (`tracedb.open`), the reference;
- the asyncio store (`tracedb.open_async`);
- the sync client and the asyncio client, each against a real `tracedb serve` process;
- OTLP/JSON into `tracedb serve --otlp-port`, for what a span can carry (a service name as the
  intent, an attribute as a payload value, a resource attribute as an envelope value);
- IntentusNet import (`write_record`, what `tracedb import intentusnet` runs), for what a
  record can carry.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import tracedb
from tests.otel.conftest import OtlpServe
from tracedb.errors import IntegrityError, InvalidInputError
from tracedb.interop.intentusnet import write_record
from tracedb.sidecar.client import SidecarError

from tests.serving import Serve
from .helpers import rmtree, short_tempdir

pytestmark = pytest.mark.timeout(900)

SETTINGS = {"compact_interval_ms": 0, "idle_timeout_s": 0}
ENV = {"intent": "I", "payload": {}}
OK, REFUSED = "accepted", "refused"
_n = itertools.count()


def nest(depth: int, leaf=1):
    v = leaf
    for _ in range(depth):
        v = [v]
    return v


def depth_of(v) -> int:
    """How many containers deep `v` is (without recursion: values may be deeper than Python's stack)."""
    deepest, todo = 0, [(v, 0)]
    while todo:
        x, d = todo.pop()
        if isinstance(x, dict):
            todo.extend((y, d + 1) for y in x.values())
        elif isinstance(x, (list, tuple)):
            todo.extend((y, d + 1) for y in x)
        else:
            deepest = max(deepest, d)
            continue
        deepest = max(deepest, d + 1)
    return deepest


# -- the values ---------------------------------------------------------------------------------

SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udc80"])
LEAVES = st.one_of(
    st.none(), st.booleans(),
    st.integers(-(2**70), 2**70), st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), SURROGATES, st.sampled_from(["", "\x00", "null", "NaN"]),
    st.integers(0, 300_000).map(lambda n: "x" * n),
)
KEYS = st.one_of(st.text(max_size=6), st.integers(-3, 3), st.sampled_from(["\ud800", "", "a.b"]))
JSONISH = st.recursive(
    LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=12,
)


class Deep:
    """`depth` lists around `leaf`, made when the example runs (and shown short when it fails)."""

    def __init__(self, depth: int, leaf, wrapped: bool = False):
        self.depth, self.leaf, self.wrapped = depth, leaf, wrapped

    def __repr__(self) -> str:
        inner = f"nest({self.depth}, {self.leaf!r})"
        return f"{{'v': {inner}}}" if self.wrapped else inner

    def value(self):
        v = nest(self.depth, self.leaf)
        return {"v": v} if self.wrapped else v


DEPTHS = st.one_of(st.sampled_from([251, 252, 253, 254, 255, 256, 300, 1100]), st.integers(1, 400))
DEEP_LEAVES = st.sampled_from([1, "x", None, float("nan")])
DEEP = st.builds(Deep, DEPTHS, DEEP_LEAVES)
PAYLOADS = st.one_of(JSONISH, DEEP)
OBJECTS = st.one_of(st.dictionaries(KEYS, JSONISH, max_size=4), st.builds(Deep, DEPTHS, DEEP_LEAVES, st.just(True)),
                    PAYLOADS)

PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7f))
IDS = st.one_of(
    st.text(alphabet=PRINTABLE, min_size=0, max_size=140),
    st.text(alphabet="abcXYZ019._:-", min_size=1, max_size=130),
    st.sampled_from(["a#b", "!x", "x~y", "../../pwn1", "a/b", "..", ".hidden", "a..b", "a.b", "exec-1",
                     "x" * 128, "x" * 129, "é", "a\x00b", "id\n", "\ud800", "team@x", "-x"]),
    st.integers(), st.none().map(lambda _: ["not", "a", "string"]),
)
INTENTS = st.one_of(
    st.text(max_size=40), SURROGATES,
    st.integers(1020, 1030).map(lambda n: "i" * n), st.integers(0, 3000).map(lambda n: "é" * n),
    st.sampled_from(["", "\x00", "a\x00b", "unknown_service:x", " ", "\n"]), st.integers(), st.none(),
)
TYPES = st.one_of(
    st.sampled_from(["INTENT_RECEIVED", "FINAL_RESPONSE", "tool.requested", "llm.responded", "myapp.x",
                     "myapp.step\n", "a.b", "1a.b", "a.", ".a", "a..b", "a.b-c_d", "bare", "", "\x00.x"]),
    st.builds(lambda n: "a." + "b" * n, st.integers(120, 130)),
    st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,8}(\.[A-Za-z0-9_-]{1,8}){1,3}", fullmatch=True),
    st.text(max_size=20), st.integers(), st.none(),
)
CASES = st.one_of(
    st.tuples(st.just("id"), IDS),
    st.tuples(st.just("intent"), INTENTS),
    st.tuples(st.just("type"), TYPES),
    st.tuples(st.just("payload"), PAYLOADS),
    st.tuples(st.just("envelope"), OBJECTS),
    st.tuples(st.just("response"), OBJECTS),
)


# -- the ways in --------------------------------------------------------------------------------

REFUSALS = (InvalidInputError, IntegrityError)


def _refused(e: Exception) -> str:
    """REFUSED for an error that refuses the value (the store's, or the sidecar's answer to a bad
    request); any other error is raised again."""
    if isinstance(e, REFUSALS) or (isinstance(e, SidecarError) and e.code in ("bad_request", "frame_too_large")):
        return REFUSED
    raise e


def _answer(call) -> str:
    try:
        call()
    except Exception as e:
        return _refused(e)
    return OK


async def _answer_async(call) -> str:
    try:
        await call()
    except Exception as e:
        return _refused(e)
    return OK


def sync_case(rec, kind: str, value, eid: str) -> str:
    """The answer of a sync recorder (a Store or a Client) to one case."""
    if kind == "id":
        return _answer(lambda: rec.start("I", ENV, value))
    if kind == "intent":
        return _answer(lambda: rec.start(value, ENV, eid))
    if kind == "envelope":
        return _answer(lambda: rec.start("I", value, eid))
    ex = rec.start("I", ENV, eid)
    if kind == "type":
        return _answer(lambda: ex.event(value, {"n": 1}))
    if kind == "payload":
        return _answer(lambda: ex.event("tool.requested", value))
    return _answer(lambda: ex.finish(value))


async def async_case(rec, kind: str, value, eid: str) -> str:
    if kind == "id":
        return await _answer_async(lambda: rec.start("I", ENV, value))
    if kind == "intent":
        return await _answer_async(lambda: rec.start(value, ENV, eid))
    if kind == "envelope":
        return await _answer_async(lambda: rec.start("I", value, eid))
    ex = await rec.start("I", ENV, eid)
    if kind == "type":
        return await _answer_async(lambda: ex.event(value, {"n": 1}))
    if kind == "payload":
        return await _answer_async(lambda: ex.event("tool.requested", value))
    return await _answer_async(lambda: ex.finish(value))


def import_case(store, kind: str, value, eid: str):
    """The answer of the IntentusNet import, or None where a record cannot carry the value as
    the API takes it (an intent is read from the envelope and defaults to "unknown"; an unknown
    event type is stored under the "intentusnet." prefix; a record may have no final response)."""
    if kind == "intent" and not (isinstance(value, str) and value):
        return None
    if kind == "type" or (kind == "response" and value is None) or (kind == "id" and not isinstance(value, str)):
        return None
    record = {
        "header": {"executionId": value if kind == "id" else eid, "createdUtcIso": "2026-01-15T10:30:00+00:00"},
        "envelope": {"intent": value} if kind == "intent" else value if kind == "envelope" else ENV,
        "events": [], "finalResponse": None,
    }
    if kind == "payload":
        record["events"] = [{"seq": 1, "type": "tool.requested", "payload": value}]
    elif kind == "response":
        record["events"] = [{"seq": 1, "type": "FINAL_RESPONSE", "payload": value}]
        record["finalResponse"] = value
    if kind == "envelope" and isinstance(value, dict) and "intent" in value:
        return None  # the record's intent would come from it
    return _answer(lambda: write_record(store, record))


def _any_value(v) -> dict:
    """`v` as an OTLP/JSON AnyValue (NaN and infinities as the strings OTLP/JSON spells them)."""
    if v is None:
        return {}
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        if v != v:
            return {"doubleValue": "NaN"}
        if v in (float("inf"), float("-inf")):
            return {"doubleValue": "Infinity" if v > 0 else "-Infinity"}
        return {"doubleValue": v}
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [_any_value(x) for x in v]}}
    return {"kvlistValue": {"values": [{"key": k, "value": _any_value(x)} for k, x in v.items()]}}


def _expressible_in_otlp(v) -> bool:
    """Keys are strings in OTLP, and its JSON nests each level three deep (the parser's limit)."""
    if isinstance(v, dict):
        return all(isinstance(k, str) for k in v) and all(map(_expressible_in_otlp, v.values()))
    if isinstance(v, (list, tuple)):
        return all(map(_expressible_in_otlp, v))
    return True


def otlp_case(url: str, kind: str, value, auth: dict):
    """The answer of OTLP ingest, or None where a span cannot carry the value."""
    if kind not in ("intent", "payload", "envelope") or depth_of(value) > 100 or not _expressible_in_otlp(value):
        return None
    if kind == "intent" and not (isinstance(value, str) and 0 < len(value) <= 200
                                 and not value.startswith("unknown_service")):
        return None  # the intent is the service name, cut to 200 characters, when there is one
    if kind == "envelope" and not isinstance(value, dict):
        return None
    service = value if kind == "intent" else "prop-agent"
    resource = [{"key": "service.name", "value": {"stringValue": service}}]
    if kind == "envelope":
        resource += [{"key": k, "value": _any_value(x)} for k, x in value.items()]
    attrs = [{"key": "test.value", "value": _any_value(value)}] if kind == "payload" else []
    span = {"traceId": secrets.token_hex(16), "spanId": secrets.token_hex(8), "name": "root", "kind": 1,
            "startTimeUnixNano": "1", "endTimeUnixNano": "2", "attributes": attrs}
    body = {"resourceSpans": [{"resource": {"attributes": resource}, "scopeSpans": [{"spans": [span]}]}]}
    try:
        data = json.dumps(body, ensure_ascii=True).encode()
    except ValueError:
        return None
    r = httpx.post(url, content=data, headers={"content-type": "application/json", **auth}, timeout=60)
    if r.status_code == 400:
        return REFUSED
    assert r.status_code == 200, r.text
    return REFUSED if r.json().get("partialSuccess", {}).get("rejectedSpans") else OK


def otlp_reference(store, kind: str, value, eid: str) -> str:
    """The embedded store's answer for what the OTLP span becomes: the value at the depth the
    mapping puts it (payload["otel"]["attributes"][key], envelope["resource"][key])."""
    if kind == "payload":
        ex = store.start("I", ENV, eid)
        return _answer(lambda: ex.event("otel.span", {"span_id": "0" * 16, "otel": {"attributes": {"test.value": value}}}))
    if kind == "envelope":
        return _answer(lambda: store.start("I", {"intent": "I", "resource": {"service.name": "x", **value}}, eid))
    return _answer(lambda: store.start(value, ENV, eid))


# -- the recorders ------------------------------------------------------------------------------


class Recorders:
    def __init__(self):
        self.dirs = [short_tempdir() for _ in range(6)]
        embedded, asyncio_dir, sync_dir, async_dir, import_dir, reference_dir = self.dirs
        self.embedded = tracedb.open(embedded, config=SETTINGS)
        self.importing = tracedb.open(import_dir, config=SETTINGS)
        self.reference = tracedb.open(reference_dir, config=SETTINGS)  # for what OTLP makes of a value
        self.loop = asyncio.new_event_loop()
        self.astore = self.loop.run_until_complete(tracedb.open_async(asyncio_dir, config=SETTINGS))
        self.sync_serve = OtlpServe(sync_dir)  # tracedb serve, with its OTLP receiver
        self.async_serve = Serve(async_dir)
        self.client = tracedb.client.connect(f"unix:{os.path.join(sync_dir, 'tracedb.sock')}")
        self.aclient = self.loop.run_until_complete(
            tracedb.client.connect_async(f"unix:{os.path.join(async_dir, 'tracedb.sock')}"))
        self.used_ids: set = set()

    def close(self) -> None:
        self.client.close()
        self.loop.run_until_complete(self.aclient.close())
        self.loop.run_until_complete(self.astore.close())
        self.loop.close()
        for s in (self.embedded, self.importing, self.reference):
            s.close()
        assert self.sync_serve.stop() == 0
        assert self.async_serve.terminate()[0] == 0
        for d in self.dirs:
            rmtree(d)


@pytest.fixture(scope="module")
def recorders():
    import tracedb.client  # noqa: F401

    r = Recorders()
    yield r
    r.close()


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(CASES)
def test_every_way_in_gives_the_same_answer(recorders, case):
    r = recorders
    kind, value = case
    if isinstance(value, Deep):
        value = value.value()
    if kind == "id":
        key = value if isinstance(value, str) else repr(value)
        if key in r.used_ids:
            return  # taken by an earlier example on every path: answered as a resend or taken
        r.used_ids.add(key)
    eid = f"prop-{next(_n)}"
    answers = {
        "embedded": sync_case(r.embedded, kind, value, eid),
        "asyncio store": r.loop.run_until_complete(async_case(r.astore, kind, value, eid)),
        "sync client": sync_case(r.client, kind, value, eid),
        "asyncio client": r.loop.run_until_complete(async_case(r.aclient, kind, value, eid)),
    }
    imported = import_case(r.importing, kind, value, eid)
    if imported is not None:
        answers["import"] = imported
    otlp = otlp_case(r.sync_serve.endpoint, kind, value, r.sync_serve.auth)
    if otlp is not None:
        answers["otlp"] = otlp
        expected_otlp = otlp_reference(r.reference, kind, value, eid)
        assert otlp == expected_otlp, (kind, repr(value)[:300], otlp, expected_otlp)
        del answers["otlp"]
    assert len(set(answers.values())) == 1, (kind, repr(value)[:300], answers)
    event(f"{kind} {answers['embedded']}" + (f", otlp {otlp}" if otlp is not None else "")
          + (", imported" if imported is not None else ""))


def every_answer(r, kind: str, value) -> dict:
    """The answer of the embedded store, the asyncio store and both clients to one case."""
    return {
        "embedded": sync_case(r.embedded, kind, value, f"prop-{next(_n)}"),
        "asyncio store": r.loop.run_until_complete(async_case(r.astore, kind, value, f"prop-{next(_n)}")),
        "sync client": sync_case(r.client, kind, value, f"prop-{next(_n)}"),
        "asyncio client": r.loop.run_until_complete(async_case(r.aclient, kind, value, f"prop-{next(_n)}")),
    }


@pytest.mark.parametrize("eid", ["", 0])
def test_an_execution_id_that_is_false_is_refused_by_the_clients_as_by_the_store(recorders, eid):
    # Not read as "choose one for me": only None is.
    assert set(every_answer(recorders, "id", eid).values()) == {REFUSED}


def test_a_datetime_in_a_payload_is_refused_by_the_clients_as_by_the_store(recorders):
    from datetime import datetime, timezone

    when = {"at": datetime(2026, 1, 15, tzinfo=timezone.utc)}
    assert set(every_answer(recorders, "payload", when).values()) == {REFUSED}
    assert set(every_answer(recorders, "response", when).values()) == {REFUSED}


def test_an_envelope_holding_a_datetime_gets_one_hash_on_every_way_in(recorders):
    from datetime import datetime, timezone

    r = recorders
    env = {"intent": "I", "at": datetime(2026, 1, 15, tzinfo=timezone.utc)}
    embedded = r.embedded.start("I", env, f"prop-{next(_n)}")
    hashes = {
        "asyncio store": r.loop.run_until_complete(r.astore.start("I", env, f"prop-{next(_n)}")).envelope_hash,
        "sync client": r.client.start("I", env, f"prop-{next(_n)}").envelope_hash,
        "asyncio client": r.loop.run_until_complete(r.aclient.start("I", env, f"prop-{next(_n)}")).envelope_hash,
    }
    assert set(hashes.values()) == {embedded.envelope_hash}, hashes
    # And the envelope is stored as in-process: the datetime as its str().
    ex = r.client.start("I", env, f"prop-{next(_n)}")
    assert r.client.get(ex.execution_id).envelope["at"] == str(env["at"])
