"""The OpenAI SDK wrapper: record through the client's httpx transport, replay with no network.

Every test runs the real `openai` client against the fake server on 127.0.0.1 and records into a
real store; replays are checked by the fake server's request count, which must not move.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

import tracedb
from tracedb.config import load_config
from tracedb.errors import NotReplayableError, ReplayDivergenceError
from tracedb.integrations.openai import Replay, record, replay
from tracedb.reads.reader import Reader

ENVELOPE = {"intent": "AnswerQuestion"}


def ask(client, text, **kw):
    r = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": text}], **kw)
    return r.choices[0].message.content


def streamed(client, text):
    chunks = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": text}], stream=True
    )
    return [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]


def openai_client(fake, cls=openai.OpenAI):
    return cls(base_url=fake.base_url, api_key="sk-test-secret", max_retries=0)


def recorded_run(store, fake, answers, questions):
    """Record `questions` asked through the wrapper (the fake answers `answers` in order)."""
    for a in answers:
        fake.push_chat(a)
    ex = store.start("AnswerQuestion", ENVELOPE)
    client = record(openai_client(fake), ex)
    got = [ask(client, q) for q in questions]
    ex.finish({"status": "success", "payload": {"answers": got}})
    return ex.execution_id, got


def test_a_recorded_call_replays_with_no_request_reaching_the_server(store, fake):
    eid, live = recorded_run(store, fake, ["Paris is the capital."], ["capital of France?"])
    assert live == ["Paris is the capital."]
    assert fake.request_count == 1

    rec = store.get(eid)
    types = [e.type for e in rec.events]
    assert types == ["llm.requested", "llm.responded", "FINAL_RESPONSE"]
    req, resp = rec.events[0].payload, rec.events[1].payload
    assert req["request"]["path"] == "/v1/chat/completions"
    assert req["request"]["body"]["messages"] == [{"role": "user", "content": "capital of France?"}]
    assert "sk-test-secret" not in str(rec.to_dict())  # request headers, the API key among them, stay out
    assert resp["request_seq"] == 1 and resp["response"]["status"] == 200
    assert resp["response"]["body"]["choices"][0]["message"]["content"] == "Paris is the capital."

    offline = replay(openai_client(fake), store, eid)
    assert ask(offline, "capital of France?") == "Paris is the capital."
    assert fake.request_count == 1


def test_the_replay_reads_through_the_read_api_after_the_recorder_closed(data_dir, fake):
    with tracedb.open(data_dir) as store:
        eid, _ = recorded_run(store, fake, ["42"], ["the answer?"])
    with Reader.open(load_config(overrides={"data_dir": data_dir})) as reader:
        offline = replay(openai_client(fake), reader, eid[:16])  # a unique prefix will do
    assert ask(offline, "the answer?") == "42"
    assert fake.request_count == 1


@pytest.mark.parametrize("strict", [True, False])
def test_two_identical_prompts_get_their_two_recorded_answers_in_order(store, fake, strict):
    eid, live = recorded_run(store, fake, ["first", "second"], ["same question", "same question"])
    assert live == ["first", "second"]
    offline = replay(openai_client(fake), store, eid, strict=strict)
    assert [ask(offline, "same question"), ask(offline, "same question")] == ["first", "second"]
    assert fake.request_count == 2


def test_a_stream_is_recorded_as_it_passes_and_replays_chunk_for_chunk(store, fake):
    fake.push_chat("the quick brown fox")
    ex = store.start("AnswerQuestion", ENVELOPE)
    live = streamed(record(openai_client(fake), ex), "tell me")
    assert live == ["the", " quick", " brown", " fox"]
    ex.finish({"status": "success"})
    responded = store.get(ex.execution_id).events[1].payload["response"]
    assert responded["text"].startswith("data: ")  # the server-sent events, as sent
    assert ("content-type", "text/event-stream; charset=utf-8") in [tuple(h) for h in responded["headers"]]

    before = fake.request_count
    assert streamed(replay(openai_client(fake), store, ex.execution_id), "tell me") == live
    assert fake.request_count == before


def test_a_responses_api_stream_replays_too(store, fake):
    fake.push_response("streamed through the responses endpoint")
    ex = store.start("AnswerQuestion", ENVELOPE)

    def run(client):
        events = list(client.responses.create(model="fake-model", input="hello", stream=True))
        return [e.type for e in events], events[-1].response.output_text

    live = run(record(openai_client(fake), ex))
    ex.finish({"status": "success"})
    assert live[0][-1] == "response.completed"
    assert live[1] == "streamed through the responses endpoint"
    before = fake.request_count
    assert run(replay(openai_client(fake), store, ex.execution_id)) == live
    assert fake.request_count == before


def test_strict_replay_raises_the_divergence_error_at_the_first_unrecorded_request(store, fake):
    eid, _ = recorded_run(store, fake, ["a", "b"], ["one", "two"])
    offline = replay(openai_client(fake), store, eid)
    assert ask(offline, "one") == "a"
    with pytest.raises(ReplayDivergenceError) as e:
        ask(offline, "something else")
    assert e.value.seq == 3  # the recorded request it should have been
    assert "prompt_hash" in str(e.value.expected) and "prompt_hash" in str(e.value.got)
    assert fake.request_count == 2

    # the end of the log is a divergence too
    offline = replay(openai_client(fake), store, eid)
    ask(offline, "one"), ask(offline, "two")
    with pytest.raises(ReplayDivergenceError, match="end of log"):
        ask(offline, "three")
    assert fake.request_count == 2


def test_permissive_replay_calls_through_and_records_into_a_linked_execution(store, fake):
    eid, _ = recorded_run(store, fake, ["recorded answer"], ["known question"])
    fake.push_chat("fresh answer")
    rp = Replay(store, eid, strict=False)
    client = rp.wrap(openai_client(fake))
    assert ask(client, "known question") == "recorded answer"
    assert rp.new_execution_id is None and fake.request_count == 1  # served: nothing new yet
    assert ask(client, "new question") == "fresh answer"
    assert fake.request_count == 2 and (rp.served, rp.live) == (1, 1)
    rp.finish({"status": "success", "payload": {"replayed": True}})

    linked = store.get(rp.new_execution_id)
    assert linked.to_dict()["lineage"]["parentExecutionId"] == eid
    assert [e.type for e in linked.events] == [
        "llm.requested", "llm.responded", "llm.requested", "llm.responded", "FINAL_RESPONSE",
    ]
    bodies = [e.payload["response"]["body"]["choices"][0]["message"]["content"]
              for e in linked.events if e.type == "llm.responded"]
    assert bodies == ["recorded answer", "fresh answer"]
    assert linked.events[3].payload["request_seq"] == 3
    assert linked.status == "completed"

    # the linked execution replays offline in its turn
    again = replay(openai_client(fake), store, rp.new_execution_id)
    assert [ask(again, "known question"), ask(again, "new question")] == ["recorded answer", "fresh answer"]
    assert fake.request_count == 2


def test_an_execution_that_never_finished_is_not_replayable(store, fake):
    fake.push_chat("half way")
    ex = store.start("AnswerQuestion", ENVELOPE)
    ask(record(openai_client(fake), ex), "q")
    ex.abandon("the agent died")
    with pytest.raises(NotReplayableError) as e:
        replay(openai_client(fake), store, ex.execution_id)
    assert e.value.reason == "execution_incomplete" and e.value.exit_code == 6
    assert ask(replay(openai_client(fake), store, ex.execution_id, force=True), "q") == "half way"


def test_a_recorded_connection_failure_replays_as_that_failure(store, fake):
    ex = store.start("AnswerQuestion", ENVELOPE)
    dead = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)  # discard port
    with pytest.raises(openai.APIConnectionError):
        ask(record(dead, ex), "anyone there?")
    ex.finish({"status": "error"})
    events = store.get(ex.execution_id).events
    assert events[1].payload["error"]["type"] == "ConnectError"
    with pytest.raises(openai.APIConnectionError):
        ask(replay(dead, store, ex.execution_id), "anyone there?")


def test_the_async_client_records_and_replays(data_dir, fake):
    async def main():
        astore = await tracedb.open_async(data_dir)
        try:
            fake.push_chat("async one")
            fake.push_chat("async streamed answer")
            ex = await astore.start("AnswerQuestion", ENVELOPE)
            client = record(openai_client(fake, openai.AsyncOpenAI), ex)
            r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q1"}])
            chunks = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "q2"}], stream=True
            )
            live = [c.choices[0].delta.content async for c in chunks if c.choices and c.choices[0].delta.content]
            await ex.finish({"status": "success"})
            assert r.choices[0].message.content == "async one"
            before = fake.request_count

            record_ = await astore.get(ex.execution_id)
            offline = replay(openai_client(fake, openai.AsyncOpenAI), record_)
            r2 = await offline.chat.completions.create(model="m", messages=[{"role": "user", "content": "q1"}])
            chunks = await offline.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "q2"}], stream=True
            )
            again = [c.choices[0].delta.content async for c in chunks if c.choices and c.choices[0].delta.content]
            assert r2.choices[0].message.content == "async one" and again == live
            assert fake.request_count == before

            # permissive, recording the linked execution on the asyncio store
            fake.push_chat("async fresh")
            rp = Replay(record_, strict=False, recorder=astore)
            client = rp.wrap(openai_client(fake, openai.AsyncOpenAI))
            r3 = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q1"}])
            r4 = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q9"}])
            assert (r3.choices[0].message.content, r4.choices[0].message.content) == ("async one", "async fresh")
            assert fake.request_count == before + 1
            await rp.afinish({"status": "success"})
            linked = await astore.get(rp.new_execution_id)
            assert linked.status == "completed"
            assert linked.to_dict()["lineage"]["parentExecutionId"] == ex.execution_id
            assert [e.type for e in linked.events].count("llm.responded") == 2
        finally:
            await astore.close()

    asyncio.run(main())


def test_the_async_client_records_through_a_sync_store_too(store, fake):
    fake.push_chat("from a thread")
    ex = store.start("AnswerQuestion", ENVELOPE)

    async def main():
        client = record(openai_client(fake, openai.AsyncOpenAI), ex)
        r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        return r.choices[0].message.content

    assert asyncio.run(main()) == "from a thread"
    ex.finish({"status": "success"})
    assert [e.type for e in store.get(ex.execution_id).events] == ["llm.requested", "llm.responded", "FINAL_RESPONSE"]


def test_bad_arguments_say_what_to_pass_and_record_nothing(store, fake):
    from tracedb.errors import ExecutionNotFoundError, UsageError
    from tracedb.integrations.openai import RecordingTransport

    with pytest.raises(ExecutionNotFoundError):
        replay(openai_client(fake), store, "exec-nonexistent")
    with pytest.raises(UsageError, match="cannot read executions from object") as e:
        Replay(object(), "exec-x")
    assert "Reader" in e.value.hint
    with pytest.raises(UsageError, match="needs the id"):
        Replay(store)

    async def with_async_handles():
        astore = await tracedb.open_async(str(store.config.data_dir) + "-async")
        try:
            aex = await astore.start("AnswerQuestion", ENVELOPE)
            with pytest.raises(UsageError, match="sync execution handle"):
                RecordingTransport(aex)

            class AsyncSource:  # what tracedb.reads.reader.AsyncReader looks like to a replay
                async def get(self, execution_id):
                    return await astore.get(execution_id)

            with pytest.raises(UsageError, match="asyncio reader") as e:
                Replay(AsyncSource(), aex.execution_id)
            assert "await reader.get" in e.value.hint
        finally:
            await astore.close()

    asyncio.run(with_async_handles())
    assert fake.request_count == 0 and store.list() == []


def test_each_answer_carries_its_token_counts_under_the_names_every_llm_event_uses(store, fake):
    fake.push_chat("counted")
    fake.push_chat("counted as it streams")
    fake.push_response("counted in the responses api")
    ex = store.start("AnswerQuestion", ENVELOPE)
    client = record(openai_client(fake), ex)
    ask(client, "one two three")
    list(client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "four five"}],
                                        stream=True, stream_options={"include_usage": True}))
    client.responses.create(model="fake-model", input="six")
    ex.finish({"status": "success"})
    usages = [e.payload["response"]["usage"] for e in store.get(ex.execution_id).events if e.type == "llm.responded"]
    assert usages[0] == {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}
    assert usages[1] == {"input_tokens": 2, "output_tokens": 4, "total_tokens": 6}  # from the stream's last chunk
    assert usages[2]["output_tokens"] == 5 and usages[2]["cache_read_input_tokens"] == 0
    assert usages[2]["reasoning_output_tokens"] == 0
