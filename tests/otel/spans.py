"""Realistic GenAI spans made by the real OpenTelemetry SDK, and OTLP request bodies of them."""

from __future__ import annotations

import base64
import gzip

import orjson


def agent_run(question: str = "weather in Paris?", service: str = "test-agent", *, fail_tool: bool = False):
    """Finished SDK spans of one agent run: a chat that calls a tool, the tool, a second chat,
    under an `invoke_agent` root (children end first, as the SDK exports them)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Status, StatusCode

    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(mem))
    tracer = provider.get_tracer("tests.agent", "1.0")
    user = [{"role": "user", "parts": [{"type": "text", "content": question}]}]
    call = {"type": "tool_call", "id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}
    with tracer.start_as_current_span(
        "invoke_agent WeatherBot",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "WeatherBot"},
    ):
        with tracer.start_as_current_span("chat gpt-4o-mini", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "gpt-4o-mini", "gen_ai.request.temperature": 0.2,
            "gen_ai.input.messages": orjson.dumps(user).decode(),
            "gen_ai.output.messages": orjson.dumps([{"role": "assistant", "parts": [call], "finish_reason": "tool_calls"}]).decode(),
            "gen_ai.response.model": "gpt-4o-mini-2024", "gen_ai.response.id": "chatcmpl-1",
            "gen_ai.response.finish_reasons": ["tool_calls"],
            "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 7,
        }):
            pass
        with tracer.start_as_current_span("execute_tool get_weather", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
            "gen_ai.tool.call.id": "call_1", "gen_ai.tool.call.arguments": '{"city": "Paris"}',
            **({} if fail_tool else {"gen_ai.tool.call.result": '{"sky": "sunny"}'}),
        }) as tool:
            if fail_tool:
                tool.set_status(Status(StatusCode.ERROR, "weather service down"))
                tool.set_attribute("error.type", "TimeoutError")
        with tracer.start_as_current_span("chat gpt-4o-mini", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.output.messages": '[{"role": "assistant", "parts": [{"type": "text", "content": "It is sunny."}]}]',
            "gen_ai.usage.input_tokens": 30, "gen_ai.usage.output_tokens": 4,
        }):
            pass
    provider.shutdown()
    return list(mem.get_finished_spans())


def trace_hex(sdk_spans) -> str:
    return format(sdk_spans[0].context.trace_id, "032x")


def protobuf_body(sdk_spans) -> bytes:
    """The exact request body the official OTLP/HTTP exporter sends for these spans."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans(sdk_spans).SerializeToString()


def json_doc(sdk_spans) -> dict:
    """The same request in OTLP/JSON: protobuf's JSON mapping, ids as hex, enums as integers."""
    from google.protobuf import json_format
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    doc = json_format.MessageToDict(encode_spans(sdk_spans), use_integers_for_enums=True)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in s:
                        s[key] = base64.b64decode(s[key]).hex()
    return doc


def json_body(sdk_spans) -> bytes:
    return orjson.dumps(json_doc(sdk_spans))


def gz(body: bytes) -> bytes:
    return gzip.compress(body)
