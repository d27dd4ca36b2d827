"""Redaction through a real `tracedb serve`: secrets sent by a client never reach any byte under
the data directory (WAL segments, spare segment, traces.db and its -wal file), before and after
a SIGKILL and the recovery that follows; a resent event is recognised as the one recorded."""

from __future__ import annotations

from tests.store.redaction_config import (
    SECRET_KEY,
    SECRET_PASSWORD,
    SECRET_PATTERN,
    envelope,
    files_holding,
    response,
    tool_call,
    write_config,
)
from tracedb.client import connect

from .helpers import LineClient

COMMON = (SECRET_KEY, SECRET_PATTERN, SECRET_PASSWORD)


def test_secrets_sent_to_serve_never_reach_the_disk_across_a_crash(serve_process, tdir):
    config = write_config(tdir)
    srv = serve_process(env={"TRACEDB_CONFIG": config})
    with connect("unix:" + srv.socket) as client:
        done = client.start("Research", envelope())
        done.event("tool.requested", tool_call())
        done.finish(response())
        cut = client.start("Research", envelope())
        cut.event("tool.requested", tool_call())
        recorded = client.get(done.execution_id)
    assert recorded.events[0].payload["api_key"] == "[REDACTED]"
    assert recorded.envelope["auth"]["Password"] == "[REDACTED]"

    # A resend of an acknowledged event (same seq) with the secret in it is that event again.
    raw = LineClient(srv.socket)
    raw.send({"id": 0, "op": "hello", "client": "test"})
    assert raw.recv()["ok"]
    raw.send({"id": 1, "op": "start", "intent": "Research", "envelope": envelope(), "execution_id": "exec-resend"})
    assert raw.recv()["ok"]
    event = {"op": "event", "execution_id": "exec-resend", "type": "tool.requested", "payload": tool_call(), "seq": 1}
    raw.send({"id": 2, **event})
    first = raw.recv()
    assert first["ok"] and first["seq"] == 1, first
    raw.send({"id": 3, **event})
    again = raw.recv()
    assert again["ok"] and again["seq"] == 1 and again["duplicate"] is True, again
    raw.close()

    srv.kill()  # the WAL holds what was acknowledged, not compacted yet perhaps
    assert files_holding(tdir, *COMMON) == {}
    srv2 = serve_process(env={"TRACEDB_CONFIG": config})  # recovers: compacts the WAL
    code, err = srv2.terminate()
    assert code == 0, err
    assert files_holding(tdir, *COMMON) == {}
    for secret in COMMON:
        assert secret not in err  # nor in its logs


def test_the_ecosystems_key_forms_sent_to_serve_are_redacted_and_a_resend_is_recognised(serve_process, tdir):
    # Default rules: OpenTelemetry header attributes, dotted and camelCase names, header pairs,
    # JSON text. A resent event holding them is the recorded one, not a conflict.
    from tests.store.redaction_config import ECOSYSTEM_SECRETS, check_ecosystem_payload, ecosystem_payload

    secrets = tuple(ECOSYSTEM_SECRETS.values())
    srv = serve_process()
    with connect("unix:" + srv.socket) as client:
        client.start("Research", {"intent": "Research"}, "exec-eco")
        assert client.event("exec-eco", "tool.requested", ecosystem_payload(), seq=1) == 1
        assert client.event("exec-eco", "tool.requested", ecosystem_payload(), seq=1) == 1  # a resend
        assert client.finish("exec-eco", {"status": "success", "payload": ecosystem_payload()}, seq=2) == 2
        rec = client.get("exec-eco")
    assert [e.type for e in rec.events] == ["tool.requested", "FINAL_RESPONSE"]
    check_ecosystem_payload(rec.events[0].payload)
    check_ecosystem_payload(rec.finalResponse["payload"])
    code, err = srv.terminate()
    assert code == 0, err
    assert files_holding(tdir, *secrets) == {}
    assert [s for s in secrets if s in err] == []
