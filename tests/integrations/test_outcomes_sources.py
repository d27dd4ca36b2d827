"""Outcome, first error, models, tokens and cost from each integration, as recorded by the real
SDKs against the fake model servers on 127.0.0.1 (tracedb.records.outcomes)."""

from __future__ import annotations

import asyncio
import socket

import openai
import pytest
from agents import Runner

from tests.integrations import weather_agent as wa
from tracedb.integrations.openai import record

ENVELOPE = {"intent": "AnswerQuestion"}


def only_row(store):
    store.compact()
    [row] = store.list()
    return row


def test_the_openai_wrapper_gives_tokens_and_a_price_or_cost_unknown(store, fake):
    fake.push_chat("Paris.")
    fake.push_chat("Still Paris.")
    ex = store.start("AnswerQuestion", ENVELOPE)
    client = record(openai.OpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0), ex)
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "capital of France?"}])
    client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "and now?"}])
    ex.finish({"status": "success", "payload": {}})
    usages = [e.payload["response"]["usage"] for e in store.get(ex.execution_id).events if e.type == "llm.responded"]
    row = only_row(store)
    assert (row.outcome, row.error, row.models) == ("succeeded", None, ("gpt-4o-mini", "fake-model"))
    assert row.input_tokens == sum(u["input_tokens"] for u in usages) > 0
    assert row.output_tokens == sum(u["output_tokens"] for u in usages) > 0
    assert row.cost_usd is None  # fake-model is in no price table: cost unknown, not a guess


def test_the_openai_wrapper_marks_a_call_that_failed(store):
    with socket.socket() as s:  # a port nothing listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ex = store.start("AnswerQuestion", ENVELOPE)
    client = record(openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test", max_retries=0), ex)
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    ex.finish({"status": "failed", "error": {"code": "MODEL_UNREACHABLE", "message": "no model"}})
    rec = store.get(ex.execution_id)
    failed = [e for e in rec.events if e.type == "llm.responded"][0]
    assert failed.error["code"] == "ConnectError"
    row = only_row(store)
    assert row.outcome == "failed"
    assert (row.error["seq"], row.error["type"], row.error["code"]) == (failed.seq, "llm.responded", "ConnectError")


def test_an_agents_sdk_run_gives_its_models_and_tokens(store, fake, processor):
    wa.script(fake)
    asyncio.run(Runner.run(wa.triage, wa.QUESTION, run_config=wa.live_config(fake.base_url)))
    row = only_row(store)
    rec = store.get(row.execution_id)
    answers = [e.payload["response"] for e in rec.events if e.type == "llm.responded"]
    assert row.outcome == "succeeded" and row.error is None
    assert list(row.models) == sorted({a["model"] for a in answers}, key=[a["model"] for a in answers].index)
    assert row.input_tokens == sum(a["usage"]["input_tokens"] for a in answers) > 0
    assert row.output_tokens == sum(a["usage"]["output_tokens"] for a in answers) > 0


def test_an_agents_sdk_run_that_raised_is_failed_with_its_error(store, fake, processor):
    from agents.exceptions import MaxTurnsExceeded

    wa.script(fake)
    with pytest.raises(MaxTurnsExceeded):
        asyncio.run(Runner.run(wa.triage, wa.QUESTION, run_config=wa.live_config(fake.base_url), max_turns=1))
    row = only_row(store)
    assert row.outcome == "failed"
    assert row.error["message"] == "Max turns exceeded"
    assert row.error["type"] in ("agents.span.ended", "FINAL_RESPONSE")
