"""`tracedb export --format otlp-json`: the spans given back, valid OTLP/JSON, readable again."""

from __future__ import annotations

import base64

import httpx
import orjson
import pytest

import tracedb

from .conftest import OtlpServe, record_of, tracedb_cli
from .spans import agent_run, protobuf_body, trace_hex

pytest.importorskip("opentelemetry.proto")
pytestmark = pytest.mark.timeout(180)


def as_proto(doc: dict):
    """Parse OTLP/JSON with protobuf's own parser (after turning the hex ids into the base64 its
    JSON mapping expects): any field name or type that OTLP does not define fails here."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    doc = orjson.loads(orjson.dumps(doc))
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in s:
                        s[key] = base64.b64encode(bytes.fromhex(s[key])).decode()
                for lk in s.get("links", ()):
                    for key in ("traceId", "spanId"):
                        lk[key] = base64.b64encode(bytes.fromhex(lk[key])).decode()
    return json_format.ParseDict(doc, ExportTraceServiceRequest(), ignore_unknown_fields=False)


def test_an_otel_execution_exports_its_spans_back(otlp_serve, data_dir, tmp_path):
    srv = otlp_serve()
    spans = agent_run()
    with httpx.Client(timeout=30, headers=srv.auth) as http:
        assert http.post(srv.endpoint, content=protobuf_body(spans),
                         headers={"Content-Type": "application/x-protobuf"}).status_code == 200
    eid = f"otel-{trace_hex(spans)}"
    assert record_of(data_dir, eid)["status"] == "completed"  # compacted: the export below reads it
    out = tracedb_cli(data_dir, "export", eid, "--format", "otlp-json")
    assert out.returncode == 0, out.stderr
    doc = orjson.loads(out.stdout)
    req = as_proto(doc)
    got = {s.span_id.hex(): s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans}
    assert len(got) == len(spans) == 4
    resource = {kv.key: kv.value.string_value for kv in req.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "test-agent"
    for orig in spans:
        s = got[format(orig.context.span_id, "016x")]
        assert s.trace_id.hex() == trace_hex(spans)
        assert s.name == orig.name
        assert s.start_time_unix_nano == orig.start_time and s.end_time_unix_nano == orig.end_time
        assert (s.parent_span_id.hex() or None) == (format(orig.parent.span_id, "016x") if orig.parent else None)
        attrs = {kv.key: kv.value for kv in s.attributes}
        assert set(attrs) == set(orig.attributes), orig.name
        for key, value in orig.attributes.items():
            v = attrs[key]
            if key.endswith("messages") or key.startswith("gen_ai.tool.call.a") or key.endswith(".result"):
                assert orjson.loads(v.string_value) == orjson.loads(value), key  # same JSON document
            elif isinstance(value, str):
                assert v.string_value == value
            elif isinstance(value, bool):
                assert v.bool_value == value
            elif isinstance(value, int):
                assert v.int_value == value
            elif isinstance(value, float):
                assert v.double_value == value
            else:
                assert [x.string_value for x in v.array_value.values] == list(value)
    assert req.resource_spans[0].scope_spans[0].scope.name == "tests.agent"

    # Readable again: the export, posted to another recorder as OTLP/JSON, records the same events.
    other = str(tmp_path / "other")
    srv2 = OtlpServe(other)
    try:
        with httpx.Client(timeout=30, headers=srv2.auth) as http:
            r = http.post(srv2.endpoint, content=out.stdout.encode(), headers={"Content-Type": "application/json"})
            assert r.status_code == 200 and r.json() == {}
        a, b = record_of(data_dir, eid), record_of(other, eid)
        assert [(e["type"], e["payload"]) for e in a["events"]] == [(e["type"], e["payload"]) for e in b["events"]]
        assert a["status"] == b["status"] == "completed"
    finally:
        srv2.kill()


def test_a_native_execution_exports_as_one_span_and_all_as_json_lines(tmp_path):
    d = str(tmp_path / "native")
    with tracedb.open(d) as store:
        ex = store.start("AnswerQuestion", {"intent": "AnswerQuestion"})
        ex.event("tool.requested", {"name": "search", "arguments": {"q": "x"}})
        ex.finish({"status": "success", "payload": {"answer": 42}})
        running = store.start("Other", {"intent": "Other"})
        running.event("myapp.step", {"n": 1})
    out = tracedb_cli(d, "export", "--all", "--format", "otlp-json")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2
    docs = {}
    for line in lines:
        req = as_proto(orjson.loads(line))
        (span,) = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
        docs[span.name] = span
    done = docs["AnswerQuestion"]
    assert [e.name for e in done.events] == ["tool.requested", "FINAL_RESPONSE"]
    payload = {kv.key: kv.value for kv in done.events[1].attributes}["tracedb.payload"].string_value
    assert orjson.loads(payload) == {"status": "success", "payload": {"answer": 42}}
    assert done.status.code == 1 and done.end_time_unix_nano >= done.start_time_unix_nano > 0
    closed = docs["Other"]  # closed as incomplete when the store closed
    assert closed.status.code == 2 and closed.status.message == "execution_incomplete"
