"""What the integrations record passes the same redaction: a model's tool call carries its arguments
as JSON text, and an API key in them is redacted in the OpenAI wrapper's recorded response and in
the Agents SDK's recorded spans; no byte of the data directory holds it afterwards."""

from __future__ import annotations

import asyncio
import json

from agents import Runner

from tests.integrations import weather_agent as wa
from tests.store.redaction_config import files_holding
from tracedb.integrations.openai import record

SECRET = "sk-model-argument-5a6b7c8d9e0f"


def test_the_openai_wrapper_redacts_an_api_key_in_a_tool_calls_json_arguments(store, fake, data_dir):
    import openai

    fake.push_chat(tool_calls=[{"name": "get_weather", "arguments": {"city": "Paris", "api_key": SECRET}}])
    ex = store.start("AnswerQuestion", {"intent": "AnswerQuestion"})
    client = record(openai.OpenAI(base_url=fake.base_url, api_key="sk-test", max_retries=0), ex)
    r = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "weather?"}])
    # The live answer is the model's own; what is recorded is redacted.
    assert SECRET in r.choices[0].message.tool_calls[0].function.arguments
    ex.finish({"status": "success"})
    store.compact()
    body = store.get(ex.execution_id).events[1].payload["response"]["body"]
    arguments = body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"city": "Paris", "api_key": "[REDACTED]"}
    store.close()
    assert files_holding(data_dir, SECRET) == {}


def test_the_agents_processor_redacts_an_api_key_in_a_function_calls_arguments(store, fake, data_dir):
    with wa.processing(store):
        fake.push_response(tool_calls=[{"name": "get_weather", "arguments": {"city": "Paris", "api_key": SECRET}}])
        fake.push_response(wa.FINAL)
        asyncio.run(Runner.run(wa.triage, wa.QUESTION, run_config=wa.live_config(fake.base_url)))
    [row] = store.list()
    rec = store.get(row.execution_id)
    text = json.dumps(rec.to_dict())
    assert SECRET not in text and "[REDACTED]" in text
    store.close()
    assert files_holding(data_dir, SECRET) == {}
