"""Query strings for the web view's property tests: generated parameter maps (every parameter the
routes read, repeated ones, unknown ones; times of any year, huge numbers, cursors holding any
number, long searches, NUL, malformed percent-escapes, bytes that are not UTF-8), sent to the
real app as the raw bytes a client would put on the wire, and the check of each answer.

The request goes to the ASGI app itself, as uvicorn hands it over (the path percent-decoded,
`raw_path` and `query_string` as sent): an HTTP client library would re-encode a malformed escape
before it ever left, and these must reach the app as they are.
"""

from __future__ import annotations

import base64
from urllib.parse import quote_from_bytes, unquote

import orjson
from hypothesis import strategies as st

ROUTES = ("/", "/counts", "/overview", "/api/event", "/api/rows", "/api/live", "/api/overview", "/diff", "/e/")
API = ("/api/", "/counts")
NAMES = ("status", "replayable", "intent", "q", "since", "until", "before", "limit", "id", "seq", "after", "a", "b",
         "outcome", "model", "error", "min_cost", "slower_than", "per")

YEARS = st.sampled_from([1, 1000, 1677, 1678, 1969, 1970, 2025, 2262, 2263, 2300, 9999])
ISO_TIMES = st.one_of(
    st.builds(lambda y, rest: f"{y:04d}{rest}", YEARS,
              st.sampled_from(["-01-01", "-12-31", "-09-21T00:12:43Z", "-04-11T23:47:16.854775Z",
                               "-04-12T00:00:00+00:00", "-06-15T12:00:00-23:59", "-01-01T00:00:00+14:00"])),
    st.datetimes().map(lambda d: d.isoformat()),
)
AGES = st.builds(lambda n, unit: f"{n}{unit}", st.integers(-10**20, 10**20), st.sampled_from(["s", "m", "h", "d", "w", "y", ""]))


def _cursor(ns: int, eid: str) -> str:
    raw = f"{ns}:{eid}".encode("utf-8", "surrogatepass")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


CURSORS = st.builds(_cursor, st.one_of(st.integers(0, 10**30), st.just(12345678901234567890123456),
                                       st.just((1 << 63) - 1), st.just(1 << 63)),
                    st.one_of(st.sampled_from(["exec-ok-0001", "x", "a\x00b", "é"]), st.text(max_size=200)))
NUMBERS = st.one_of(st.integers(-10**40, 10**40).map(str), st.sampled_from(["", " 5 ", "1e3", "0x10", "1_0", "٥", "nan", "-0"]))
LONG = st.builds(lambda c, n: c * n, st.sampled_from(["a", "%", "_", "/", "é", "[", "*"]), st.integers(0, 60_000))
TEXT = st.text(max_size=300)
ODD = st.sampled_from(["", "\x00", "a\x00b", "\ud800", "completed", "running", "failed", "yes", "maybe", "exec-ok-0001",
                       "day", "hour", "1e400", "inf", "-0.5", "2.5ms", "1.5m", "10h", "gpt-4o-mini", "TOOL_TIMEOUT",
                       "exec-", "e", "../..", "%", "%25", "_", "\\", "'", '"', "<script>", "\n"])
VALUES = st.one_of(ISO_TIMES, AGES, CURSORS, NUMBERS, LONG, TEXT, ODD)


def _encoded(text: str, raw_tail: bytes) -> bytes:
    """`text` percent-encoded as UTF-8 (a lone surrogate as the bytes surrogatepass gives: not
    UTF-8), then `raw_tail` as it is (a malformed escape, say)."""
    return quote_from_bytes(text.encode("utf-8", "surrogatepass"), safe="").encode("ascii") + raw_tail


RAW_TAILS = st.sampled_from([b"", b"", b"", b"%", b"%G", b"%zz", b"%ff", b"%ed%a0%80", b"%00", b"+", b"%C3"])
PAIRS = st.lists(
    st.tuples(st.one_of(st.sampled_from(NAMES), TEXT), VALUES, RAW_TAILS, st.booleans()),
    max_size=6,
)


@st.composite
def requests(draw):
    """(raw path, raw query string) of one GET."""
    route = draw(st.sampled_from(ROUTES))
    if route == "/e/":
        eid = draw(st.one_of(st.sampled_from(["exec-ok-0001", "exec-", "exec-nope", "e"]), TEXT, LONG))
        path = b"/e/" + _encoded(eid, draw(RAW_TAILS))
    else:
        path = route.encode()
    parts = []
    for name, value, tail, repeat in draw(PAIRS):
        part = _encoded(name, b"") + b"=" + _encoded(value, tail)
        parts.append(part)
        if repeat:
            parts.append(part)
    return path, b"&".join(parts)


async def asgi_get(app, raw_path: bytes, query: bytes) -> tuple[int, dict, bytes]:
    """One GET through the ASGI app, as uvicorn would pass it; (status, headers, body). An
    exception the app let out counts as the 500 a server would send."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": unquote(raw_path.decode("ascii")), "raw_path": raw_path,
        "query_string": query, "root_path": "", "headers": [(b"host", b"127.0.0.1:8470")],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8470),
    }
    sent = [{"type": "http.request", "body": b"", "more_body": False}]
    out: dict = {"status": None, "headers": {}, "body": b""}

    async def receive():
        return sent.pop(0) if sent else {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = {k.decode("latin-1"): v.decode("latin-1") for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")

    try:
        await app(scope, receive, send)
    except Exception:  # noqa: BLE001 - what escaped the app is a 500 on the wire
        if out["status"] is None or out["status"] < 500:
            out["status"] = 500
    return out["status"], out["headers"], out["body"]


def check_answer(raw_path: bytes, query: bytes, status: int, headers: dict, body: bytes) -> None:
    """No 5xx; a 400 is the styled page, or for the script's routes, a JSON error."""
    what = f"GET {raw_path[:120]!r}?{query[:300]!r} -> {status}: {body[:300]!r}"
    assert status in (200, 302, 400, 404), what
    if status == 400:
        path = unquote(raw_path.decode("ascii"))
        if path.startswith(API):
            err = orjson.loads(body)["error"]
            assert err["status"] == 400 and err["message"], what
        else:
            assert headers["content-type"].startswith("text/html"), what
            assert b'class="error" data-status="400"' in body and b'class="message"' in body, what
