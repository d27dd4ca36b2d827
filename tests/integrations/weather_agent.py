"""The Agents SDK agent the integration tests run: a triage agent with a weather tool that hands
off to a specialist with a clock tool. Its model is the fake server, scripted by `script`."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Any, Iterator

import openai
from agents import Agent, RunConfig, Runner, function_tool, set_trace_processors
from agents.models.openai_provider import OpenAIProvider

from tracedb.integrations.agents import TraceDBProcessor

QUESTION = "What is the weather and the time in Paris?"
FINAL = "It is sunny and it is noon in Paris."
WEATHER = {"Paris": "sunny"}  # what the weather tool answers; a test changes it to make a run diverge
TOOL_CALLS: list[str] = []  # every tool call made, in order
BEFORE_WEATHER: list = []  # functions the weather tool calls first (a test's way in mid-run)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    TOOL_CALLS.append(f"get_weather({city})")
    for fn in BEFORE_WEATHER:
        fn()
    return f"{WEATHER.get(city, 'unknown')} in {city}"


@function_tool
def get_time(city: str) -> str:
    """The local time in a city."""
    TOOL_CALLS.append(f"get_time({city})")
    return f"noon in {city}"


specialist = Agent(name="specialist", instructions="Answer with the weather and the time.", tools=[get_time])
triage = Agent(name="triage", instructions="Find the weather, then hand off.", tools=[get_weather],
               handoffs=[specialist])


def script(fake, *, stall_at_specialist: bool = False) -> None:
    """The model's four answers: call the weather tool, hand off, call the clock tool, answer."""
    fake.push_response(tool_calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}])
    fake.push_response(tool_calls=[{"name": "transfer_to_specialist", "arguments": {}}])
    if stall_at_specialist:
        fake.push_stall()
        return
    fake.push_response(tool_calls=[{"name": "get_time", "arguments": {"city": "Paris"}}])
    fake.push_response(FINAL)


def live_provider(base_url: str) -> OpenAIProvider:
    """The SDK's own OpenAI provider, pointed at the fake server."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
    return OpenAIProvider(openai_client=client)


def live_config(base_url: str) -> RunConfig:
    return RunConfig(model_provider=live_provider(base_url))


def run_live(fake):
    """The agent run on the fake server, scripted by `script`; the run's result."""
    script(fake)
    return asyncio.run(Runner.run(triage, QUESTION, run_config=live_config(fake.base_url)))


@contextmanager
def processing(recorder) -> Iterator[Any]:
    """tracedb's processor, recording into `recorder` (a store or a client), as the Agents SDK's
    only one for the block: nothing is exported to OpenAI."""
    p = TraceDBProcessor(recorder)
    set_trace_processors([p])
    try:
        yield p
    finally:
        set_trace_processors([])
        p.shutdown()


def replay_run(provider, *, streamed: bool = False, tracing: bool = False):
    """Run the agent on `provider` (tracing off unless asked), streamed or not; the run's result."""
    config = RunConfig(model_provider=provider, tracing_disabled=not tracing)
    if not streamed:
        return asyncio.run(Runner.run(triage, QUESTION, run_config=config))

    async def main():
        result = Runner.run_streamed(triage, QUESTION, run_config=config)
        async for _ in result.stream_events():
            pass
        return result

    return asyncio.run(main())
