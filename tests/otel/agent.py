"""An agent instrumented the usual OpenTelemetry way, and nothing else: the SDK with its OTLP/HTTP
exporter (endpoint from OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, the recorder's token from
OTEL_EXPORTER_OTLP_HEADERS), the official OpenAI instrumentation,
the real `openai` client. Run as a process by the tests:

    python -m tests.otel.agent BASE_URL finish|hang

It asks a question, runs the tool the model asks for, asks again. With `hang` it flushes its
spans after the tool call and then waits to be killed, its root span never ended.
"""

import json
import sys
import time

import openai
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def instrumented(base_url: str, tracer_name: str):
    """The SDK with its OTLP/HTTP exporter and the OpenAI instrumentation, set up as an agent does:
    the provider, a tracer, and an OpenAI client on `base_url`."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    OpenAIInstrumentor().instrument()
    return provider, trace.get_tracer(tracer_name), openai.OpenAI(base_url=base_url, api_key="test")


def ask_and_run_tool(tracer, client, root, messages: list):
    """Print the trace id of `root`, ask the model, and run the tool it asks for in a span of its
    own; the model's answer and its tool call."""
    print(format(root.get_span_context().trace_id, "032x"), flush=True)
    first = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    with tracer.start_as_current_span(f"execute_tool {call.function.name}", attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.function.name,
        "gen_ai.tool.call.id": call.id, "gen_ai.tool.call.arguments": call.function.arguments,
        "gen_ai.tool.call.result": json.dumps({"sky": "sunny"}),
    }):
        pass
    return first, call


def ask_again(client, messages: list, first, call) -> None:
    """Ask the model again, with its tool call and the tool's result."""
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'}]
    client.chat.completions.create(model="gpt-4o-mini", messages=messages)


def main() -> None:
    base_url, mode = sys.argv[1], sys.argv[2]
    provider, tracer, client = instrumented(base_url, "weather-agent")
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Weather in Paris?"}]
    with tracer.start_as_current_span("answer_question") as root:
        first, call = ask_and_run_tool(tracer, client, root, messages)
        if mode == "hang":
            provider.force_flush()
            print("flushed", flush=True)
            time.sleep(600)
        ask_again(client, messages, first, call)
    provider.shutdown()


if __name__ == "__main__":
    main()
