"""Bad input: each gets its error code, nothing acknowledged is lost, the server keeps serving."""

from __future__ import annotations

import select
import socket
import time

import orjson
import pytest

from tests.waiting import wait_until
from tracedb.sidecar.server import ServerConfig

from .conftest import make_server
from .helpers import LineClient, rmtree, short_tempdir, sock_path

MAX_FRAME = 1 << 20
ENV = {"intent": "I", "payload": {}}


@pytest.fixture(scope="module")
def server():
    """One server on the real store for the whole suite, with a 1 MiB frame limit."""
    d = short_tempdir()
    srv = make_server(d, ServerConfig(socket_path=sock_path(d), data_dir=d, max_frame_bytes=MAX_FRAME), backend="store")
    c = LineClient(sock_path(d))
    # Data acknowledged before the suite; every test checks it is still there afterwards.
    c.call({"id": 1, "op": "start", "intent": "I", "envelope": ENV, "execution_id": "exec-keep"})
    for i in range(1, 4):
        assert c.call({"id": 1 + i, "op": "event", "execution_id": "exec-keep", "type": "tool.requested", "payload": {"i": i}, "seq": i})["ok"]
    c.call({"id": 9, "op": "start", "intent": "I", "envelope": ENV, "execution_id": "exec-done"})
    c.call({"id": 10, "op": "finish", "execution_id": "exec-done", "response": {"status": "success"}})
    c.close()
    yield srv
    srv.stop()
    rmtree(d)


@pytest.fixture
def conn(server):
    c = LineClient(server.config.socket_path)
    yield c
    c.close()
    # After every bad input: a fresh connection is served and acknowledged data is intact.
    fresh = LineClient(server.config.socket_path)
    assert fresh.call({"id": "p", "op": "ping"})["pong"] is True
    rec = fresh.call({"id": "g", "op": "get", "execution_id": "exec-keep"})["record"]
    assert [e["payload"] for e in rec["events"][:3]] == [{"i": 1}, {"i": 2}, {"i": 3}]
    fresh.close()


def still_serves(c: LineClient) -> None:
    assert c.call({"id": "alive", "op": "ping"}) == {"id": "alive", "ok": True, "pong": True}


DEEP = b'{"id":1,"op":"ping","x":' + b"[" * 2000 + b"]" * 2000 + b"}"

BAD_FRAMES = {
    "malformed json": (b'{"id": 1, "op": ', "bad_json"),
    "trailing garbage": (b'{"id": 1, "op": "ping"} x', "bad_json"),
    "NaN": (b'{"id": 1, "op": "event", "execution_id": "exec-keep", "type": "t.x", "payload": NaN}', "bad_json"),
    "Infinity": (b'{"id": 1, "op": "ping", "x": Infinity}', "bad_json"),
    "-Infinity": (b'{"id": 1, "op": "ping", "x": -Infinity}', "bad_json"),
    "number overflowing a double": (b'{"id": 1, "op": "ping", "x": 1e999}', "bad_json"),
    "invalid utf-8": (b'{"id": 1, "op": "ping", "x": "\xff\xfe"}', "bad_json"),
    "lone surrogate escape": (b'{"id": 1, "op": "ping", "x": "\\ud800"}', "bad_json"),
    "byte order mark": (b'\xef\xbb\xbf{"id": 1, "op": "ping"}', "bad_json"),
    "nesting deeper than the parser allows": (DEEP, "bad_json"),
    "array instead of object": (b'[1, 2, 3]', "bad_request"),
    "string instead of object": (b'"ping"', "bad_request"),
    "missing op": (b'{"id": 1}', "bad_request"),
    "unknown op": (b'{"id": 1, "op": "drop_table"}', "bad_request"),
    "op of the wrong type": (b'{"id": 1, "op": 7}', "bad_request"),
    "id of the wrong type": (b'{"id": {"a": 1}, "op": "ping"}', "bad_request"),
    "id too long": (orjson.dumps({"id": "x" * 300, "op": "ping"}), "bad_request"),
    "execution_id of the wrong type": (b'{"id": 1, "op": "event", "execution_id": 5, "type": "t.x", "payload": {}}', "bad_request"),
    "type of the wrong type": (b'{"id": 1, "op": "event", "execution_id": "exec-keep", "type": ["x"], "payload": {}}', "bad_request"),
    "type empty": (b'{"id": 1, "op": "event", "execution_id": "exec-keep", "type": "", "payload": {}}', "bad_request"),
    "type not namespaced": (b'{"id": 1, "op": "event", "execution_id": "exec-keep", "type": "whatever", "payload": {}}', "bad_request"),
    "payload missing": (b'{"id": 1, "op": "event", "execution_id": "exec-keep", "type": "t.x"}', "bad_request"),
    "seq a string": (b'{"id": 1, "op": "event", "execution_id": "exec-keep", "type": "t.x", "payload": {}, "seq": "4"}', "bad_request"),
    "seq zero": (b'{"id": 1, "op": "event", "execution_id": "exec-keep", "type": "t.x", "payload": {}, "seq": 0}', "bad_request"),
    "seq a boolean": (b'{"id": 1, "op": "event", "execution_id": "exec-keep", "type": "t.x", "payload": {}, "seq": true}', "bad_request"),
    "seq a float": (b'{"id": 1, "op": "event", "execution_id": "exec-keep", "type": "t.x", "payload": {}, "seq": 4.0}', "bad_request"),
    "envelope an array": (b'{"id": 1, "op": "start", "intent": "I", "envelope": []}', "bad_request"),
    "intent missing": (b'{"id": 1, "op": "start", "envelope": {}}', "bad_request"),
    "intent empty": (b'{"id": 1, "op": "start", "intent": "", "envelope": {}}', "bad_request"),
    "execution_id with spaces": (b'{"id": 1, "op": "start", "intent": "I", "envelope": {}, "execution_id": "a b"}', "bad_request"),
    "response a string": (b'{"id": 1, "op": "finish", "execution_id": "exec-keep", "response": "done"}', "bad_request"),
    "reason missing": (b'{"id": 1, "op": "invalidate", "execution_id": "exec-keep"}', "bad_request"),
    "payload nested too deep to record": (
        b'{"id": 1, "op": "event", "execution_id": "exec-keep", "type": "t.x", "payload": ' + b"[" * 400 + b"]" * 400 + b"}",
        "bad_request",
    ),
    "event for an unknown execution": (b'{"id": 1, "op": "event", "execution_id": "exec-nope", "type": "t.x", "payload": {}}', "unknown_execution"),
    "event for a completed execution": (b'{"id": 1, "op": "event", "execution_id": "exec-done", "type": "t.x", "payload": {}}', "execution_closed"),
    "finish of a completed execution": (b'{"id": 1, "op": "finish", "execution_id": "exec-done", "response": {}}', "execution_closed"),
}


