"""Record and replay the OpenAI Python SDK's calls, through its httpx transport.

    import openai, tracedb
    from tracedb.integrations.openai import record, replay

    with tracedb.open("my-traces") as store:
        ex = store.start("AnswerQuestion", {"intent": "AnswerQuestion"})
        client = record(openai.OpenAI(), ex)          # every request: llm.requested, llm.responded
        ...
        offline = replay(openai.OpenAI(), store, ex.execution_id)   # the recorded answers, no network

`record` and `replay` return a copy of the client whose `http_client` is an `httpx.Client` (or
`httpx.AsyncClient` for `AsyncOpenAI`) over a tracedb transport: the SDK's own extension point,
nothing patched. Each request is recorded as `llm.requested` {prompt_hash, request: {method, path,
model, body}} before it is sent, and its answer as `llm.responded` {prompt_hash, request_seq,
response: {status, headers, body | text, usage}} once the body has been read (a stream is passed
through chunk by chunk and recorded when it closes). Request headers (the API key among them) are
never recorded. The transports are `recorded.http_transports`, shared with the Anthropic SDK.

Replay is the event-log replay (`tracedb.replay.ReplaySession`): a request matches a recorded one
when its method, path and JSON body are equal (key order aside); occurrences are counted, so two
identical requests get their two recorded answers in order. Strict (the default) raises
ReplayDivergenceError at the first request that differs from the recording; permissive
(`strict=False`) serves what it has and sends the rest to the server, recording the run into a new
execution linked to the replayed one.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from tracedb.errors import ExtraNotInstalledError
from tracedb.integrations.recorded import (
    SDK_MODULE_NAMES,
    HttpApi,
    HttpReplay,
    describe_request,
    describe_response,
    http_transports,
    request_key,
)

try:
    import httpx
except ModuleNotFoundError as e:
    raise ExtraNotInstalledError(__name__, "openai", e.name) from None


def _is_async_client(client: Any) -> bool:
    # A client of the SDK's exists only once the SDK is loaded: telling one needs no import.
    openai = sys.modules.get("openai")
    return openai is not None and isinstance(client, openai.AsyncOpenAI)


def _usage(body: Any, events: Optional[list]) -> Optional[dict]:
    """Token counts of a chat completion, a Responses API response or an embedding, under the
    names every llm.responded uses; from a stream, its last chunk with usage (chat completions
    with `stream_options.include_usage`) or its `response.completed` event."""
    if events is not None:
        body = None
        for _, data in events:
            if isinstance(data, dict) and isinstance(data.get("usage"), dict):
                body = data
            elif isinstance(data, dict) and isinstance(data.get("response"), dict) and data["response"].get("usage"):
                body = data["response"]
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None
    chat = "prompt_tokens" in usage
    details_in = usage.get("prompt_tokens_details" if chat else "input_tokens_details") or {}
    details_out = usage.get("completion_tokens_details" if chat else "output_tokens_details") or {}
    out = {
        "input_tokens": usage.get("prompt_tokens" if chat else "input_tokens"),
        "output_tokens": usage.get("completion_tokens" if chat else "output_tokens"),
        "total_tokens": usage.get("total_tokens"),
        "cache_read_input_tokens": details_in.get("cached_tokens"),
        "reasoning_output_tokens": details_out.get("reasoning_tokens"),
    }
    return {k: v for k, v in out.items() if v is not None}


API = HttpApi(httpx, sdk="OpenAI", async_client="AsyncOpenAI", is_async_client=_is_async_client, usage=_usage)
_transports = http_transports(API)

RecordingTransport = _transports.RecordingTransport
AsyncRecordingTransport = _transports.AsyncRecordingTransport
ReplayTransport = _transports.ReplayTransport
AsyncReplayTransport = _transports.AsyncReplayTransport
build_response = _transports.build_response
recording_http_client = _transports.recording_http_client
async_recording_http_client = _transports.async_recording_http_client
record = _transports.record


class Replay(HttpReplay):
    """A replay of one recorded execution's OpenAI calls; `wrap(client)` answers from it
    (`recorded.HttpReplay` has the modes)."""

    api = API
    transports = _transports


replay = Replay.replay

__all__ = list(SDK_MODULE_NAMES)
