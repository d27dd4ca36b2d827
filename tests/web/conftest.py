"""Fixtures for the web view: a store with every kind of execution, and `tracedb ui` running on
it as a real process on 127.0.0.1 (the tests talk to it over real sockets)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import orjson
import pytest

import tracedb
from tests.conftest import REPO
from tracedb.replay import fork, live_session

T0 = 1_764_000_000_000_000_000  # 2025-11-24T16:00:00Z
ENVELOPE = {"intent": "AnswerQuestion", "payload": {"question": "What is 17 * 23?"}}
XSS_INTENT = "<img src=x onerror=window.__pwned=1>"
XSS_PAYLOAD = {"html": "<script>window.__pwned=1</script>", "note": "a & b < c"}


class StepClock:
    """Each reading 7 ms after the one before: timelines with durations a person can read."""

    def __init__(self, start: int = T0, step_ns: int = 7_000_000):
        self.it = itertools.count(start, step_ns)

    def __call__(self) -> int:
        return next(self.it)


def _agent(ex, tool_result: dict, expression: str = "17 * 23") -> None:
    """One agent run through a live session: an LLM call, a tool call, an LLM call, the answer."""
    ex.event("INTENT_RECEIVED", {"intent": "AnswerQuestion"})
    session = live_session(
        ex,
        llm=lambda req: {"content": "calling the calculator"} if len(req["messages"]) == 1 else {"content": "391"},
        tools={"calculator": lambda args: tool_result},
    )
    messages = [{"role": "user", "content": "What is 17 * 23?"}]
    session.llm({"model": "demo-llm-1", "messages": messages})
    result = session.tool("calculator", {"expression": expression})
    messages.append({"role": "tool", "content": orjson.dumps(result).decode()})
    session.llm({"model": "demo-llm-1", "messages": messages})
    session.finish({"status": "success", "payload": {"answer": "391"}})


def record_failed(store) -> str:
    """An agent whose tool timed out, and which answered with an error."""
    ex = store.start("BookFlight", {"intent": "BookFlight", "payload": {"to": "LIS"}}, "exec-failed-0007")
    ex.event("INTENT_RECEIVED", {"intent": "BookFlight"})
    seq = ex.event("llm.requested", {"prompt_hash": "sha256:f1", "request": {"model": "gpt-4o-mini"}})
    ex.event("llm.responded", {"prompt_hash": "sha256:f1", "request_seq": seq, "response": {
        "model": "gpt-4o-mini", "content": "search flights",
        "usage": {"prompt_tokens": 1200, "completion_tokens": 80, "total_tokens": 1280}}})
    seq = ex.event("tool.requested", {"name": "search_flights", "arguments": {"to": "LIS"}})
    ex.event("tool.responded", {"name": "search_flights", "request_seq": seq,
                                "error": {"code": "TOOL_TIMEOUT", "message": "search_flights timed out after 30 s"}})
    ex.finish({"status": "error", "error": {"code": "TOOL_TIMEOUT", "message": "search_flights timed out after 30 s"}})
    return ex.execution_id


def record_otel_trace(store) -> str:
    """A GenAI-instrumented agent's trace through the OpenTelemetry SDK and tracedb's exporter:
    an agent span over two model calls and two tool calls, the first of which failed."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import Status, StatusCode, set_span_in_context

    from tracedb.otel.exporter import TraceDBSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": "TravelPlanner"}))
    provider.add_span_processor(SimpleSpanProcessor(TraceDBSpanExporter(store)))
    tracer = provider.get_tracer("travel-agent")
    ms = 1_000_000
    t0 = T0 + 3_600_000 * ms

    def chat(parent, start, end, input_tokens, output_tokens):
        s = tracer.start_span("chat gpt-4o-mini", context=parent, start_time=t0 + start * ms, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": output_tokens})
        s.end(end_time=t0 + end * ms)

    def tool(parent, start, end, error=None):
        s = tracer.start_span("execute_tool search_flights", context=parent, start_time=t0 + start * ms, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_flights",
            "gen_ai.tool.call.arguments": '{"to": "LIS"}'})
        if error:
            s.set_status(Status(StatusCode.ERROR, error))
            s.set_attribute("error.type", "TimeoutError")
        else:
            s.set_attribute("gen_ai.tool.call.result", '{"flights": 3}')
        s.end(end_time=t0 + end * ms)

    root = tracer.start_span("invoke_agent TravelPlanner", start_time=t0, attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "TravelPlanner"})
    ctx = set_span_in_context(root)
    chat(ctx, 40, 820, 950, 42)
    tool(ctx, 850, 1850, error="search_flights timed out")
    tool(ctx, 1900, 2300)
    chat(ctx, 2350, 3100, 1320, 96)
    root.end(end_time=t0 + 3150 * ms)
    provider.shutdown()
    return "otel-" + format(root.get_span_context().trace_id, "032x")


