"""An unmodified OpenTelemetry-instrumented agent (the official OpenAI instrumentation on the real
`openai` client, against a fake OpenAI server on 127.0.0.1) records into `tracedb serve` by its
endpoint and token alone; killed mid-trace, its execution is incomplete and not replayable."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from tests.fake_openai import FakeOpenAI
from tests.serving import ROOT
from tests.waiting import wait_until

from .conftest import env_for, record_of, tracedb_cli

pytest.importorskip("opentelemetry.instrumentation.openai_v2")
pytestmark = pytest.mark.timeout(180)


def agent_env(srv, data_dir: str) -> dict:
    return env_for(
        data_dir,
        # The one change to the agent: where its traces go, and the recorder's token.
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=srv.endpoint,
        OTEL_EXPORTER_OTLP_HEADERS=srv.exporter_headers,
        OTEL_SERVICE_NAME="weather-agent",
        # Messages ride on the spans (the instrumentation's default records no content).
        OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental",
        OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="SPAN_ONLY",
    )


def start_agent(fake: FakeOpenAI, srv, data_dir: str, mode: str) -> subprocess.Popen:
    fake.push_chat(tool_calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}])
    fake.push_chat("It is sunny in Paris.")
    return subprocess.Popen([sys.executable, "-m", "tests.otel.agent", fake.base_url, mode], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=agent_env(srv, data_dir))


def test_an_instrumented_openai_agent_records_by_setting_its_endpoint_and_token(otlp_serve, data_dir):
    srv = otlp_serve()
    with FakeOpenAI() as fake:
        agent = start_agent(fake, srv, data_dir, "finish")
        out, err = agent.communicate(timeout=120)
        assert agent.returncode == 0, err
        assert fake.request_count == 2
    tid = out.split()[0]
    rec = record_of(data_dir, f"otel-{tid}")
    assert rec["status"] == "completed" and rec["header"]["replayable"] is True
    assert rec["intent"] == "weather-agent"  # OTEL_SERVICE_NAME
    types = [e["type"] for e in rec["events"]]
    assert types == ["llm.requested", "llm.responded", "tool.requested", "tool.responded",
                     "llm.requested", "llm.responded", "otel.span", "FINAL_RESPONSE"]
    req1, resp1 = rec["events"][0]["payload"], rec["events"][1]["payload"]
    assert req1["request"]["model"] == "gpt-4o-mini" and req1["provider"] == "openai"
    roles = [m["role"] for m in req1["request"]["messages"]]
    assert "user" in roles
    texts = [p.get("content") for m in req1["request"]["messages"] for p in m["parts"]]
    assert "Weather in Paris?" in texts
    call = resp1["response"]["messages"][0]["parts"][0]
    assert call["type"] == "tool_call" and call["name"] == "get_weather"
    assert resp1["response"]["finish_reasons"] == ["tool_calls"]
    assert set(resp1["response"]["usage"]) == {"input_tokens", "output_tokens"}
    final = rec["events"][5]["payload"]["response"]["messages"][0]["parts"][0]["content"]
    assert final == "It is sunny in Paris."
    assert rec["events"][3]["payload"]["response"] == {"sky": "sunny"}
    assert rec["finalResponse"]["payload"]["span"] == "answer_question"
    out = tracedb_cli(data_dir, "replay", f"otel-{tid}", "--json")
    assert out.returncode == 0, out.stderr
    # The agent's answer: the root span has no output, so the last model response's.
    answer = json.loads(out.stdout)["payload"]
    assert answer["output"][0]["parts"][0]["content"] == "It is sunny in Paris."
    assert answer["output_from"] == "last_model_response"
    # Usage from the spans' gen_ai.usage.* attributes, the model priced (gpt-4o-mini).
    listed = json.loads(tracedb_cli(data_dir, "inspect", "--list", "--json").stdout)
    row = next(r for r in listed if r["execution_id"] == f"otel-{tid}")
    tokens_in = sum(e["payload"]["response"]["usage"]["input_tokens"] for e in rec["events"] if e["type"] == "llm.responded")
    assert (row["outcome"], row["error"], row["models"], row["input_tokens"]) == ("succeeded", None, ["gpt-4o-mini"], tokens_in)
    assert tokens_in > 0 and row["output_tokens"] > 0 and row["cost_usd"] > 0


def test_an_agent_records_with_the_token_command_the_recorder_logs(otlp_serve, data_dir):
    # The recorder logs how an exporter gets the token, reading it from its file (the log holds
    # no token): that command, run in the agent's shell, is all it needs besides the endpoint.
    srv = otlp_serve()
    prefix = "exporters send the token with: "
    wait_until(lambda: any(d.get("msg", "").startswith(prefix) for d in srv.log), 30, "the token command in the log")
    command = next(d["msg"] for d in srv.log if d.get("msg", "").startswith(prefix))[len(prefix):]
    assert command.startswith("export OTEL_EXPORTER_OTLP_HEADERS=") and srv.token not in command
    env = agent_env(srv, data_dir)
    del env["OTEL_EXPORTER_OTLP_HEADERS"]
    with FakeOpenAI() as fake:
        fake.push_chat(tool_calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}])
        fake.push_chat("It is sunny in Paris.")
        agent = subprocess.run(["bash", "-c", command + ' && exec "$0" -m tests.otel.agent "$1" finish',
                                sys.executable, fake.base_url],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert agent.returncode == 0, agent.stderr
    rec = record_of(data_dir, f"otel-{agent.stdout.split()[0]}")
    assert rec["status"] == "completed" and len(rec["events"]) == 8


def test_an_agent_killed_mid_trace_leaves_an_incomplete_execution_that_replay_refuses(otlp_serve, data_dir):
    srv = otlp_serve(env={"TRACEDB_IDLE_TIMEOUT_S": "1"})  # the idle sweeper runs every 0.1 s
    with FakeOpenAI() as fake:
        agent = start_agent(fake, srv, data_dir, "hang")
        tid = agent.stdout.readline().strip()
        assert agent.stdout.readline().strip() == "flushed", agent.stderr.read() if agent.poll() else ""
        agent.send_signal(signal.SIGKILL)
        agent.wait(30)
    eid = f"otel-{tid}"

    def incomplete() -> bool:
        out = tracedb_cli(data_dir, "inspect", eid, "--json")
        return out.returncode == 0 and '"incomplete"' in out.stdout

    wait_until(incomplete, 60, "the idle sweeper to close the killed agent's trace")
    rec = record_of(data_dir, eid)
    assert rec["status"] == "incomplete"
    assert rec["header"]["replayable"] is False
    assert rec["header"]["replayableReason"] == "execution_incomplete"
    # Everything the agent exported before it died is kept: the first LLM call and the tool.
    assert [e["type"] for e in rec["events"]] == ["llm.requested", "llm.responded", "tool.requested", "tool.responded"]
    out = tracedb_cli(data_dir, "replay", eid)
    assert out.returncode == 6
    assert "not replayable" in out.stderr or "execution_incomplete" in out.stderr
