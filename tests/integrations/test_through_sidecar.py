"""Both integrations recording through a running `tracedb serve` (the recording client), then
replaying from what the recorder answers and from the read API next to it."""

from __future__ import annotations

import asyncio

import openai

from tests.integrations import weather_agent as wa
from tests.integrations.weather_agent import replay_run
from tests.serving import Serve, serving
from tests.waiting import wait_until
from tracedb.client import connect, connect_async
from tracedb.config import load_config
from tracedb.integrations.agents import ReplayModelProvider
from tracedb.integrations.openai import record, replay
from tracedb.reads.reader import Reader


def compacted(data_dir, eid):
    """The record once the recorder compacted it to its final response (None before)."""
    with Reader.open(load_config(overrides={"data_dir": data_dir})) as reader:
        try:
            rec = reader.get(eid)
        except Exception:
            return None
    return rec if rec.finalResponse is not None else None


def test_an_agents_run_recorded_through_the_sidecar_replays_offline(tmp_path, fake):
    data_dir = str(tmp_path / ".tracedb")
    with serving(data_dir) as serve:
        with connect(serve.socket) as client:
            assert not client.embedded
            with wa.processing(client):
                live = wa.run_live(fake)
            requests = fake.request_count
            eid = None

            def found():
                nonlocal eid
                with Reader.open(load_config(overrides={"data_dir": data_dir})) as reader:
                    rows = reader.page().items
                eid = rows[0].execution_id if rows else None
                return eid is not None and compacted(data_dir, eid) is not None

            wait_until(found, 30, "the run compacted into the database")
            with Reader.open(load_config(overrides={"data_dir": data_dir})) as reader:
                provider = ReplayModelProvider(reader, eid)
            assert replay_run(provider).final_output == live.final_output == wa.FINAL
            assert client.get(eid).finalResponse["payload"]["final_output"] == wa.FINAL
        assert fake.request_count == requests


def test_the_openai_wrapper_records_through_the_sidecar_sync_and_async(tmp_path, fake):
    data_dir = str(tmp_path / ".tracedb")
    with serving(data_dir) as serve:
        fake.push_chat("through the socket")
        with connect(serve.socket) as client:
            ex = client.start("AnswerQuestion", {"intent": "AnswerQuestion"})
            oa = record(openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0), ex)
            r = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
            ex.finish({"status": "success"})
            assert r.choices[0].message.content == "through the socket"
            offline = replay(openai.OpenAI(base_url=fake.base_url, api_key="k"), client, ex.execution_id)
            r2 = offline.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
            assert r2.choices[0].message.content == "through the socket"

        async def main():
            fake.push_chat("async through the socket")
            aclient = await connect_async(serve.socket)
            try:
                aex = await aclient.start("AnswerQuestion", {"intent": "AnswerQuestion"})
                oa = record(openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0), aex)
                r = await oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
                await aex.finish({"status": "success"})
                rec = await aclient.get(aex.execution_id)
            finally:
                await aclient.close()
            return r.choices[0].message.content, rec

        text, rec = asyncio.run(main())
        assert text == "async through the socket"
        assert [e.type for e in rec.events] == ["llm.requested", "llm.responded", "FINAL_RESPONSE"]
        assert fake.request_count == 2


def test_a_recorder_lost_mid_run_stops_the_recording_not_the_run(tmp_path, fake):
    data_dir = str(tmp_path / ".tracedb")
    serve = Serve(data_dir)
    wa.BEFORE_WEATHER[:] = [serve.kill]  # the recorder dies while the agent calls its first tool
    try:
        with connect(serve.socket, reconnect_timeout_s=0.5) as client:
            with wa.processing(client):
                result = wa.run_live(fake)
        assert result.final_output == wa.FINAL  # the agent finished its run
    finally:
        wa.BEFORE_WEATHER.clear()
        serve.kill()

    with serving(data_dir):  # starting again recovers: the run is incomplete
        with Reader.open(load_config(overrides={"data_dir": data_dir})) as reader:
            [row] = reader.page().items
            rec = reader.get(row.execution_id)
    assert rec.status == "incomplete" and rec.header.replayableReason == "execution_incomplete"
    types = [e.type for e in rec.events]
    assert types.count("llm.responded") == 1 and "tool.responded" not in types
    assert rec.events[-1].type == "agents.span.started" and rec.events[-1].payload["name"] == "get_weather"