def build_store(data_dir: str) -> dict:
    """A store holding: two completed agent runs that differ at their tool call, a fork of
    the first at seq 3, one left running when its recorder stopped (incomplete), an
    invalidated one, and one whose intent and payload carry HTML. Returns their ids."""
    ids = {}
    with tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0}, clock=StepClock()) as store:
        ex = store.start("AnswerQuestion", ENVELOPE, "exec-ok-0001")
        _agent(ex, {"value": 391})
        ids["ok"] = ex.execution_id
        ex = store.start("AnswerQuestion", ENVELOPE, "exec-other-0002")
        _agent(ex, {"value": 408}, "17 * 24")
        ids["other"] = ex.execution_id
        f = fork(store, ids["ok"], 3, new_execution_id="exec-fork-0003")
        f.execution.event("tool.requested", {"name": "calculator", "arguments": {"expression": "17 * 24"}})
        f.execution.finish({"status": "success", "payload": {"answer": "408"}})
        ids["fork"] = "exec-fork-0003"
        ex = store.start("Summarize", {"intent": "Summarize", "payload": {"doc": 7}}, "exec-bad-0004")
        ex.event("INTENT_RECEIVED", {"intent": "Summarize"})
        ex.finish({"status": "success", "payload": {"summary": "short"}})
        store.invalidate(ex.execution_id, "wrong model <b>v2</b>")
        ids["invalidated"] = ex.execution_id
        ex = store.start(XSS_INTENT, {"intent": "x", "payload": XSS_PAYLOAD}, "exec-xss-0005")
        ex.event("myapp.html", XSS_PAYLOAD)
        ex.finish({"status": "success", "payload": XSS_PAYLOAD})
        ids["xss"] = ex.execution_id
        ids["otel"] = record_otel_trace(store)
        ids["failed"] = record_failed(store)
        ex = store.start("AnswerQuestion", ENVELOPE, "exec-crash-0006")
        ex.event("INTENT_RECEIVED", {"intent": "AnswerQuestion"})
        ex.event("llm.requested", {"prompt_hash": "sha256:1", "request": {"model": "demo-llm-1"}})
        ex.event("llm.responded", {"prompt_hash": "sha256:1", "request_seq": 2, "response": {"content": "fx"}})
        ex.event("tool.requested", {"name": "fx_rate", "arguments": {"pair": "EUR/USD"}})
        ids["crashed"] = ex.execution_id  # still running at close: marked incomplete
    return ids


class SetClock:
    """A clock an execution is started at (`at`), each reading then some ms after the one before."""

    def __init__(self, rng):
        self.rng = rng
        self.now = T0

    def at(self, ns: int) -> None:
        self.now = ns

    def __call__(self) -> int:
        self.now += self.rng.randint(40, 900) * 1_000_000
        return self.now


FLEET_DAYS = 14
MIDNIGHT = T0 - 16 * 3_600 * 10**9  # 2025-11-24T00:00:00Z


