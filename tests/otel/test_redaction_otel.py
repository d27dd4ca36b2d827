"""Redaction of what OpenTelemetry carries: captured headers (`http.request.header.*`), OpenInference
JSON text (`llm.invocation_parameters`), header lists and a tool call's arguments, from an agent
instrumented with the real SDK and the official OpenAI instrumentation, through OTLP into `tracedb
serve` and through the in-process exporter. Every byte of the data directory (WAL segments,
traces.db and its -wal, a backup) and of every export format is read for the secrets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import tracedb
from tests.fake_openai import FakeOpenAI
from tests.serving import ROOT
from tests.store.redaction_config import files_holding

from . import secret_agent as A
from .conftest import env_for, tracedb_cli

pytest.importorskip("opentelemetry.instrumentation.openai_v2")
pytestmark = pytest.mark.timeout(240)

REDACTED = "[REDACTED]"


def script_model(fake: FakeOpenAI) -> None:
    fake.push_chat(tool_calls=[{"name": "get_weather", "arguments": {"city": "Paris", "api_key": A.ARGUMENT_KEY}}])
    fake.push_chat("It is sunny in Paris.")


def exports_hold_no_secret(data_dir: str, eid: str) -> None:
    for fmt in ("tracedb", "intentusnet", "otlp-json"):
        out = tracedb_cli(data_dir, "export", "--all", "--format", fmt)
        assert out.returncode == 0, out.stderr
        assert eid.removeprefix("otel-") in out.stdout  # the execution is there, its secrets are not
        assert [s for s in A.SECRETS if s in out.stdout] == [], fmt


def check_record(rec: dict) -> None:
    """The secrets were there and are redacted where they were; the rest is kept."""
    root_attrs = rec["events"][-2]["payload"]["otel"]["attributes"]
    assert root_attrs["http.request.header.authorization"] == REDACTED
    assert root_attrs["http.response.header.set-cookie"] == REDACTED
    assert root_attrs["http.request.header.x-api-key"] == REDACTED
    assert root_attrs["http.request.header.accept"] == ["application/json"]
    assert json.loads(root_attrs["llm.invocation_parameters"]) == {
        "model": "gpt-4o-mini", "temperature": 0, "api_key": REDACTED}
    tool = next(e["payload"] for e in rec["events"] if e["type"] == "tool.requested")
    assert tool["arguments"] == {"city": "Paris", "api_key": REDACTED}
    fetch = next(e["payload"] for e in rec["events"]
                 if e["type"] == "otel.span" and e["payload"]["otel"]["name"] == "fetch_forecast")
    assert json.loads(fetch["otel"]["attributes"]["app.request.headers"]) == [
        ["Authorization", REDACTED], ["Accept", "application/json"]]
    # The model's tool call, as the OpenAI instrumentation recorded it in the output messages.
    call = rec["events"][1]["payload"]["response"]["messages"][0]["parts"][0]
    assert call["type"] == "tool_call" and call["name"] == "get_weather"
    args = call["arguments"] if isinstance(call["arguments"], dict) else json.loads(call["arguments"])
    assert args == {"city": "Paris", "api_key": REDACTED}
    assert rec["redacted"]  # trace get lists where


def test_an_instrumented_agent_through_otlp_leaves_no_secret_on_disk_or_in_any_export(otlp_serve, data_dir, tmp_path):
    srv = otlp_serve()
    with FakeOpenAI() as fake:
        script_model(fake)
        agent = subprocess.run(
            [sys.executable, "-m", "tests.otel.secret_agent", fake.base_url], cwd=ROOT, capture_output=True,
            text=True, timeout=120, env=env_for(
                data_dir, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=srv.endpoint, OTEL_EXPORTER_OTLP_HEADERS=srv.exporter_headers,
                OTEL_SERVICE_NAME="secret-agent",
                OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental",
                OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="SPAN_ONLY"))
        assert agent.returncode == 0, agent.stderr
        # The model really was asked with the key in its answer, and the key was really sent on.
        assert any(A.ARGUMENT_KEY in json.dumps(body) for body in fake.requests)
    eid = f"otel-{agent.stdout.split()[0]}"
    backup = str(tmp_path / "backup")
    assert tracedb_cli(data_dir, "backup", backup).returncode == 0  # next to the running recorder
    assert srv.stop() == 0  # compacts what is left
    out = tracedb_cli(data_dir, "trace", "get", eid, "--json")
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert rec["status"] == "completed"
    check_record(rec)
    assert tracedb_cli(data_dir, "compact").returncode == 0
    assert files_holding(data_dir, *A.SECRETS) == {}
    assert files_holding(backup, *A.SECRETS) == {}
    exports_hold_no_secret(data_dir, eid)


def test_the_in_process_exporter_redacts_the_same(tmp_path, monkeypatch):
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    import openai
    from tracedb.otel.exporter import TraceDBSpanExporter

    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    data_dir = str(tmp_path / "store")
    with tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store, FakeOpenAI() as fake:
        script_model(fake)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(TraceDBSpanExporter(store)))
        OpenAIInstrumentor().instrument(tracer_provider=provider)
        try:
            tracer = provider.get_tracer("secret-agent")
            client = openai.OpenAI(base_url=fake.base_url, api_key="test")
            with tracer.start_as_current_span("answer_question", attributes={
                "http.request.header.authorization": [f"Bearer {A.BEARER}"],
                "http.response.header.set-cookie": [f"sid={A.COOKIE}; HttpOnly"],
                "http.request.header.x-api-key": [A.HEADER_KEY],
                "http.request.header.accept": ["application/json"],
                "llm.invocation_parameters": json.dumps(
                    {"model": "gpt-4o-mini", "temperature": 0, "api_key": A.INVOCATION_KEY}),
            }) as root:
                first = client.chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": "Weather in Paris?"}],
                    tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])
                call = first.choices[0].message.tool_calls[0]
                with tracer.start_as_current_span("execute_tool get_weather", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
                    "gen_ai.tool.call.id": call.id, "gen_ai.tool.call.arguments": call.function.arguments,
                    "gen_ai.tool.call.result": "{}",
                }):
                    pass
                with tracer.start_as_current_span("fetch_forecast") as fetch:
                    fetch.set_attribute("app.request.headers", json.dumps(
                        [["Authorization", f"Bearer {A.PAIR_KEY}"], ["Accept", "application/json"]]))
                client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "and?"}])
            eid = f"otel-{root.get_span_context().trace_id:032x}"
        finally:
            OpenAIInstrumentor().uninstrument()
        store.compact()
        check_record(store.get(eid).to_dict())
        assert files_holding(data_dir, *A.SECRETS) == {}
    assert files_holding(data_dir, *A.SECRETS) == {}
    exports_hold_no_secret(data_dir, eid)
    assert os.path.exists(os.path.join(data_dir, "traces.db"))
