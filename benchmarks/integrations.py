"""The OpenAI integrations against the fake OpenAI server on 127.0.0.1 (tests/fake_openai.py).

- An Agents SDK run of `calls` model calls (a tool call each, then the answer): live against the
  fake server without tracing, live recorded by TraceDBProcessor, and replayed offline by
  ReplayModelProvider (with tracing off, and traced by the processor).
- The OpenAI SDK wrapper: one chat completion at a time, the bare client next to the recording
  one, the same server: the recording's cost per call (two events, each acknowledged after its
  fdatasync).

    python -c "from benchmarks import integrations as b; print(b.report_lines(b.run('/tmp')))"
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time

import openai
from agents import Agent, RunConfig, Runner, function_tool, set_trace_processors
from agents.models.openai_provider import OpenAIProvider

import tracedb
from tests.fake_openai import FakeOpenAI
from tracedb.integrations.agents import ReplayModelProvider, TraceDBProcessor
from tracedb.integrations.openai import record


@function_tool
def step(n: int) -> str:
    """Carry out step n."""
    return f"step {n} done"


AGENT = Agent(name="worker", instructions="Do the steps one by one, then report.", tools=[step])
QUESTION = "Run the steps."


def _script(fake: FakeOpenAI, calls: int) -> None:
    for n in range(calls - 1):
        fake.push_response(tool_calls=[{"name": "step", "arguments": {"n": n}}])
    fake.push_response(f"all {calls - 1} steps done")


def _timed_run(make_config, max_turns: int):
    """Wall time and final output of one run; the config (and any client) is made on the run's loop."""

    async def main():
        config, client = make_config()
        try:
            return (await Runner.run(AGENT, QUESTION, run_config=config, max_turns=max_turns)).final_output
        finally:
            if client is not None:
                await client.close()

    t0 = time.perf_counter()
    out = asyncio.run(main())
    return time.perf_counter() - t0, out


def agent_run(workdir: str, calls: int = 50, repeats: int = 5) -> dict:
    """Median wall times (s) of one `calls`-call run: live bare, live recorded, replayed."""
    d = tempfile.mkdtemp(dir=workdir)
    times: dict = {"live": [], "live_recorded": [], "replay": [], "replay_traced": []}
    outputs = set()
    try:
        with FakeOpenAI() as fake, tracedb.open(os.path.join(d, "data")) as store:

            def live(tracing: bool):
                def make():
                    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="bench", max_retries=0)
                    return RunConfig(model_provider=OpenAIProvider(openai_client=client),
                                     tracing_disabled=not tracing), client
                return make

            def replayed(tracing: bool):
                return lambda: (RunConfig(model_provider=ReplayModelProvider(store, eid),
                                          tracing_disabled=not tracing), None)

            processor = TraceDBProcessor(store)
            recorded = []
            try:
                for _ in range(repeats):
                    set_trace_processors([])
                    _script(fake, calls)
                    s, out = _timed_run(live(False), calls + 5)
                    times["live"].append(s)
                    outputs.add(out)
                    set_trace_processors([processor])
                    _script(fake, calls)
                    before = {r.execution_id for r in store.list()}
                    s, out = _timed_run(live(True), calls + 5)
                    times["live_recorded"].append(s)
                    outputs.add(out)
                    recorded.extend(r.execution_id for r in store.list() if r.execution_id not in before)
                requests = fake.request_count
                eid = recorded[-1]
                for _ in range(repeats):
                    set_trace_processors([])
                    s, out = _timed_run(replayed(False), calls + 5)
                    times["replay"].append(s)
                    outputs.add(out)
                    set_trace_processors([processor])
                    s, out = _timed_run(replayed(True), calls + 5)
                    times["replay_traced"].append(s)
                    outputs.add(out)
                replay_requests = fake.request_count - requests
                events = len(store.get(eid).events)
            finally:
                set_trace_processors([])
                processor.shutdown()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    out = {k: statistics.median(v) for k, v in times.items()}
    out.update(calls=calls, repeats=repeats, outputs=sorted(outputs), replay_requests=replay_requests,
               events_per_run=events)
    return out


def wrapper_overhead(workdir: str, calls: int = 300) -> dict:
    """Per-call latencies (s) of a chat completion: bare client, and recording into a store."""
    d = tempfile.mkdtemp(dir=workdir)
    try:
        with FakeOpenAI() as fake, tracedb.open(os.path.join(d, "data")) as store:
            bare = openai.OpenAI(base_url=fake.base_url, api_key="bench", max_retries=0)
            ex = store.start("Bench", {"intent": "Bench"})
            wrapped = record(bare, ex)
            messages = [{"role": "user", "content": "a question of about ten words, as prompts go"}]
            lat: dict = {"bare": [], "recorded": []}
            for client in (bare, wrapped, bare, wrapped):  # warm both, then measure interleaved halves
                client.chat.completions.create(model="m", messages=messages)
            for i in range(calls):
                for name, client in (("bare", bare), ("recorded", wrapped)) if i % 2 else (
                        ("recorded", wrapped), ("bare", bare)):
                    t0 = time.perf_counter()
                    client.chat.completions.create(model="m", messages=messages)
                    lat[name].append(time.perf_counter() - t0)
            ex.finish({"status": "success"})
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {name: sorted(v) for name, v in lat.items()}


def run(workdir: str, *, calls: int = 50, repeats: int = 5, overhead_calls: int = 300) -> dict:
    """Both measurements."""
    return {"agent_run": agent_run(workdir, calls, repeats), "wrapper": wrapper_overhead(workdir, overhead_calls)}


def _p(lat: list, q: float) -> float:
    return lat[min(len(lat) - 1, int(q * len(lat)))]


def report_lines(result: dict) -> list[str]:
    """The figures as printed lines."""
    a = result["agent_run"]
    lines = [
        f"  Agents SDK run of {a['calls']} model calls (a tool call each, then the answer), median of {a['repeats']}:",
        f"    live, fake server, no tracing          {a['live'] * 1e3:9.1f} ms",
        f"    live, recorded by TraceDBProcessor     {a['live_recorded'] * 1e3:9.1f} ms"
        f"   ({a['events_per_run']} events, each durable before its callback returned)",
        f"    replayed offline, tracing off          {a['replay'] * 1e3:9.1f} ms"
        f"   {a['live'] / a['replay']:.1f}x faster than live; {a['replay_requests']} requests reached the server",
        f"    replayed offline, traced and recorded  {a['replay_traced'] * 1e3:9.1f} ms",
        f"    final outputs seen: {a['outputs']}",
    ]
    w = result["wrapper"]
    b50, r50 = _p(w["bare"], 0.5), _p(w["recorded"], 0.5)
    b99, r99 = _p(w["bare"], 0.99), _p(w["recorded"], 0.99)
    lines += [
        f"  OpenAI SDK chat completion, one at a time, {len(w['bare'])} calls each:",
        f"    bare client                            p50 {b50 * 1e3:7.3f} ms   p99 {b99 * 1e3:7.3f} ms",
        f"    recording client (tracedb.open store)  p50 {r50 * 1e3:7.3f} ms   p99 {r99 * 1e3:7.3f} ms",
        f"    recording overhead per call            p50 {(r50 - b50) * 1e3:7.3f} ms"
        f"   (two events, each acknowledged after its fdatasync)",
    ]
    return lines
