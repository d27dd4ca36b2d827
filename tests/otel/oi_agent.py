"""Agents instrumented with OpenInference, and nothing else tracedb-specific: Arize's
`openinference-instrumentation-openai` on the real `openai` client, and
`openinference-instrumentation-langchain` on a LangGraph ReAct graph over `langchain-openai`'s
`ChatOpenAI`. Both ask the fake OpenAI server for the weather, run the tool the model asks for,
and ask again.

Run as a process, exporting through the SDK's OTLP/HTTP exporter (endpoint from
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), it prints the trace id and the agent's answer:

    python -m tests.otel.oi_agent BASE_URL openai|langgraph

The tests also call `run(kind, base_url, provider)` in-process, with their own TracerProvider.
"""

from __future__ import annotations

import json
import sys

QUESTION = "Weather in Paris?"
ANSWER = "It is sunny in Paris."
WEATHER = {"sky": "sunny", "city": "Paris"}


def script(fake) -> None:
    """What the fake model answers: a tool call, then the answer."""
    fake.push_chat(tool_calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}])
    fake.push_chat(ANSWER)


def openai_agent(base_url: str, provider) -> tuple[str, str]:
    """A hand-written tool loop on the `openai` client; its own spans follow OpenInference too
    (an AGENT root, a TOOL span), as an OpenInference user's code would write them."""
    import openai
    from openinference.instrumentation.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=provider)
    try:
        tracer = provider.get_tracer("weather-agent")
        client = openai.OpenAI(base_url=base_url, api_key="test", max_retries=0)
        messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}]
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        with tracer.start_as_current_span("weather_agent", attributes={
            "openinference.span.kind": "AGENT", "agent.name": "WeatherBot",
            "input.value": QUESTION, "input.mime_type": "text/plain",
        }) as root:
            first = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools,
                                                   temperature=0.2)
            call = first.choices[0].message.tool_calls[0]
            with tracer.start_as_current_span(call.function.name, attributes={
                "openinference.span.kind": "TOOL", "tool.name": call.function.name, "tool_call.id": call.id,
                "input.value": call.function.arguments, "input.mime_type": "application/json",
                "output.value": json.dumps(WEATHER), "output.mime_type": "application/json",
            }):
                pass
            messages += [first.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": json.dumps(WEATHER)}]
            answer = client.chat.completions.create(model="gpt-4o-mini", messages=messages).choices[0].message.content
            root.set_attribute("output.value", answer)
            root.set_attribute("output.mime_type", "text/plain")
            trace_id = format(root.get_span_context().trace_id, "032x")
    finally:
        OpenAIInstrumentor().uninstrument()
    return trace_id, answer


def langgraph_agent(base_url: str, provider) -> tuple[str, str]:
    """A LangGraph ReAct loop (a model node, LangGraph's prebuilt ToolNode, and its
    tools_condition edge) with one tool; every span is the instrumentation's."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return json.dumps(dict(WEATHER, city=city))

    seen = InMemorySpanExporter()  # to learn the trace id the instrumentation gave the run
    provider.add_span_processor(SimpleSpanProcessor(seen))
    LangChainInstrumentor().instrument(tracer_provider=provider)
    try:
        llm = ChatOpenAI(model="gpt-4o-mini", base_url=base_url, api_key="test", max_retries=0).bind_tools([get_weather])
        graph = StateGraph(MessagesState)
        graph.add_node("agent", lambda state: {"messages": [llm.invoke(state["messages"])]})
        graph.add_node("tools", ToolNode([get_weather]))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        out = graph.compile().invoke({"messages": [("user", QUESTION)]})
    finally:
        LangChainInstrumentor().uninstrument()
    spans = seen.get_finished_spans()
    return format(spans[-1].context.trace_id, "032x"), out["messages"][-1].content


AGENTS = {"openai": openai_agent, "langgraph": langgraph_agent}


def run(kind: str, base_url: str, provider) -> tuple[str, str]:
    """Run one agent with spans going to `provider`; its trace id (hex) and answer."""
    return AGENTS[kind](base_url, provider)


def main() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    base_url, kind = sys.argv[1], sys.argv[2]
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace_id, answer = run(kind, base_url, provider)
    provider.shutdown()  # exports what is left, and waits for the recorder's 200
    print(trace_id, flush=True)
    print(answer, flush=True)


if __name__ == "__main__":
    main()
