"""OTLP/HTTP into a real `tracedb serve`: the official SDK exporter, raw protobuf and JSON bodies,
bad bodies, retries, restarts."""

from __future__ import annotations

import gzip
import os

import httpx
import orjson
import pytest

from tests.waiting import wait_until

from .conftest import record_of, sdk_provider, tracedb_cli
from .spans import agent_run, gz, json_body, json_doc, protobuf_body, trace_hex

pytest.importorskip("opentelemetry.proto")
pytestmark = pytest.mark.timeout(180)

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


def partial(resp: httpx.Response) -> tuple[int, str]:
    """(rejected spans, message) of a protobuf ExportTraceServiceResponse."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    r = ExportTraceServiceResponse()
    r.ParseFromString(resp.content)
    return r.partial_success.rejected_spans, r.partial_success.error_message


def _trace_of(body: bytes) -> str:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    return req.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()


def events_of(record: dict) -> list[tuple[str, dict]]:
    return [(e["type"], e["payload"]) for e in record["events"]]


def test_the_official_exporter_records_a_genai_trace_as_one_replayable_execution(otlp_serve, data_dir, monkeypatch):
    srv = otlp_serve()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", srv.exporter_headers)  # the token, as docs/otel.md says
    provider = sdk_provider(srv.endpoint, service="weather-service")
    tracer = provider.get_tracer("agent")
    with tracer.start_as_current_span("invoke_agent WeatherBot", attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "WeatherBot",
        "gen_ai.output.messages": '[{"role": "assistant", "parts": [{"type": "text", "content": "sunny"}]}]',
    }) as root:
        with tracer.start_as_current_span("chat gpt-4o-mini", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "text", "content": "weather?"}]}]',
            "gen_ai.output.messages": '[{"role": "assistant", "parts": [{"type": "text", "content": "sunny"}]}]',
            "gen_ai.usage.input_tokens": 5, "gen_ai.usage.output_tokens": 1,
        }):
            pass
        with tracer.start_as_current_span("execute_tool lookup", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
            "gen_ai.tool.call.arguments": '{"q": "Paris"}', "gen_ai.tool.call.result": '["sunny"]',
        }):
            pass
        with tracer.start_as_current_span("parse answer"):
            pass
    tid = format(root.get_span_context().trace_id, "032x")
    assert provider.force_flush(30_000)
    provider.shutdown()

    rec = record_of(data_dir, f"otel-{tid}")
    assert rec["status"] == "completed" and rec["header"]["replayable"] is True
    assert rec["intent"] == "weather-service"  # service.name, whatever the export order
    types = [t for t, _ in events_of(rec)]
    assert types == ["llm.requested", "llm.responded", "tool.requested", "tool.responded",
                     "otel.span", "otel.invoke_agent", "FINAL_RESPONSE"]
    ev = dict(zip(range(1, 8), events_of(rec)))
    assert ev[1][1]["request"]["model"] == "gpt-4o-mini"
    assert ev[1][1]["request"]["messages"][0]["parts"][0]["content"] == "weather?"
    assert ev[2][1]["request_seq"] == 1
    assert ev[2][1]["response"]["usage"] == {"input_tokens": 5, "output_tokens": 1}
    assert ev[2][1]["response"]["messages"][0]["parts"][0]["content"] == "sunny"
    assert ev[3][1]["name"] == "lookup" and ev[3][1]["arguments"] == {"q": "Paris"}
    assert ev[4][1]["response"] == ["sunny"] and ev[4][1]["request_seq"] == 3
    assert ev[5][1]["otel"]["name"] == "parse answer"
    assert rec["finalResponse"]["status"] == "success"
    assert rec["finalResponse"]["payload"]["output"][0]["parts"][0]["content"] == "sunny"

    out = tracedb_cli(data_dir, "replay", f"otel-{tid}", "--json")
    assert out.returncode == 0, out.stderr
    assert "sunny" in out.stdout


def test_children_before_their_root_in_separate_requests_make_one_execution(otlp_serve, data_dir):
    srv = otlp_serve()
    spans = agent_run(service="weather-service")
    children, root = spans[:-1], spans[-1:]
    tid = trace_hex(spans)
    with httpx.Client(timeout=30, headers=srv.auth) as http:
        for span in children:  # one request per child, as a SimpleSpanProcessor would
            r = http.post(srv.endpoint, content=protobuf_body([span]), headers=PB)
            assert r.status_code == 200, r.text
        mid = record_of(data_dir, f"otel-{tid}")
        assert mid["status"] == "running"
        assert mid["intent"] == "weather-service"  # service.name: known before the root arrives
        r = http.post(srv.endpoint, content=protobuf_body(root), headers=PB)
        assert r.status_code == 200 and partial(r) == (0, "")
    rec = record_of(data_dir, f"otel-{tid}")
    assert rec["status"] == "completed"
    assert [e["type"] for e in rec["events"]][-2:] == ["otel.invoke_agent", "FINAL_RESPONSE"]
    assert rec["finalResponse"]["payload"]["agent"] == "WeatherBot"


def test_the_same_batch_sent_twice_is_stored_once(otlp_serve, data_dir):
    srv = otlp_serve()
    spans = agent_run()
    half = spans[:2]  # the trace stays open: a retry of a batch of an unfinished trace
    body = protobuf_body(half)
    with httpx.Client(timeout=30, headers=srv.auth) as http:
        first = http.post(srv.endpoint, content=body, headers=PB)
        again = http.post(srv.endpoint, content=body, headers=PB)
        json_again = http.post(srv.endpoint, content=json_body(half), headers=JS)
    assert first.status_code == again.status_code == json_again.status_code == 200
    assert partial(again) == (0, "")
    assert json_again.json() == {}
    rec = record_of(data_dir, f"otel-{trace_hex(spans)}")
    span_ids = [e["payload"]["span_id"] for e in rec["events"] if e["type"].endswith("responded")]
    assert len(span_ids) == 2 and len(set(span_ids)) == 2
    assert len(rec["events"]) == 4


def test_json_and_gzip_bodies_are_recorded_and_answered_in_their_encoding(otlp_serve, data_dir):
    srv = otlp_serve()
    a, b = agent_run("one"), agent_run("two", fail_tool=True)
    with httpx.Client(timeout=30, headers=srv.auth) as http:
        r1 = http.post(srv.endpoint, content=json_body(a), headers=JS)
        r2 = http.post(srv.endpoint, content=gz(protobuf_body(b)), headers={**PB, "Content-Encoding": "gzip"})
    assert r1.status_code == 200 and r1.headers["content-type"].startswith("application/json")
    assert r2.status_code == 200 and r2.headers["content-type"] == "application/x-protobuf"
    ra = record_of(data_dir, f"otel-{trace_hex(a)}")
    assert ra["status"] == "completed"
    assert ra["events"][0]["payload"]["request"]["messages"][0]["parts"][0]["content"] == "one"
    rb = record_of(data_dir, f"otel-{trace_hex(b)}")
    tool = next(e["payload"] for e in rb["events"] if e["type"] == "tool.responded")
    assert tool["error"] == {"type": "TimeoutError", "message": "weather service down"}
    assert "response" not in tool


def test_bad_bodies_are_refused_and_the_receiver_keeps_serving(otlp_serve, data_dir):
    srv = otlp_serve()
    good = protobuf_body(agent_run())
    big = 17 << 20
    cases = [
        ("garbage protobuf", b"\xff\xfe not a protobuf \x00" * 10, PB, 400),
        ("truncated protobuf", good[: len(good) // 2], PB, 400),
        ("garbage JSON", b"{resourceSpans: nope", JS, 400),
        ("JSON that is not a trace export", b'{"resourceSpans": 7}', JS, 400),
        ("broken gzip", gz(good)[:-12] + b"\x00" * 12, {**PB, "Content-Encoding": "gzip"}, 400),
        ("truncated gzip", gz(good)[: len(gz(good)) // 2], {**PB, "Content-Encoding": "gzip"}, 400),
        ("not gzip at all", good, {**PB, "Content-Encoding": "gzip"}, 400),
        ("oversized body", b"\x00" * big, PB, 413),
        ("gzip that inflates past the limit", gzip.compress(b"\x00" * big), {**PB, "Content-Encoding": "gzip"}, 413),
        ("another content type", b"hello", {"Content-Type": "text/plain"}, 415),
    ]
    with httpx.Client(timeout=60, headers=srv.auth) as http:
        for what, body, headers, status in cases:
            r = http.post(srv.endpoint, content=body, headers=headers)
            assert r.status_code == status, (what, r.status_code, r.content[:200])
            if headers.get("Content-Type") == "application/json":
                assert r.json()["message"], what
            # Each refusal harms nothing: a good request right after it is recorded.
        r = http.post(srv.endpoint, content=good, headers=PB)
        assert r.status_code == 200
    assert srv.proc.poll() is None
    from tracedb.otel.mapping import EXECUTION_PREFIX

    record_of(data_dir, EXECUTION_PREFIX + _trace_of(good))  # compacted: the listing below sees it
    out = tracedb_cli(data_dir, "inspect", "--list", "--format", "json")
    rows = orjson.loads(out.stdout)
    assert [row["status"] for row in rows] == ["completed"]


def test_spans_with_bad_ids_or_for_a_closed_trace_are_a_partial_success(otlp_serve, data_dir):
    srv = otlp_serve()
    spans = agent_run()
    doc = json_doc(spans)
    bad = dict(doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0], traceId="abc", name="short id")
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"].append(bad)
    with httpx.Client(timeout=30, headers=srv.auth) as http:
        r = http.post(srv.endpoint, content=orjson.dumps(doc), headers=JS)
        assert r.status_code == 200
        ps = r.json()["partialSuccess"]
        assert ps["rejectedSpans"] == "1" and "traceId" in ps["errorMessage"]
        # A span arriving after its trace's root ended is refused; the trace is unchanged.
        late = agent_run()
        late_doc = json_doc(late[:1])
        late_doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = trace_hex(spans)
        r = http.post(srv.endpoint, content=orjson.dumps(late_doc), headers=JS)
        assert r.status_code == 200
        assert r.json()["partialSuccess"]["rejectedSpans"] == "1"
        assert "completed" in r.json()["partialSuccess"]["errorMessage"]
    rec = record_of(data_dir, f"otel-{trace_hex(spans)}")
    assert rec["status"] == "completed" and len(rec["events"]) == 8


def test_after_a_recorder_crash_stored_spans_are_acknowledged_again_and_the_trace_is_incomplete(otlp_serve, data_dir):
    spans = agent_run()
    tid = trace_hex(spans)
    srv = otlp_serve()
    with httpx.Client(timeout=30, headers=srv.auth) as http:
        assert http.post(srv.endpoint, content=protobuf_body(spans[:2]), headers=PB).status_code == 200
    srv.kill()  # SIGKILL: what was acknowledged is in the WAL
    srv = otlp_serve()  # recovery marks the unfinished trace incomplete
    with httpx.Client(timeout=30, headers=srv.auth) as http:
        # The exporter's retry of the acknowledged batch: stored already, acknowledged again.
        r = http.post(srv.endpoint, content=protobuf_body(spans[:2]), headers=PB)
        assert r.status_code == 200 and partial(r) == (0, "")
        # The rest of the trace: refused, its execution is closed.
        r = http.post(srv.endpoint, content=protobuf_body(spans[2:]), headers=PB)
        n, message = partial(r)
        assert r.status_code == 200 and n == 2 and "incomplete" in message
    rec = record_of(data_dir, f"otel-{tid}")
    assert rec["status"] == "incomplete" and rec["header"]["replayableReason"] == "execution_incomplete"
    assert len(rec["events"]) == 4
    out = tracedb_cli(data_dir, "replay", f"otel-{tid}")
    assert out.returncode == 6, out.stderr


def test_a_token_is_required_when_one_is_set_and_remote_needs_one(otlp_serve, data_dir, tmp_path):
    srv = otlp_serve(env={"TRACEDB_TOKEN": "s3cret"})
    body = protobuf_body(agent_run())
    with httpx.Client(timeout=30) as http:
        assert http.post(srv.endpoint, content=body, headers=PB).status_code == 401
        wrong = http.post(srv.endpoint, content=body, headers={**PB, "Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = http.post(srv.endpoint, content=body, headers={**PB, "Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
    other = str(tmp_path / "other")
    out = tracedb_cli(other, "serve", "--otlp-port", "0", "--otlp-host", "0.0.0.0")
    assert out.returncode != 0
    assert "error: refusing to serve OTLP on non-loopback address 0.0.0.0" in out.stderr
    assert "hint:" in out.stderr and "--allow-remote" in out.stderr


def test_a_busy_otlp_port_is_one_error_line(otlp_serve, data_dir, tmp_path):
    srv = otlp_serve()
    out = tracedb_cli(str(tmp_path / "other"), "serve", "--otlp-port", str(srv.port))
    assert out.returncode != 0
    assert "error: cannot listen on the OTLP port" in out.stderr and "Traceback" not in out.stderr


def test_without_the_otel_extra_otlp_port_says_what_to_install(tmp_path):
    import subprocess
    import sys

    from tests.serving import ROOT

    from .conftest import env_for

    code = (
        "import sys; sys.modules['opentelemetry.proto'] = None; "  # as if the package were absent
        "from tracedb.cli import main; "
        f"sys.argv = ['tracedb', '--data-dir', {str(tmp_path / 'd')!r}, 'serve', '--otlp-port', '0']; main()"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env=env_for(str(tmp_path / "d")), timeout=60)
    assert out.returncode == 1, out.stderr
    assert "error: the OTLP receiver needs the OpenTelemetry protocol package" in out.stderr
    assert (f"hint: install the otel extra: `scripts/setup otel` in a tracedb checkout, or "
            f"`{sys.executable} -m pip install 'tracedb[otel]'`") in out.stderr
    assert not (tmp_path / "d" / "wal").exists()  # refused before the store was opened


def test_a_span_that_cannot_be_stored_is_refused_whole_and_the_rest_recorded(otlp_serve, data_dir):
    import json

    srv = otlp_serve()
    spans = agent_run()
    doc = json_doc(spans)
    deep = {"stringValue": "x"}
    for _ in range(300):  # deeper than a stored JSON value may be
        deep = {"arrayValue": {"values": [deep]}}
    chat = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    chat["attributes"].append({"key": "app.deep", "value": deep})
    with httpx.Client(timeout=30, headers=srv.auth) as http:
        r = http.post(srv.endpoint, content=json.dumps(doc).encode(), headers=JS)
    assert r.status_code == 200
    ps = r.json()["partialSuccess"]
    assert ps["rejectedSpans"] == "1" and chat["spanId"] in ps["errorMessage"]
    rec = record_of(data_dir, f"otel-{trace_hex(spans)}")
    assert rec["status"] == "completed"
    assert all(e["payload"].get("span_id") != chat["spanId"] for e in rec["events"])  # not half of it
    assert [e["type"] for e in rec["events"]] == [
        "tool.requested", "tool.responded", "llm.requested", "llm.responded", "otel.invoke_agent", "FINAL_RESPONSE"]


def test_the_configuration_file_can_turn_the_receiver_on_and_otlp_host_needs_a_port(otlp_serve, data_dir, tmp_path):
    from .conftest import OtlpServe

    conf = tmp_path / "tracedb.toml"
    conf.write_text('[sidecar]\notlp_port = 0\notlp_host = "127.0.0.1"\n')
    srv = OtlpServe(str(tmp_path / "viaconf"), env={"TRACEDB_CONFIG": str(conf)}, otlp_args=())
    try:
        with httpx.Client(timeout=30, headers=srv.auth) as http:
            r = http.post(srv.endpoint, content=protobuf_body(agent_run()), headers=PB)
        assert r.status_code == 200
    finally:
        srv.kill()
    out = tracedb_cli(str(tmp_path / "other"), "serve", "--otlp-host", "127.0.0.1")
    assert out.returncode == 2 and "--otlp-host needs --otlp-port" in out.stderr


def test_a_request_whose_spans_are_all_refused_leaves_no_execution(otlp_serve, data_dir):
    srv = otlp_serve()
    tid = "11111111111111111111111111111112"
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": tid, "spanId": "1111111111111111", "name": "x", "startTimeUnixNano": "1",
        "endTimeUnixNano": "2", "attributes": [{"key": "a", "value": {"doubleValue": "NaN"}}]}]}]}]}
    with httpx.Client(timeout=30, headers=srv.auth) as http:
        r = http.post(srv.endpoint, content=orjson.dumps(doc), headers=JS)
        assert r.status_code == 200 and r.json()["partialSuccess"]["rejectedSpans"] == "1", r.text
        # The same trace's next, storable span starts the execution then.
        doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"] = [{"key": "a", "value": {"intValue": "1"}}]
        doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = "2222222222222222"
        # Asked of the recorder itself (a read of the database could come before compaction).
        from tracedb.errors import ExecutionNotFoundError
        from tracedb.sidecar.client import Client

        with Client("unix:" + os.path.join(data_dir, "tracedb.sock")) as client:
            with pytest.raises(ExecutionNotFoundError):
                client.get(f"otel-{tid}")
        r = http.post(srv.endpoint, content=orjson.dumps(doc), headers=JS)
        assert r.status_code == 200 and int(r.json().get("partialSuccess", {}).get("rejectedSpans", 0)) == 0, r.text
    rec = record_of(data_dir, f"otel-{tid}")
    assert [e["payload"].get("span_id") for e in rec["events"] if e["type"] != "FINAL_RESPONSE"] == ["2222222222222222"]