@pytest.mark.parametrize("name", list(BAD_FRAMES))
def test_bad_frame_gets_its_error_code(conn, name):
    frame, code = BAD_FRAMES[name]
    conn.send_raw(frame + b"\n")
    r = conn.recv()
    assert r["ok"] is False
    assert r["error"]["code"] == code, r
    unreadable = code in ("bad_json", "frame_too_large") or name.startswith("id ") or "instead of object" in name
    assert r["id"] == (None if unreadable else 1)  # echoed whenever it could be read
    assert r["error"]["message"]
    still_serves(conn)


def test_bad_frame_between_good_ones_affects_only_itself(conn):
    conn.call({"id": 1, "op": "start", "intent": "I", "envelope": ENV, "execution_id": "exec-mix"})
    good1 = orjson.dumps({"id": "a", "op": "event", "execution_id": "exec-mix", "type": "tool.requested", "payload": {"n": 1}, "seq": 1})
    good2 = orjson.dumps({"id": "b", "op": "event", "execution_id": "exec-mix", "type": "tool.responded", "payload": {"n": 2}, "seq": 2})
    conn.send_raw(good1 + b"\n{oops\n" + good2 + b"\n")
    got = [conn.recv() for _ in range(3)]
    by_id = {r["id"]: r for r in got}
    assert by_id["a"] == {"id": "a", "ok": True, "seq": 1}
    assert by_id["b"] == {"id": "b", "ok": True, "seq": 2}
    assert by_id[None]["error"]["code"] == "bad_json"
    rec = conn.call({"id": "g", "op": "get", "execution_id": "exec-mix"})["record"]
    assert [e["payload"] for e in rec["events"]] == [{"n": 1}, {"n": 2}]


def test_an_integer_outside_64_bits_is_refused_not_stored_as_a_double(conn):
    """orjson reads 2**64 as 1.8446744073709552e+19: stored, it would come back changed."""
    def call(frame: bytes) -> dict:
        conn.send_raw(frame + b"\n")
        return conn.recv()

    start = b'{"id":1,"op":"start","intent":"I","envelope":{"n":%s},"execution_id":"exec-big-%d"}'
    for i, bad in enumerate((b"18446744073709551616", b"-9223372036854775809", b"1" * 40)):
        r = call(start % (bad, i))
        assert r["id"] == 1 and r["error"]["code"] == "bad_request" and "outside 64 bits" in r["error"]["message"], r
        r = conn.call({"id": 2, "op": "get", "execution_id": f"exec-big-{i}"})
        assert r["error"]["code"] == "unknown_execution", r  # nothing of the refused start was kept
    # The limits themselves, and long digit runs that are not integers, pass and come back exact.
    edge = {"max": 2**64 - 1, "min": -(2**63), "text": "9" * 40, "float": 1.5e300}
    assert call(orjson.dumps({"id": 3, "op": "start", "intent": "I", "envelope": ENV, "execution_id": "exec-edge"}))["ok"]
    frame = orjson.dumps({"id": 4, "op": "event", "execution_id": "exec-edge", "type": "t.x", "payload": edge, "seq": 1})
    assert call(frame)["ok"]
    nested = b'{"id":5,"op":"event","execution_id":"exec-edge","type":"t.x","payload":{"a":[1,{"b":99999999999999999999}]},"seq":2}'
    r = call(nested)
    assert r["id"] == 5 and r["error"]["code"] == "bad_request", r
    rec = conn.call({"id": 6, "op": "get", "execution_id": "exec-edge"})["record"]
    assert [e["payload"] for e in rec["events"]] == [edge]
    still_serves(conn)


