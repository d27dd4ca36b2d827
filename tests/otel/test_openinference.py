"""OpenInference spans (Arize's instrumentations) become the same `llm.*` and `tool.*` events as
spans of the GenAI conventions: the real instrumentations, the real `openai` client, LangChain and
LangGraph, against the fake OpenAI server on 127.0.0.1; into a real `tracedb serve --otlp-port`
and, in-process, through `TraceDBSpanExporter`."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import orjson
import pytest

import tracedb
from tests.fake_openai import FakeOpenAI
from tests.serving import ROOT
from tracedb.records.spans import span_tree

from . import oi_agent
from .conftest import env_for, record_of, tracedb_cli

pytest.importorskip("openinference.instrumentation.openai")
pytest.importorskip("openinference.instrumentation.langchain")
pytestmark = pytest.mark.timeout(180)

CALLS = ["llm.requested", "llm.responded", "tool.requested", "tool.responded", "llm.requested", "llm.responded"]


def texts(messages: list, part_type: str = "text") -> list:
    return [p.get("content") for m in messages for p in m["parts"] if p["type"] == part_type]


def check_openai_agent(rec: dict) -> None:
    """What the OpenInference-instrumented `openai` agent's execution holds."""
    types = [e["type"] for e in rec["events"]]
    assert types == [*CALLS, "otel.invoke_agent", "FINAL_RESPONSE"]
    req1, resp1, tool_req, tool_resp, req2, resp2 = (e["payload"] for e in rec["events"][:6])
    assert req1["request"]["model"] == "gpt-4o-mini" and req1["provider"] == "openai"
    assert req1["request"]["temperature"] == 0.2
    assert req1["request"]["messages"] == [
        {"role": "system", "parts": [{"type": "text", "content": "Answer briefly."}]},
        {"role": "user", "parts": [{"type": "text", "content": oi_agent.QUESTION}]},
    ]
    call = resp1["response"]["messages"][0]["parts"][0]
    assert call == {"type": "tool_call", "id": call["id"], "name": "get_weather", "arguments": {"city": "Paris"}}
    assert resp1["response"]["finish_reasons"] == ["tool_calls"]
    assert resp1["response"]["usage"]["input_tokens"] > 0 and resp1["response"]["usage"]["output_tokens"] > 0
    assert resp1["request_seq"] == 1
    assert tool_req == {"name": "get_weather", "arguments": {"city": "Paris"}, "call_id": call["id"],
                        "span_id": tool_req["span_id"], "parent_span_id": tool_req["parent_span_id"]}
    assert tool_resp["response"] == oi_agent.WEATHER
    # The second call's input: the tool call and its result, as messages.
    roles = [m["role"] for m in req2["request"]["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]
    assert req2["request"]["messages"][3]["parts"] == [
        {"type": "tool_call_response", "id": call["id"], "response": json.dumps(oi_agent.WEATHER)}]
    assert texts(resp2["response"]["messages"]) == [oi_agent.ANSWER]
    assert resp2["response"]["usage"]["total_tokens"] == (
        resp2["response"]["usage"]["input_tokens"] + resp2["response"]["usage"]["output_tokens"])
    assert rec["finalResponse"]["payload"]["output"] == oi_agent.ANSWER
    assert rec["finalResponse"]["payload"]["agent"] == "WeatherBot"
    # Nested as it ran: the agent span, its two model calls and its tool call under it.
    tree = span_tree(SimpleNamespace(**e) for e in rec["events"])
    (root,) = tree.roots
    assert (tree.nodes[root].name, tree.nodes[root].kind, tree.nodes[root].seqs) == ("weather_agent", "agent", (7,))
    calls = [tree.nodes[c] for c in tree.nodes[root].children]
    assert [(n.kind, n.seqs, n.parent_id) for n in calls] == [("llm", (1, 2), root), ("tool", (3, 4), root),
                                                              ("llm", (5, 6), root)]


def check_langgraph_agent(rec: dict) -> None:
    """What the LangGraph ReAct agent's execution holds: its LLM and tool calls as llm.* and
    tool.* events in order, every other span (the graph, its nodes) as otel.chain / agent."""
    types = [e["type"] for e in rec["events"]]
    assert [t for t in types if t.startswith(("llm.", "tool."))] == CALLS
    assert set(types) - set(CALLS) <= {"otel.chain", "otel.invoke_agent", "FINAL_RESPONSE"}
    assert types[-2:] == ["otel.chain", "FINAL_RESPONSE"]  # the graph's root span, then its end
    calls = [e["payload"] for e in rec["events"] if e["type"] in CALLS]
    req1, resp1, tool_req, tool_resp, req2, resp2 = calls
    assert req1["request"]["model"] == "gpt-4o-mini" and req1["provider"] == "openai"
    assert req1["request"]["messages"] == [{"role": "user", "parts": [{"type": "text", "content": oi_agent.QUESTION}]}]
    call = resp1["response"]["messages"][0]["parts"][0]
    assert (call["type"], call["name"], call["arguments"]) == ("tool_call", "get_weather", {"city": "Paris"})
    assert set(resp1["response"]["usage"]) >= {"input_tokens", "output_tokens"}
    assert tool_req["name"] == "get_weather"
    assert tool_resp["response"]["data"]["content"] == json.dumps(oi_agent.WEATHER)  # LangChain's ToolMessage
    tool_msg = req2["request"]["messages"][2]
    assert tool_msg["role"] == "tool" and tool_msg["name"] == "get_weather"
    assert tool_msg["parts"][0]["type"] == "tool_call_response" and tool_msg["parts"][0]["id"] == call["id"]
    assert texts(resp2["response"]["messages"]) == [oi_agent.ANSWER]
    # The final response is the graph's output: its state, whose last message is the answer.
    final = rec["finalResponse"]["payload"]["output"]["messages"][-1]
    assert final["data"]["content"] == oi_agent.ANSWER


CHECKS = {"openai": check_openai_agent, "langgraph": check_langgraph_agent}


@pytest.mark.parametrize("kind", ["openai", "langgraph"])
def test_an_openinference_agent_records_llm_and_tool_events_into_tracedb_serve(otlp_serve, data_dir, kind):
    srv = otlp_serve()
    with FakeOpenAI() as fake:
        oi_agent.script(fake)
        env = env_for(data_dir, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=srv.endpoint, OTEL_EXPORTER_OTLP_HEADERS=srv.exporter_headers,
                      OTEL_SERVICE_NAME="weather-agent")
        agent = subprocess.run([sys.executable, "-m", "tests.otel.oi_agent", fake.base_url, kind], cwd=ROOT,
                               capture_output=True, text=True, env=env, timeout=150)
        assert agent.returncode == 0, agent.stderr
        assert fake.request_count == 2
    trace_id, answer = agent.stdout.split("\n", 1)
    assert answer.strip() == oi_agent.ANSWER
    rec = record_of(data_dir, f"otel-{trace_id}")
    assert rec["status"] == "completed" and rec["intent"] == "weather-agent"
    CHECKS[kind](rec)
    out = tracedb_cli(data_dir, "replay", f"otel-{trace_id}", "--json")
    assert out.returncode == 0, out.stderr
    assert oi_agent.ANSWER in out.stdout  # the agent's final answer, given back with no agent run


@pytest.mark.parametrize("kind", ["openai", "langgraph"])
def test_an_openinference_agent_records_in_process_through_the_span_exporter(tmp_path, kind):
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from tracedb.otel.exporter import TraceDBSpanExporter

    with tracedb.open(str(tmp_path / "store")) as store, FakeOpenAI() as fake:
        oi_agent.script(fake)
        provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
        provider.add_span_processor(BatchSpanProcessor(TraceDBSpanExporter(store)))
        trace_id, answer = oi_agent.run(kind, fake.base_url, provider)
        provider.shutdown()
        assert answer == oi_agent.ANSWER
        rec = store.get(f"otel-{trace_id}")
        assert rec.status == "completed"
        CHECKS[kind](rec.to_dict())
        replayed = tracedb.ReplayEngine(rec).replay().payload
        assert oi_agent.ANSWER in orjson.dumps(replayed).decode()


def test_both_conventions_give_the_same_events_for_the_same_calls(monkeypatch):
    """The official GenAI instrumentation and OpenInference's, on the same two calls: the events'
    model, messages, tool call, parameters and token counts are equal."""
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as GenAIInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from openinference.instrumentation.openai import OpenAIInstrumentor as OIInstrumentor

    import openai
    from tracedb.otel import mapping as M

    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")

    def events_of(instrumentor) -> list:
        mem = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(mem))
        instrumentor.instrument(tracer_provider=provider)
        try:
            with FakeOpenAI() as fake:
                oi_agent.script(fake)
                client = openai.OpenAI(base_url=fake.base_url, api_key="test", max_retries=0)
                messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Weather?"}]
                tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
                first = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools,
                                                       temperature=0.2, max_tokens=50, seed=7)
                call = first.choices[0].message.tool_calls[0]
                messages += [first.choices[0].message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'}]
                client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        finally:
            instrumentor.uninstrument()
        return [ev for s in M.spans_from_sdk(mem.get_finished_spans()) for ev in M.span_events(s)]

    genai, oi = events_of(GenAIInstrumentor()), events_of(OIInstrumentor())
    assert [t for t, _ in genai] == [t for t, _ in oi] == ["llm.requested", "llm.responded"] * 2

    def comparable(type_: str, payload: dict) -> dict:
        if type_ == "llm.requested":
            return {"provider": payload.get("provider"), "request": payload["request"]}
        r = payload["response"]
        return {"model": r["model"], "messages": r["messages"], "finish_reasons": list(r.get("finish_reasons", ())),
                "usage": {k: r["usage"][k] for k in ("input_tokens", "output_tokens")}}

    for (t, g), (_, o) in zip(genai, oi):
        assert comparable(t, g) == comparable(t, o)
    assert genai[0][1]["request"]["max_tokens"] == 50 and genai[0][1]["request"]["seed"] == 7
