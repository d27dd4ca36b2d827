"""The in-process SpanExporter: the OpenTelemetry SDK records into an embedded store or a sidecar."""

from __future__ import annotations

import pytest

import tracedb
from tests.fake_openai import FakeOpenAI

from .conftest import record_of
from .spans import agent_run, trace_hex

pytest.importorskip("opentelemetry.sdk")
pytestmark = pytest.mark.timeout(180)


def provider_into(exporter, service: str = "inproc-agent"):
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def test_openai_instrumentation_records_into_an_embedded_store(tmp_path, monkeypatch):
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    import openai
    from tracedb.otel.exporter import TraceDBSpanExporter

    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    with tracedb.open(str(tmp_path / "store")) as store, FakeOpenAI() as fake:
        exporter = TraceDBSpanExporter(store)
        provider = provider_into(exporter)
        OpenAIInstrumentor().instrument(tracer_provider=provider)
        try:
            fake.push_chat("Paris.")
            tracer = provider.get_tracer("agent")
            with tracer.start_as_current_span("capital_question") as root:
                client = openai.OpenAI(base_url=fake.base_url, api_key="test")
                client.chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": "Capital of France?"}])
                eid = f"otel-{root.get_span_context().trace_id:032x}"
                # SimpleSpanProcessor: the chat span is durable before the call returns.
                mid = store.get(eid)
                assert mid.status == "running" and [e.type for e in mid.events] == ["llm.requested", "llm.responded"]
        finally:
            OpenAIInstrumentor().uninstrument()
        rec = store.get(eid)
        assert rec.status == "completed" and rec.intent == "inproc-agent"
        assert rec.events[0].payload["request"]["messages"][0]["parts"][0]["content"] == "Capital of France?"
        assert rec.events[1].payload["response"]["messages"][0]["parts"][0]["content"] == "Paris."
        assert rec.finalResponse["payload"]["span"] == "capital_question"
        assert tracedb.ReplayEngine(rec).replay().payload["span"] == "capital_question"
        # The same spans exported again (a processor retrying): nothing is written twice.
        spans = agent_run()
        assert exporter.export(spans).name == "SUCCESS"
        assert exporter.export(spans).name == "SUCCESS"
        again = store.get(f"otel-{trace_hex(spans)}")
        assert len(again.events) == 8 and again.status == "completed"
        provider.shutdown()  # the store is the caller's: still open
        assert store.get(eid).status == "completed"


def test_the_exporter_records_into_a_sidecar_and_a_fresh_exporter_does_not_duplicate(otlp_serve, data_dir):
    from tracedb.otel.exporter import TraceDBSpanExporter

    srv = otlp_serve()
    sidecar = f"unix:{srv.data_dir}/tracedb.sock"
    spans = agent_run()
    first = TraceDBSpanExporter(sidecar=sidecar)
    assert first.export(spans[:2]).name == "SUCCESS"
    first.shutdown()
    # Another exporter (another process, or this one restarted) sends the whole trace: the two
    # spans already stored are recognised by their ids, the rest is added.
    second = TraceDBSpanExporter(sidecar=sidecar)
    assert second.export(spans).name == "SUCCESS"
    assert second.rejected == []
    second.shutdown()
    rec = record_of(data_dir, f"otel-{trace_hex(spans)}")
    assert rec["status"] == "completed"
    assert [e["type"] for e in rec["events"]] == [
        "llm.requested", "llm.responded", "tool.requested", "tool.responded",
        "llm.requested", "llm.responded", "otel.invoke_agent", "FINAL_RESPONSE"]
    spans_ids = [e["payload"].get("span_id") for e in rec["events"][:-1]]
    assert len(set(spans_ids)) == 4


def test_spans_after_the_root_are_refused_not_recorded(tmp_path):
    from tracedb.otel.exporter import TraceDBSpanExporter

    spans = agent_run()
    with tracedb.open(str(tmp_path / "s")) as store:
        exporter = TraceDBSpanExporter(store)
        assert exporter.export(spans).name == "SUCCESS"
        late = agent_run()[:1]
        late[0]._context = late[0].context.__class__(
            trace_id=spans[0].context.trace_id, span_id=late[0].context.span_id, is_remote=False)
        assert exporter.export(late).name == "SUCCESS"
        assert len(exporter.rejected) == 1 and "completed" in exporter.rejected[0]
        assert len(store.get(f"otel-{trace_hex(spans)}").events) == 8


def test_event_log_replay_serves_the_recorded_llm_and_tool_answers(tmp_path):
    from tracedb.otel.exporter import TraceDBSpanExporter
    from tracedb.replay import ReplaySession

    spans = agent_run()
    with tracedb.open(str(tmp_path / "s")) as store:
        TraceDBSpanExporter(store).export(spans)
        rec = store.get(f"otel-{trace_hex(spans)}")
    session = ReplaySession(rec, strict=False)
    first = rec.events[0].payload["request"]
    answer = session.llm(first, call=lambda _r: pytest.fail("the model was called"))
    assert answer["messages"][0]["parts"][0]["name"] == "get_weather"
    result = session.tool("get_weather", {"city": "Paris"}, call=lambda _a: pytest.fail("the tool was called"))
    assert result == {"sky": "sunny"}


def test_a_span_with_status_error_marks_its_event_and_a_failed_root_fails_the_execution(tmp_path):
    from opentelemetry.trace import Status, StatusCode

    from tracedb.otel.exporter import TraceDBSpanExporter

    with tracedb.open(str(tmp_path / "store"), config={"compact_interval_ms": 0}) as store:
        provider = provider_into(TraceDBSpanExporter(store))
        tracer = provider.get_tracer("agent")
        with pytest.raises(TimeoutError):
            with tracer.start_as_current_span("plan_trip") as root:
                with tracer.start_as_current_span("execute_tool book_hotel", attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "book_hotel"}) as tool:
                    tool.set_status(Status(StatusCode.ERROR, "hotel API down"))
                    tool.set_attribute("error.type", "HotelApiError")
                raise TimeoutError("gave up after the hotel")
        eid = f"otel-{root.get_span_context().trace_id:032x}"
        rec = store.get(eid)
        tool_answer = next(e for e in rec.events if e.type == "tool.responded")
        assert tool_answer.error == {"code": "HotelApiError", "message": "hotel API down"}
        store.compact()
        [row] = store.list()
        assert row.outcome == "failed" and rec.finalResponse["status"] == "error"
        assert (row.error["seq"], row.error["code"], row.error["message"]) == (tool_answer.seq, "HotelApiError", "hotel API down")