def test_oversized_frame_is_refused_and_the_connection_goes_on(conn, server):
    big = orjson.dumps({"id": 1, "op": "event", "execution_id": "exec-keep", "type": "t.x", "payload": "y" * (2 * MAX_FRAME)})
    conn.send_raw(big + b"\n")
    r = conn.recv()
    assert r == {"id": None, "ok": False, "error": r["error"]} and r["error"]["code"] == "frame_too_large"
    still_serves(conn)
    # Just under the limit passes.
    ok = orjson.dumps({"id": 2, "op": "ping", "pad": "z" * (MAX_FRAME - 100)})
    assert conn.call(orjson.loads(ok))["ok"] is True


def test_client_disconnecting_mid_frame_records_nothing_of_it(server):
    c = LineClient(server.config.socket_path)
    c.call({"id": 1, "op": "start", "intent": "I", "envelope": ENV, "execution_id": "exec-cut"})
    whole = orjson.dumps({"id": 2, "op": "event", "execution_id": "exec-cut", "type": "tool.requested", "payload": {"n": 1}, "seq": 1})
    half = orjson.dumps({"id": 3, "op": "event", "execution_id": "exec-cut", "type": "tool.requested", "payload": {"n": 2}, "seq": 2})
    c.send_raw(whole + b"\n" + half[: len(half) // 2])
    assert c.recv() == {"id": 2, "ok": True, "seq": 1}
    c.close()
    fresh = LineClient(server.config.socket_path)
    rec = fresh.call({"id": 1, "op": "get", "execution_id": "exec-cut"})["record"]
    assert [e["payload"] for e in rec["events"]] == [{"n": 1}]
    # The half frame left no trace: the next seq is still 2.
    assert fresh.call({"id": 2, "op": "event", "execution_id": "exec-cut", "type": "tool.requested", "payload": {"n": 2}, "seq": 2})["seq"] == 2
    fresh.close()


def test_slow_client_that_never_reads_is_throttled_and_others_are_served(server):
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow.connect(server.config.socket_path)
    slow.setblocking(False)
    line = orjson.dumps({"id": 1, "op": "ping", "pad": "p" * 200}) + b"\n"
    chunk = line * 256
    sent = 0
    deadline = time.monotonic() + 20
    blocked = False

    def paused() -> bool:  # the server stopped reading a connection whose responses pile up
        return any(c.read_paused and c.write_paused for c in list(server.server.connections))

    def writable() -> bool:
        return bool(select.select([], [slow], [], 0)[1])

    # Keep writing requests and never read a response: the server must stop reading this
    # connection (its responses pile up), so our writes eventually block.
    while time.monotonic() < deadline:
        try:
            sent += slow.send(chunk)
        except BlockingIOError:
            # The kernel buffers are full: the server has yet to read them, or has paused.
            wait_until(lambda: writable() or paused(), 20, "the server to read on or to pause reading")
            if paused():
                try:
                    sent += slow.send(chunk)
                except BlockingIOError:
                    blocked = True
                    break
    assert blocked, f"the server kept reading a client that never reads ({sent} bytes sent)"
    assert sent < 64 << 20  # bounded by socket buffers and the server's write high-water mark
    other = LineClient(server.config.socket_path)
    t0 = time.monotonic()
    still_serves(other)
    assert other.call({"id": 2, "op": "event", "execution_id": "exec-keep", "type": "t.x", "payload": {}, "seq": 4})["ok"]
    assert time.monotonic() - t0 < 5
    other.close()
    slow.close()


def test_a_fork_point_past_the_parents_events_is_refused(conn):
    """The CLI's `fork` checked its point; a start over the protocol (or the API) did not: a
    lineage then pointed at a seq the parent never had."""
    conn.call({"id": 1, "op": "start", "intent": "I", "envelope": ENV, "execution_id": "exec-parent-4"})
    for seq in range(1, 4):
        conn.call({"id": 1 + seq, "op": "event", "execution_id": "exec-parent-4", "type": "t.x", "payload": {}, "seq": seq})
    assert conn.call({"id": 5, "op": "finish", "execution_id": "exec-parent-4", "response": {"status": "success"}})["ok"]
    for i, at in enumerate((99, 5)):  # past the last event (the final response is seq 4)
        r = conn.call({"id": 6, "op": "start", "intent": "I", "envelope": ENV, "execution_id": f"exec-fork-{i}",
                       "parent_execution_id": "exec-parent-4", "forked_at_seq": at})
        assert r["ok"] is False and "cannot fork" in r["error"]["message"], r
        assert conn.call({"id": 7, "op": "get", "execution_id": f"exec-fork-{i}"})["error"]["code"] == "unknown_execution"
    r = conn.call({"id": 8, "op": "start", "intent": "I", "envelope": ENV, "execution_id": "exec-fork-ok",
                   "parent_execution_id": "exec-parent-4", "forked_at_seq": 3})
    assert r["ok"] is True, r
    still_serves(conn)
