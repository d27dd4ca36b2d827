"""The Anthropic SDK wrapper: record through the client's httpx transport, replay with no network.

Every test runs the real `anthropic` client against the fake Messages API on 127.0.0.1 and
records into a real store; replays are checked by the fake server's request count, which must
not move, or with the server stopped.
"""

from __future__ import annotations

import asyncio
import json

import pytest

import tracedb
from tests.fake_anthropic import FakeAnthropic
from tracedb.errors import NotReplayableError, ReplayDivergenceError, UsageError

anthropic = pytest.importorskip("anthropic")

from tracedb.integrations.anthropic import Replay, RecordingTransport, record, replay  # noqa: E402

ENVELOPE = {"intent": "AnswerQuestion"}
MODEL = "claude-fake-1"
WEATHER_TOOL = {"name": "get_weather", "description": "The weather in a city.",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def client_of(server: FakeAnthropic, cls=None, **kw):
    cls = cls or anthropic.Anthropic
    return cls(base_url=server.base_url, api_key="sk-ant-test-secret", **{"max_retries": 0, **kw})


def ask(client, text: str, **kw) -> str:
    m = client.messages.create(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": text}], **kw)
    return "".join(b.text for b in m.content if b.type == "text")


def streamed(client, text: str) -> list[str]:
    with client.messages.stream(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": text}]) as s:
        return list(s.text_stream)


def weather_agent(client, question: str = "Weather in Paris?") -> tuple[str, list]:
    """A tool-use loop: the model asks for get_weather, the agent runs it and hands back a
    tool_result, the model answers. Returns the answer and the tool inputs it ran."""
    messages = [{"role": "user", "content": question}]
    ran = []
    while True:
        m = client.messages.create(model=MODEL, max_tokens=200, messages=messages, tools=[WEATHER_TOOL])
        if m.stop_reason != "tool_use":
            return "".join(b.text for b in m.content if b.type == "text"), ran
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
        results = []
        for block in m.content:
            if block.type == "tool_use":
                ran.append(block.input)
                results.append({"type": "tool_result", "tool_use_id": block.id,
                                "content": json.dumps({"sky": "sunny", "city": block.input["city"]})})
        messages.append({"role": "user", "content": results})


def test_a_recorded_message_replays_with_the_server_stopped(store, fake_anthropic):
    fake_anthropic.push_message("Paris is the capital.", cache_read=40, cache_creation=8)
    ex = store.start("AnswerQuestion", ENVELOPE)
    live = ask(record(client_of(fake_anthropic), ex), "Capital of France?", system="Be brief.")
    ex.finish({"status": "success", "payload": {"answer": live}})
    assert live == "Paris is the capital." and fake_anthropic.request_count == 1
    assert fake_anthropic.api_keys == ["sk-ant-test-secret"]

    rec = store.get(ex.execution_id)
    assert [e.type for e in rec.events] == ["llm.requested", "llm.responded", "FINAL_RESPONSE"]
    req, resp = rec.events[0].payload, rec.events[1].payload
    assert req["request"]["path"] == "/v1/messages" and req["request"]["model"] == MODEL
    assert req["request"]["body"]["messages"] == [{"role": "user", "content": "Capital of France?"}]
    assert req["request"]["body"]["system"] == "Be brief."
    assert "sk-ant-test-secret" not in str(rec.to_dict())  # request headers, the API key among them, stay out
    assert resp["request_seq"] == 1 and resp["response"]["status"] == 200
    assert resp["response"]["body"]["content"] == [{"type": "text", "text": "Paris is the capital."}]
    # Anthropic's input_tokens leaves the cached tokens out; the usage every event shares counts them.
    body_usage = resp["response"]["body"]["usage"]
    assert resp["response"]["usage"] == {
        "input_tokens": body_usage["input_tokens"] + 48, "output_tokens": 4,
        "cache_read_input_tokens": 40, "cache_creation_input_tokens": 8,
    }

    fake_anthropic.stop()  # no server: any request that reached the network would fail
    offline = replay(client_of(fake_anthropic), store, ex.execution_id)
    assert ask(offline, "Capital of France?", system="Be brief.") == live


def test_a_stream_with_text_and_tool_use_is_recorded_as_it_passes_and_replays_event_for_event(store, fake_anthropic):
    fake_anthropic.push_message("the quick brown fox")
    fake_anthropic.push_message("Let me look.", tool_uses=[{"name": "get_weather", "input": {"city": "Paris", "days": 3}}])
    ex = store.start("AnswerQuestion", ENVELOPE)

    def run(client):
        text = streamed(client, "tell me")
        raw = client.messages.create(model=MODEL, max_tokens=100, tools=[WEATHER_TOOL], stream=True,
                                     messages=[{"role": "user", "content": "weather?"}])
        events = [e.model_dump(exclude_none=True) for e in raw]
        return text, events

    live_text, live_events = run(record(client_of(fake_anthropic), ex))
    ex.finish({"status": "success"})
    assert live_text == ["the", " quick", " brown", " fox"]
    types = [e["type"] for e in live_events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    pieces = [e["delta"]["partial_json"] for e in live_events if e.get("delta", {}).get("type") == "input_json_delta"]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == {"city": "Paris", "days": 3}

    responded = [e.payload["response"] for e in store.get(ex.execution_id).events if e.type == "llm.responded"]
    assert responded[1]["text"].startswith("event: message_start")  # the server-sent events, as sent
    assert responded[1]["usage"] == {"input_tokens": 1, "output_tokens": 13,
                                     "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}

    before = fake_anthropic.request_count
    assert run(replay(client_of(fake_anthropic), store, ex.execution_id)) == (live_text, live_events)
    assert fake_anthropic.request_count == before


def test_a_tool_use_round_trip_replays_the_agent_loop_offline(store, fake_anthropic):
    fake_anthropic.push_message(tool_uses=[{"name": "get_weather", "input": {"city": "Paris"}}])
    fake_anthropic.push_message("It is sunny in Paris.")
    ex = store.start("AnswerQuestion", ENVELOPE)
    answer, ran = weather_agent(record(client_of(fake_anthropic), ex))
    ex.finish({"status": "success", "payload": {"answer": answer}})
    assert answer == "It is sunny in Paris." and ran == [{"city": "Paris"}]

    events = store.get(ex.execution_id).events
    first = events[1].payload["response"]["body"]
    assert first["stop_reason"] == "tool_use"
    assert first["content"][0] == {"type": "tool_use", "id": first["content"][0]["id"], "name": "get_weather",
                                   "input": {"city": "Paris"}}
    second_request = events[2].payload["request"]["body"]["messages"]
    assert second_request[2]["content"][0]["type"] == "tool_result"
    assert second_request[2]["content"][0]["tool_use_id"] == first["content"][0]["id"]

    fake_anthropic.stop()
    assert weather_agent(replay(client_of(fake_anthropic), store, ex.execution_id)) == (answer, ran)
    # tracedb replay of the execution gives the recorded answer back too
    assert tracedb.ReplayEngine(store.get(ex.execution_id)).replay().payload == {"answer": answer}


@pytest.mark.parametrize("status,error_type,exc", [
    (429, "rate_limit_error", "RateLimitError"),
    (500, "api_error", "InternalServerError"),
    (529, "overloaded_error", "OverloadedError"),
])
def test_an_error_answer_is_recorded_and_replayed_as_the_sdk_raises_it(store, fake_anthropic, status, error_type, exc):
    fake_anthropic.push_error(status, error_type, f"the {error_type} message")
    ex = store.start("AnswerQuestion", ENVELOPE)
    with pytest.raises(getattr(anthropic, exc)) as live:
        ask(record(client_of(fake_anthropic), ex), "hello?")
    ex.finish({"status": "error"})
    responded = store.get(ex.execution_id).events[1].payload["response"]
    assert responded["status"] == status and responded["body"]["error"]["type"] == error_type
    assert "usage" not in responded

    fake_anthropic.stop()
    with pytest.raises(getattr(anthropic, exc)) as again:
        ask(replay(client_of(fake_anthropic), store, ex.execution_id), "hello?")
    assert (again.value.status_code, again.value.body) == (live.value.status_code, live.value.body)


def test_the_sdk_retrying_an_overloaded_answer_replays_with_its_retry(store, fake_anthropic):
    fake_anthropic.push_error(529, "overloaded_error", "Overloaded")
    fake_anthropic.push_message("second time lucky")
    ex = store.start("AnswerQuestion", ENVELOPE)
    assert ask(record(client_of(fake_anthropic, max_retries=1), ex), "hi") == "second time lucky"
    ex.finish({"status": "success"})
    assert fake_anthropic.request_count == 2
    assert [e.payload["response"]["status"] for e in store.get(ex.execution_id).events
            if e.type == "llm.responded"] == [529, 200]
    fake_anthropic.stop()
    assert ask(replay(client_of(fake_anthropic, max_retries=1), store, ex.execution_id), "hi") == "second time lucky"


def test_a_recorded_connection_failure_replays_as_that_failure(store):
    ex = store.start("AnswerQuestion", ENVELOPE)
    dead = anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key="k", max_retries=0)  # discard port
    with pytest.raises(anthropic.APIConnectionError):
        ask(record(dead, ex), "anyone there?")
    ex.finish({"status": "error"})
    assert store.get(ex.execution_id).events[1].payload["error"]["type"] == "ConnectError"
    with pytest.raises(anthropic.APIConnectionError):
        ask(replay(dead, store, ex.execution_id), "anyone there?")


def test_strict_replay_raises_the_divergence_error_with_the_recorded_seq(store, fake_anthropic):
    fake_anthropic.push_message("a")
    fake_anthropic.push_message("b")
    ex = store.start("AnswerQuestion", ENVELOPE)
    client = record(client_of(fake_anthropic), ex)
    assert [ask(client, "one"), ask(client, "two")] == ["a", "b"]
    ex.finish({"status": "success"})

    # The SDK retries what it takes for a connection error: the divergence is not one of those.
    offline = replay(client_of(fake_anthropic, max_retries=2), store, ex.execution_id)
    assert ask(offline, "one") == "a"
    with pytest.raises(ReplayDivergenceError) as e:
        ask(offline, "something else")
    assert e.value.seq == 3  # the recorded request it should have been
    assert "strict=False" in e.value.hint and isinstance(e.value, anthropic.AnthropicError)
    assert ask(offline, "two") == "b"  # the replay goes on where it was
    offline = replay(client_of(fake_anthropic), store, ex.execution_id)
    ask(offline, "one"), ask(offline, "two")
    with pytest.raises(ReplayDivergenceError, match="end of log"):
        ask(offline, "three")
    assert fake_anthropic.request_count == 2


def test_permissive_replay_serves_the_recording_calls_the_model_for_the_rest_and_links_the_run(store, fake_anthropic):
    fake_anthropic.push_message("recorded answer")
    ex = store.start("AnswerQuestion", ENVELOPE)
    ask(record(client_of(fake_anthropic), ex), "known question")
    ex.finish({"status": "success"})

    fake_anthropic.push_message("fresh answer")
    rp = Replay(store, ex.execution_id, strict=False)
    client = rp.wrap(client_of(fake_anthropic))
    assert ask(client, "known question") == "recorded answer"
    assert rp.new_execution_id is None and fake_anthropic.request_count == 1
    assert ask(client, "new question") == "fresh answer"
    assert fake_anthropic.request_count == 2 and (rp.served, rp.live) == (1, 1)
    rp.finish({"status": "success"})

    linked = store.get(rp.new_execution_id)
    assert linked.to_dict()["lineage"]["parentExecutionId"] == ex.execution_id
    assert [e.type for e in linked.events] == [
        "llm.requested", "llm.responded", "llm.requested", "llm.responded", "FINAL_RESPONSE"]
    assert linked.events[3].payload["response"]["usage"]["output_tokens"] == 2  # the live answer's counts
    fake_anthropic.stop()
    again = replay(client_of(fake_anthropic), store, rp.new_execution_id)
    assert [ask(again, "known question"), ask(again, "new question")] == ["recorded answer", "fresh answer"]


def test_an_execution_that_never_finished_is_not_replayable(store, fake_anthropic):
    ex = store.start("AnswerQuestion", ENVELOPE)
    ask(record(client_of(fake_anthropic), ex), "q")
    ex.abandon("the agent died")
    with pytest.raises(NotReplayableError) as e:
        replay(client_of(fake_anthropic), store, ex.execution_id)
    assert e.value.reason == "execution_incomplete" and e.value.exit_code == 6


def test_the_async_client_records_streams_and_replays_strict_and_permissive(data_dir, fake_anthropic):
    async def main():
        astore = await tracedb.open_async(data_dir)
        try:
            fake_anthropic.push_message("async one")
            fake_anthropic.push_message(tool_uses=[{"name": "get_weather", "input": {"city": "Oslo"}}])
            ex = await astore.start("AnswerQuestion", ENVELOPE)
            client = record(client_of(fake_anthropic, anthropic.AsyncAnthropic), ex)

            async def run(c):
                m = await c.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "q1"}])
                async with c.messages.stream(model=MODEL, max_tokens=50, tools=[WEATHER_TOOL],
                                             messages=[{"role": "user", "content": "q2"}]) as s:
                    final = await s.get_final_message()
                return m.content[0].text, final.content[0].input

            live = await run(client)
            await ex.finish({"status": "success"})
            assert live == ("async one", {"city": "Oslo"})
            before = fake_anthropic.request_count
            rec = await astore.get(ex.execution_id)
            assert await run(replay(client_of(fake_anthropic, anthropic.AsyncAnthropic), rec)) == live
            assert fake_anthropic.request_count == before

            fake_anthropic.push_message("async fresh")
            rp = Replay(rec, strict=False, recorder=astore)
            c = rp.wrap(client_of(fake_anthropic, anthropic.AsyncAnthropic))
            m = await c.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "q1"}])
            m2 = await c.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "q9"}])
            assert (m.content[0].text, m2.content[0].text) == ("async one", "async fresh")
            assert fake_anthropic.request_count == before + 1
            await rp.afinish({"status": "success"})
            linked = await astore.get(rp.new_execution_id)
            assert linked.status == "completed"
            assert linked.to_dict()["lineage"]["parentExecutionId"] == ex.execution_id
        finally:
            await astore.close()

    asyncio.run(main())


def test_the_sync_client_refuses_an_asyncio_handle_with_a_hint(data_dir):
    async def main():
        astore = await tracedb.open_async(data_dir)
        try:
            aex = await astore.start("AnswerQuestion", ENVELOPE)
            with pytest.raises(UsageError, match="sync Anthropic client") as e:
                RecordingTransport(aex)
            assert "AsyncAnthropic" in e.value.hint
        finally:
            await astore.close()

    asyncio.run(main())
