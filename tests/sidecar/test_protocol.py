"""The wire protocol, in-process on a temporary Unix socket (docs/protocol.md)."""

from __future__ import annotations

import asyncio
import threading
import time

import orjson
import pytest

from tests.waiting import wait_until
from tracedb.sidecar import protocol as P

from .helpers import LineClient, sock_path

ENV = {"intent": "ProcessIntent", "payload": {"q": 1}, "routingMetadata": {"host": "a"}}


def start(c: LineClient, eid: str, rid=1, **extra) -> dict:
    return c.call({"id": rid, "op": "start", "intent": "ProcessIntent", "envelope": ENV, "execution_id": eid, **extra})


def test_hello_reports_protocol_version_and_limits(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    r = c.call({"id": "h", "op": "hello"})
    assert r["ok"] is True and r["id"] == "h"
    assert r["protocol"] == P.PROTOCOL_VERSION
    assert r["limits"]["max_frame_bytes"] == P.DEFAULT_MAX_FRAME_BYTES
    assert c.call({"id": 2, "op": "ping"}) == {"id": 2, "ok": True, "pong": True}


def test_a_recorded_execution_reads_back_in_seed_000_shape(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    r = start(c, "exec-1")
    assert r["ok"] and r["execution_id"] == "exec-1" and r["created"] is True
    from tracedb import compute_envelope_hash

    assert r["envelope_hash"] == compute_envelope_hash(ENV)
    assert c.call({"id": 2, "op": "event", "execution_id": "exec-1", "type": "INTENT_RECEIVED", "payload": {"intent": "ProcessIntent"}})["seq"] == 1
    assert c.call({"id": 3, "op": "event", "execution_id": "exec-1", "type": "tool.requested", "payload": {"tool": "search"}, "seq": 2})["seq"] == 2
    assert c.call({"id": 4, "op": "finish", "execution_id": "exec-1", "response": {"status": "success", "payload": {"a": 1}}})["seq"] == 3
    rec = c.call({"id": 5, "op": "get", "execution_id": "exec-1"})["record"]
    assert rec["header"]["executionId"] == "exec-1"
    assert rec["header"]["replayable"] is True and rec["header"]["replayableReason"] is None
    assert rec["header"]["envelopeHash"] == r["envelope_hash"]
    assert [(e["seq"], e["type"]) for e in rec["events"]] == [(1, "INTENT_RECEIVED"), (2, "tool.requested"), (3, "FINAL_RESPONSE")]
    assert rec["finalResponse"] == {"status": "success", "payload": {"a": 1}}
    assert rec["status"] == "completed"


def test_pipelined_requests_are_answered_by_id(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    reqs = [{"id": "s", "op": "start", "intent": "I", "envelope": ENV, "execution_id": "exec-p"}]
    reqs += [{"id": f"e{i}", "op": "event", "execution_id": "exec-p", "type": "tool.responded", "payload": {"i": i}, "seq": i}
             for i in range(1, 201)]
    reqs.append({"id": "f", "op": "finish", "execution_id": "exec-p", "response": {"status": "success"}})
    c.send_raw(b"".join(orjson.dumps(r) + b"\n" for r in reqs))  # one write: one pipeline
    got = {}
    for _ in reqs:
        r = c.recv()
        got[r["id"]] = r
    assert all(r["ok"] for r in got.values()), [r for r in got.values() if not r["ok"]][:3]
    assert [got[f"e{i}"]["seq"] for i in range(1, 201)] == list(range(1, 201))
    assert got["f"]["seq"] == 201
    rec = c.call({"id": "g", "op": "get", "execution_id": "exec-p"})["record"]
    assert [e["payload"] for e in rec["events"][:-1]] == [{"i": i} for i in range(1, 201)]


def test_a_response_is_sent_only_once_the_write_is_durable(mem_server):
    c = LineClient(sock_path(mem_server.config.socket_path.rsplit("/", 1)[0]), timeout_s=0.3)
    assert start(c, "exec-d")["ok"]
    mem_server.hold()
    c.send({"id": 7, "op": "event", "execution_id": "exec-d", "type": "tool.requested", "payload": {}, "seq": 1})
    with pytest.raises(TimeoutError):
        c.recv()  # the answer waits for the (held) durability signal
    assert c.call({"id": 8, "op": "ping"})["pong"] is True  # an answer that needs no write is not held
    mem_server.release()
    c.sock.settimeout(20)
    assert c.recv() == {"id": 7, "ok": True, "seq": 1}


def test_resent_event_gets_its_original_seq_and_is_recorded_once(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-r")
    ev = {"op": "event", "execution_id": "exec-r", "type": "llm.requested", "payload": {"prompt": "hi"}, "seq": 1}
    assert c.call({"id": 1, **ev}) == {"id": 1, "ok": True, "seq": 1}
    again = c.call({"id": 2, **ev})
    assert again == {"id": 2, "ok": True, "seq": 1, "duplicate": True}
    assert c.call({"id": 3, "op": "event", "execution_id": "exec-r", "type": "llm.responded", "payload": {}, "seq": 2})["seq"] == 2
    fin = {"op": "finish", "execution_id": "exec-r", "response": {"status": "success"}, "seq": 3}
    assert c.call({"id": 4, **fin})["seq"] == 3
    assert c.call({"id": 5, **fin}) == {"id": 5, "ok": True, "seq": 3, "duplicate": True}
    rec = c.call({"id": 6, "op": "get", "execution_id": "exec-r"})["record"]
    assert [e["seq"] for e in rec["events"]] == [1, 2, 3]


def test_a_different_event_under_a_taken_seq_is_a_conflict(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-c")
    c.call({"id": 1, "op": "event", "execution_id": "exec-c", "type": "tool.requested", "payload": {"a": 1}, "seq": 1})
    r = c.call({"id": 2, "op": "event", "execution_id": "exec-c", "type": "tool.requested", "payload": {"a": 2}, "seq": 1})
    assert r["error"]["code"] == "seq_conflict"
    gap = c.call({"id": 3, "op": "event", "execution_id": "exec-c", "type": "tool.requested", "payload": {}, "seq": 5})
    assert gap["error"]["code"] == "seq_conflict" and "expected seq 2" in gap["error"]["message"]
    rec = c.call({"id": 4, "op": "get", "execution_id": "exec-c"})["record"]
    assert [e["payload"] for e in rec["events"]] == [{"a": 1}]


def test_resent_start_is_recognised_and_a_different_one_refused(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    assert start(c, "exec-s")["created"] is True
    c.call({"id": 9, "op": "event", "execution_id": "exec-s", "type": "tool.requested", "payload": {}, "seq": 1})
    again = start(c, "exec-s", rid=2)
    assert again["ok"] and again["created"] is False and again["last_seq"] == 1
    other = c.call({"id": 3, "op": "start", "intent": "ProcessIntent", "envelope": {"other": 1}, "execution_id": "exec-s"})
    assert other["error"]["code"] == "execution_exists"


def test_server_chosen_execution_ids(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    r = c.call({"id": 1, "op": "start", "intent": "I", "envelope": ENV})
    assert r["ok"] and r["execution_id"].startswith("exec-")
    assert c.call({"id": 2, "op": "event", "execution_id": r["execution_id"], "type": "tool.requested", "payload": None})["seq"] == 1


def test_closed_and_unknown_executions_refuse_events(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-x")
    c.call({"id": 1, "op": "finish", "execution_id": "exec-x", "response": {"status": "success"}})
    r = c.call({"id": 2, "op": "event", "execution_id": "exec-x", "type": "tool.requested", "payload": {}})
    assert r["error"]["code"] == "execution_closed" and "completed" in r["error"]["message"]
    r = c.call({"id": 3, "op": "event", "execution_id": "exec-none", "type": "tool.requested", "payload": {}})
    assert r["error"]["code"] == "unknown_execution"
    r = c.call({"id": 4, "op": "finish", "execution_id": "exec-none", "response": {}})
    assert r["error"]["code"] == "unknown_execution"
    r = c.call({"id": 5, "op": "get", "execution_id": "exec-none"})
    assert r["error"]["code"] == "unknown_execution"


def test_closed_execution_known_only_to_the_database_is_refused(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-old")
    c.call({"id": 1, "op": "finish", "execution_id": "exec-old", "response": {"status": "success"}})
    store_server.call(lambda: store_server.backend.astore.compact())  # the store forgets it
    assert store_server.backend.store.staging.next_seq("exec-old") is None
    r = c.call({"id": 2, "op": "event", "execution_id": "exec-old", "type": "tool.requested", "payload": {}})
    assert r["error"]["code"] == "execution_closed"
    # A resend of its final response is still recognised.
    r = c.call({"id": 3, "op": "finish", "execution_id": "exec-old", "response": {"status": "success"}, "seq": 1})
    assert r == {"id": 3, "ok": True, "seq": 1, "duplicate": True}
    assert start(c, "exec-old", rid=4)["created"] is False


def test_invalidate_and_abandon(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-i")
    assert c.call({"id": 1, "op": "invalidate", "execution_id": "exec-i", "reason": "bad data"})["ok"]
    assert c.call({"id": 2, "op": "invalidate", "execution_id": "exec-i", "reason": "again"})["ok"]  # idempotent
    h = c.call({"id": 3, "op": "get", "execution_id": "exec-i"})["record"]["header"]
    assert (h["replayable"], h["replayableReason"]) == (False, "manually_invalidated")

    start(c, "exec-a", rid=4)
    c.call({"id": 5, "op": "event", "execution_id": "exec-a", "type": "AGENT_ATTEMPT_START", "payload": {"agent": "a"}, "seq": 1})
    assert c.call({"id": 6, "op": "abandon", "execution_id": "exec-a", "reason": "agent killed"}) == {"id": 6, "ok": True, "status": "incomplete"}
    assert c.call({"id": 7, "op": "abandon", "execution_id": "exec-a", "reason": "agent killed"})["ok"]
    rec = c.call({"id": 8, "op": "get", "execution_id": "exec-a"})["record"]
    assert rec["status"] == "incomplete"
    assert (rec["header"]["replayable"], rec["header"]["replayableReason"]) == (False, "execution_incomplete")
    assert [e["type"] for e in rec["events"]] == ["AGENT_ATTEMPT_START"]
    r = c.call({"id": 9, "op": "event", "execution_id": "exec-a", "type": "AGENT_ATTEMPT_END", "payload": {}})
    assert r["error"]["code"] == "execution_closed"


def test_multi_megabyte_payloads_pass(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-big")
    blob = "x" * (6 << 20)
    r = c.call({"id": 1, "op": "event", "execution_id": "exec-big", "type": "tool.responded", "payload": {"blob": blob}, "seq": 1})
    assert r == {"id": 1, "ok": True, "seq": 1}
    rec = c.call({"id": 2, "op": "get", "execution_id": "exec-big"})["record"]
    assert rec["events"][0]["payload"]["blob"] == blob


def test_frame_splitter_handles_partial_and_oversized_lines():
    s = P.FrameSplitter(10)
    assert s.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert s.feed(b":2}\n\n  \n") == [b'{"b":2}']
    assert s.feed(b"0123456789ABC") == [P.FrameSplitter.TOO_LARGE]
    assert s.buffered_bytes == 0  # the oversized line is dropped as it arrives
    assert s.feed(b"DEF\n{}\n") == [b"{}"]
    assert s.feed(b"0123456789AB\n") == [P.FrameSplitter.TOO_LARGE]
    assert s.feed(b"12345") == [] and s.feed(b"678901\n") == [P.FrameSplitter.TOO_LARGE]
    assert s.feed(b"ok\r\n") == [b"ok\r"]


def test_idle_sweeper_closes_an_execution_the_server_is_recording(tdir):
    from tracedb.sidecar.server import ServerConfig

    from .conftest import make_server

    store_server = make_server(tdir, ServerConfig(socket_path=sock_path(tdir), data_dir=tdir), backend="store",
                               idle_timeout_s=3600)
    try:
        _sweep_idle(store_server)
    finally:
        store_server.stop()


def _sweep_idle(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-idle")
    c.call({"id": 1, "op": "event", "execution_id": "exec-idle", "type": "tool.requested", "payload": {}, "seq": 1})
    store = store_server.backend.store
    far_future_ns = store.clock() + 10**18
    # The store's sweeper (its background thread in `tracedb serve`), run with a fake clock.
    marked = store_server.call(lambda: asyncio.get_running_loop().run_in_executor(None, store.sweep_idle, far_future_ns))
    assert marked == 1
    r = c.call({"id": 2, "op": "event", "execution_id": "exec-idle", "type": "tool.requested", "payload": {}, "seq": 2})
    assert r["error"]["code"] == "execution_closed" and "incomplete" in r["error"]["message"]
    rec = c.call({"id": 3, "op": "get", "execution_id": "exec-idle"})["record"]
    assert rec["header"]["replayableReason"] == "execution_incomplete"
    assert [e["seq"] for e in rec["events"]] == [1]


@pytest.mark.parametrize("payload", [5, 0, -3, 1.5, 0.30000000000000004, 1e300, True, None, "s", [1, 2]])
def test_an_event_whose_payload_is_not_an_object_reads_back_and_resends_as_a_duplicate(store_server, payload):
    # SQLite stores a JSON document that is a bare number as a number (NUMERIC affinity): it
    # must still read back, from memory and once compacted, and a resend must be recognised.
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-p")
    ev = {"op": "event", "execution_id": "exec-p", "type": "tool.responded", "payload": payload, "seq": 1}
    assert c.call({"id": 1, **ev}) == {"id": 1, "ok": True, "seq": 1}
    c.call({"id": 2, "op": "finish", "execution_id": "exec-p", "response": {"status": "success"}})
    store_server.call(lambda: store_server.backend.astore.compact())
    rec = c.call({"id": 3, "op": "get", "execution_id": "exec-p"})
    assert rec["ok"], rec
    assert rec["record"]["events"][0]["payload"] == payload
    assert c.call({"id": 4, **ev}) == {"id": 4, "ok": True, "seq": 1, "duplicate": True}


@pytest.mark.parametrize("payload", [1e3, 1.0, -0.0])
def test_a_bare_whole_float_payload_is_refused_as_the_database_would_give_back_an_integer(store_server, payload):
    # Stored, 1000.0 would come back as the integer 1000 (SQLite's NUMERIC affinity): refused,
    # with the way to keep it, rather than changed.
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-f")
    ev = {"op": "event", "execution_id": "exec-f", "type": "tool.responded", "payload": payload, "seq": 1}
    r = c.call({"id": 1, **ev})
    assert r["ok"] is False and r["error"]["code"] == "bad_request"
    assert "wrap it in an object" in r["error"]["message"]
    assert c.call({"id": 2, **ev, "payload": {"value": payload}}) == {"id": 2, "ok": True, "seq": 1}


def test_a_resend_is_a_duplicate_only_if_the_payload_is_the_same_json(store_server):
    # Python's == says True == 1: a resent `true` where `1` was recorded is another event.
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-b")
    ev = {"op": "event", "execution_id": "exec-b", "type": "tool.responded", "seq": 1}
    c.call({"id": 1, **ev, "payload": {"n": 1, "l": [0]}})
    store_server.call(lambda: store_server.backend.astore.compact())
    assert c.call({"id": 2, **ev, "payload": {"n": True, "l": [0]}})["error"]["code"] == "seq_conflict"
    assert c.call({"id": 3, **ev, "payload": {"n": 1, "l": [False]}})["error"]["code"] == "seq_conflict"
    assert c.call({"id": 4, **ev, "payload": {"n": 1.0, "l": [0]}})["duplicate"] is True  # the same number


def test_a_fork_at_seq_0_is_accepted(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-parent")
    r = start(c, "exec-child", rid=2, parent_execution_id="exec-parent", forked_at_seq=0)
    assert r["ok"] and r["created"] is True, r
    bad = start(c, "exec-child2", rid=3, parent_execution_id="exec-parent", forked_at_seq=-1)
    assert bad["error"]["code"] == "bad_request" and ">= 0" in bad["error"]["message"]


def test_a_burst_of_resends_reads_the_record_once_and_sees_later_steps(store_server):
    # A client resends its whole window after a reconnect: each resend is compared with the
    # recorded step, and the record is read once for the burst, not once per request.
    backend = store_server.backend
    reads = []
    recorded = backend._recorded

    async def counting(execution_id):
        reads.append(execution_id)
        return await recorded(execution_id)

    backend._recorded = counting
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-burst")
    ev = {"op": "event", "execution_id": "exec-burst", "type": "tool.responded"}
    for s in range(1, 51):
        assert c.call({"id": s, **ev, "payload": {"i": s}, "seq": s})["seq"] == s
    for s in range(1, 51):
        assert c.call({"id": 100 + s, **ev, "payload": {"i": s}, "seq": s})["duplicate"] is True
    assert len(reads) == 1
    # Steps recorded after the record was read are read again when a resend reaches them.
    assert c.call({"id": 200, **ev, "payload": {"i": 51}, "seq": 51})["seq"] == 51
    assert c.call({"id": 201, **ev, "payload": {"i": 51}, "seq": 51})["duplicate"] is True
    assert c.call({"id": 202, **ev, "payload": {"i": 0}, "seq": 51})["error"]["code"] == "seq_conflict"
    assert len(reads) == 2
    # Once the execution is closed (and forgotten by the compactor), events past its end are
    # refused from what was read: a client resending a long window after a restart is answered
    # at once, not one read of the whole record per request.
    c.call({"id": 300, "op": "finish", "execution_id": "exec-burst", "response": {"status": "success"}, "seq": 52})
    store_server.call(lambda: store_server.backend.astore.compact())
    for s in range(53, 83):
        r = c.call({"id": 300 + s, **ev, "payload": {"i": s}, "seq": s})
        assert r["error"]["code"] == "execution_closed" and "completed" in r["error"]["message"]
    assert len(reads) == 3


def test_a_fork_start_resent_while_its_first_copy_is_checked_is_recognised(store_server):
    # A fork start is checked against the database off the loop. The same start resent on
    # another connection meanwhile (the client reconnected) waits for it, and so do the events
    # sent behind it: `created: false` and the original seqs, never `execution_exists`.
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-parent")
    c.call({"id": 2, "op": "event", "execution_id": "exec-parent", "type": "tool.requested", "payload": {}, "seq": 1})
    for i in range(20):
        eid = f"exec-fork-{i}"
        a = LineClient(sock_path(store_server.config.data_dir))
        b = LineClient(sock_path(store_server.config.data_dir))
        req = {"id": 1, "op": "start", "intent": "ProcessIntent", "envelope": ENV, "execution_id": eid,
               "parent_execution_id": "exec-parent", "forked_at_seq": 1}
        ev = {"id": 2, "op": "event", "execution_id": eid, "type": "tool.responded", "payload": {"i": i}, "seq": 1}
        a.send(req)
        b.send(req)
        a.send(ev)
        b.send(ev)
        ra = {r["id"]: r for r in (a.recv(), a.recv())}
        rb = {r["id"]: r for r in (b.recv(), b.recv())}
        assert all(r["ok"] for r in [*ra.values(), *rb.values()]), (ra, rb)
        assert sorted([ra[1]["created"], rb[1]["created"]]) == [False, True]
        assert ra[2]["seq"] == rb[2]["seq"] == 1
        a.close()
        b.close()


def test_a_bare_integer_payload_outside_64_bits_is_refused(store_server):
    # SQLite would keep it as an inexact REAL; inside an object it is kept exactly.
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-big")
    ev = {"op": "event", "execution_id": "exec-big", "type": "tool.responded", "seq": 1}
    r = c.call({"id": 1, **ev, "payload": 2**64 - 1})
    assert r["error"]["code"] == "bad_request" and "64-bit" in r["error"]["message"]
    assert c.call({"id": 2, **ev, "payload": {"n": 2**64 - 1}})["seq"] == 1
    assert c.call({"id": 3, **ev, "seq": 2, "payload": 2**63 - 1})["seq"] == 2
    store_server.call(lambda: store_server.backend.astore.compact())
    rec = c.call({"id": 4, "op": "get", "execution_id": "exec-big"})["record"]
    assert [e["payload"] for e in rec["events"]] == [{"n": 2**64 - 1}, 2**63 - 1]


def test_an_execution_invalidated_after_a_refusal_is_refused_with_its_new_status(store_server):
    c = LineClient(sock_path(store_server.config.data_dir))
    start(c, "exec-inv")
    c.call({"id": 1, "op": "finish", "execution_id": "exec-inv", "response": {"status": "success"}, "seq": 1})
    store_server.call(lambda: store_server.backend.astore.compact())  # the store forgets it
    ev = {"op": "event", "execution_id": "exec-inv", "type": "tool.responded", "payload": {}, "seq": 2}
    assert "is completed" in c.call({"id": 2, **ev})["error"]["message"]
    assert c.call({"id": 3, "op": "invalidate", "execution_id": "exec-inv", "reason": "wrong answer"})["ok"]
    assert "is invalidated" in c.call({"id": 4, **ev})["error"]["message"]


def test_a_start_resent_while_its_first_copy_fails_gets_the_same_answer(store_server):
    # The first copy of a fork of a missing parent fails while it is checked off the loop; the
    # copy resent meanwhile must not be told the execution exists.
    store = store_server.backend.store
    check = store.staging.check_new_in_db
    checking = threading.Event()

    def slow_check(start):
        checking.set()
        time.sleep(0.2)  # the check is slow: the resent copy arrives while it runs
        return check(start)

    store.staging.check_new_in_db = slow_check
    try:
        req = {"id": 1, "op": "start", "intent": "ProcessIntent", "envelope": ENV, "execution_id": "exec-orphan",
               "parent_execution_id": "exec-missing", "forked_at_seq": 0}
        a = LineClient(sock_path(store_server.config.data_dir))
        b = LineClient(sock_path(store_server.config.data_dir))
        a.send(req)
        wait_until(checking.is_set, 10, "the first copy to be checked")
        b.send(req)
        assert a.recv()["error"]["code"] == "unknown_execution"
        assert b.recv()["error"]["code"] == "unknown_execution"
    finally:
        store.staging.check_new_in_db = check
