"""Every query parameter of every route is range-checked: what the store cannot compare with (a year
1 or 9999 time, a cursor holding a 26-digit number), what SQLite would refuse (a 50,000-character
search), malformed percent-escapes, NUL and repeated parameters are a 400 that says which, as the
styled page (JSON for the routes the page's script fetches), never a 500. Named cases over a real
socket to `tracedb ui`; then a property test of generated parameter maps against the real app."""

from __future__ import annotations

import asyncio
import base64
import socket
from urllib.parse import urlsplit

import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from tracedb.config import load_config
from tracedb.reads.reader import AsyncReader
from tracedb.web import create_app

from .conftest import TOKENS
from .query_fuzz import asgi_get, check_answer, requests


def raw_get(base_url: str, target: bytes) -> tuple[int, bytes, bytes]:
    """One GET with `target` sent byte for byte (no client library re-encodes it), with the
    view's token; (status, head, body)."""
    u = urlsplit(base_url)
    token = next((t for base, t in TOKENS.items() if base_url.startswith(base)), None)
    auth = b"Authorization: Bearer " + token.encode() + b"\r\n" if token else b""
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth + b"Connection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head, body


CURSOR_26_DIGITS = base64.urlsafe_b64encode(b"12345678901234567890123456:exec-ok-0001").decode().rstrip("=")

NAMED = [
    (b"/?until=0001-01-01", b"outside the times the store can hold"),
    (b"/?until=1677-01-01", b"outside the times the store can hold"),
    (b"/?since=2300-01-01", b"outside the times the store can hold"),
    (b"/?since=9999-12-31", b"outside the times the store can hold"),
    (b"/?since=400000d", b"outside the times the store can hold"),
    (b"/?before=" + CURSOR_26_DIGITS.encode(), b"is not a page cursor"),
    (b"/?q=" + b"a" * 50_000, b"characters long"),
    (b"/?q=" + b"%25" * 30_000, b"characters long"),
    (b"/?q=%GG", b"malformed percent-escape"),
    (b"/?q=%", b"malformed percent-escape"),
    (b"/?q=%ff%fe", b"not UTF-8"),
    (b"/?intent=a%00b", b"NUL"),
    (b"/?status=completed&status=running", b"more than once"),
    (b"/e/exec-ok-0001?x=%zz", b"malformed percent-escape"),
    (b"/e/exec%00", b"NUL"),
    (b"/e/%ff", b"not UTF-8"),
    (b"/diff?a=exec-ok-0001&b=" + b"x" * 200, b"at most 128"),
]
NAMED_API = [  # the routes the page's script fetches answer JSON
    (b"/counts?until=0001-01-01", "outside the times the store can hold"),
    (b"/counts?q=" + b"a" * 50_000, "characters long"),
    (b"/api/event?id=exec-ok-0001&seq=1&seq=2", "more than once"),
    (b"/api/live?id=exec-ok-0001&after=1&status=bogus", "is not a status"),
    (b"/api/rows?id=%00", "NUL"),
    (b"/api/overview?id=" + b"e" * 5000, "at most 128"),
    (b"/api/event?id=exec-ok-0001&seq=99999999999999999999999999", "out of range"),
]


def test_named_bad_queries_are_400_pages_saying_what_is_wrong(ui):
    url, _ = ui
    for target, words in NAMED:
        status, head, body = raw_get(url, target)
        assert status == 400, (target[:80], status, body[:300])
        assert b"text/html" in head and b'class="error" data-status="400"' in body, target[:80]
        assert words in body and b'class="hint"' in body, (target[:80], body[:400])
    for target, words in NAMED_API:
        status, head, body = raw_get(url, target)
        assert status == 400 and b"application/json" in head, (target[:80], body[:300])
        err = orjson.loads(body)["error"]
        assert words in err["message"] and err["hint"], (target[:80], err)
    # The edges of the range are accepted, and a time inside it still filters.
    for target in (b"/?since=1677-09-22", b"/?until=2262-04-11", b"/?since=1970-01-01&until=2262-04-11T23:47:16Z"):
        assert raw_get(url, target)[0] == 200, target


class AppOn:
    """The web app over an AsyncReader, on an event loop of its own (the property test's
    examples run one after another on it)."""

    def __init__(self, cfg):
        self.loop = asyncio.new_event_loop()
        self.reader = self.loop.run_until_complete(AsyncReader.open(cfg))
        self.app = create_app(self.reader)

    def get(self, raw_path: bytes, query: bytes):
        return self.loop.run_until_complete(asgi_get(self.app, raw_path, query))

    def close(self) -> None:
        self.loop.run_until_complete(self.reader.close())
        self.loop.close()


@pytest.fixture(scope="module")
def sqlite_app(web_store):
    data_dir, _ids = web_store
    app = AppOn(load_config(overrides={"data_dir": data_dir}))
    yield app
    app.close()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(requests())
def test_no_generated_query_gets_a_500(sqlite_app, request_bytes):
    raw_path, query = request_bytes
    check_answer(raw_path, query, *sqlite_app.get(raw_path, query))


def test_the_fuzzed_requests_reach_the_pages_they_name(sqlite_app):
    # The checks above are not vacuous: well-formed requests of each route are answered.
    for path, query in ((b"/", b"status=completed&limit=2"), (b"/counts", b"q=answer"),
                        (b"/api/event", b"id=exec-ok-0001&seq=1"), (b"/api/rows", b"id=exec-ok-0001"),
                        (b"/api/overview", b"id=exec-ok-0001"), (b"/diff", b"a=exec-ok-0001&b=exec-other-0002"),
                        (b"/e/exec-ok-0001", b"")):
        status, _headers, body = sqlite_app.get(path, query)
        assert status == 200, (path, body[:300])