def build_fleet_store(data_dir: str) -> dict:
    """Two weeks of a small fleet: a few executions an hour apart each day, three intents, three
    models (one the price table does not know), some failing with a tool timeout or a rate limit,
    some left incomplete. Returns {"executions": n, "failed": n}."""
    import random

    rng = random.Random(29)
    clock = SetClock(rng)
    counts = {"executions": 0, "failed": 0}
    models = ["gpt-4o-mini", "gpt-4o", "local-llama-3"]
    with tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0}, clock=clock) as store:
        for day in range(FLEET_DAYS):
            for n in range(rng.randint(4, 4 + day)):
                clock.at(MIDNIGHT + day * 86_400 * 10**9 + n * 3_600 * 10**9)
                intent = rng.choice(["AnswerQuestion", "BookFlight", "Summarize"])
                ex = store.start(intent, {"intent": intent, "payload": {"n": n}})
                ex.event("INTENT_RECEIVED", {"intent": intent})
                for call in range(rng.randint(1, 3)):
                    model = rng.choices(models, weights=(6, 3, 1))[0]
                    seq = ex.event("llm.requested", {"prompt_hash": f"sha256:{day}{n}{call}", "request": {"model": model}})
                    ex.event("llm.responded", {"prompt_hash": f"sha256:{day}{n}{call}", "request_seq": seq, "response": {
                        "model": model, "content": "ok", "usage": {"prompt_tokens": rng.randint(300, 4000),
                                                                 "completion_tokens": rng.randint(20, 600)}}})
                seq = ex.event("tool.requested", {"name": "search", "arguments": {"n": n}})
                fate = rng.random()
                counts["executions"] += 1
                if fate < 0.06:
                    continue  # left running: incomplete once the store closes
                if fate < 0.2 + day * 0.01:
                    code = rng.choice(["TOOL_TIMEOUT", "RATE_LIMITED"])
                    error = {"code": code, "message": f"search failed: {code.lower().replace('_', ' ')}"}
                    ex.event("tool.responded", {"name": "search", "request_seq": seq, "error": error})
                    ex.finish({"status": "error", "error": error})
                    counts["failed"] += 1
                else:
                    ex.event("tool.responded", {"name": "search", "request_seq": seq, "response": {"hits": 3}})
                    ex.finish({"status": "success", "payload": {"answer": "ok"}})
    return counts


@pytest.fixture(scope="session")
def fleet_ui(tmp_path_factory):
    """`tracedb ui` on two weeks of a fleet's executions; (base URL, counts)."""
    from concurrent.futures import ThreadPoolExecutor

    data_dir = str(tmp_path_factory.mktemp("fleet") / "data")
    with ThreadPoolExecutor(1) as t:  # not in the event loop of a browser test's Playwright
        counts = t.submit(build_fleet_store, data_dir).result(300)
    proc = UiProcess("--data-dir", data_dir)
    yield proc.url, counts
    assert proc.stop() == 0


@pytest.fixture(scope="session")
def web_store(tmp_path_factory) -> tuple[str, dict]:
    data_dir = str(tmp_path_factory.mktemp("web") / "data")
    return data_dir, build_store(data_dir)


# The token each running view printed, by its base URL: what the owner's requests carry.
TOKENS: dict[str, str] = {}


def owner_get(url: str, **kw) -> httpx.Response:
    """GET as the owner's scripts do: with the view's token (Authorization: Bearer), unless the
    request names its own Authorization."""
    headers = dict(kw.pop("headers", None) or {})
    token = next((t for base, t in TOKENS.items() if url.startswith(base)), None)
    if token and "authorization" not in {k.lower() for k in headers}:
        headers["authorization"] = f"Bearer {token}"
    return httpx.get(url, headers=headers, timeout=30, **kw)


def with_token(url: str) -> str:
    """`url` carrying its view's token once, as the address `tracedb ui` prints does: what a
    browser opens first (the view turns it into a cookie and redirects without it)."""
    token = next(t for base, t in TOKENS.items() if url.startswith(base))
    return url + ("&" if "?" in url else "?") + urlencode({"token": token})


class UiProcess:
    """`tracedb ui --port 0 --json` in a process of its own; `printed` is the address it printed,
    `url` the same without its token, `token` the token (None with --trust-local-users)."""

    def __init__(self, *args: str, ui_args: tuple = (), env: dict | None = None, cwd: str | None = None):
        full_env = dict(os.environ, **(env or {}))
        full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
        full_env.pop("TRACEDB_TOKEN", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tracedb", *args, "ui", "--port", "0", "--json", *ui_args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env, cwd=cwd or REPO,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"tracedb ui did not start: {self.proc.stderr.read()}")
        self.printed = orjson.loads(line)["url"]
        parts = urlsplit(self.printed)
        self.url = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        self.token = dict(parse_qsl(parts.query)).get("token")
        self.port = parts.port
        if self.token:
            TOKENS[self.url] = self.token

    def stop(self) -> int:
        """SIGTERM, then the exit status; what it wrote on stderr is kept in `stderr_text`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        TOKENS.pop(self.url, None)
        self.stderr_text = self.proc.stderr.read()
        for f in (self.proc.stdout, self.proc.stderr):
            f.close()
        return code


@pytest.fixture(scope="session")
def ui(web_store):
    """`tracedb ui` on the web store; (base URL, ids)."""
    data_dir, ids = web_store
    # A relative data directory, as a person types it: the replay command a page offers names it.
    proc = UiProcess("--data-dir", os.path.basename(data_dir), cwd=os.path.dirname(data_dir))
    yield proc.url, ids
    assert proc.stop() == 0
