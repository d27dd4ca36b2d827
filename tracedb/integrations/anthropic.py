"""Record and replay the Anthropic Python SDK's calls, through its httpx transport.

    import anthropic, tracedb
    from tracedb.integrations.anthropic import record, replay

    with tracedb.open("my-traces") as store:
        ex = store.start("AnswerQuestion", {"intent": "AnswerQuestion"})
        client = record(anthropic.Anthropic(), ex)    # every request: llm.requested, llm.responded
        ...
        offline = replay(anthropic.Anthropic(), store, ex.execution_id)   # the recorded answers, no network

The transports, the events and the replay modes are the OpenAI SDK's (`recorded.http_transports`,
docs/integrations.md): `llm.requested` {prompt_hash, request: {method, path, model, body}} before
the request leaves, `llm.responded` {prompt_hash, request_seq, response: {status, headers, body |
text, usage}} once its body is read, a Messages API stream passed through event by event and
recorded whole when it closes. An error answer (429 `rate_limit_error`, 529 `overloaded_error`)
is a response like any other: replayed, the SDK raises it again. Request headers (the API key
among them) are never recorded.

`usage` holds the answer's token counts under the names every `llm.responded` uses:
`input_tokens` counts every input token, cached ones included (Anthropic's own `input_tokens`,
which leaves them out, stays in the recorded body), `output_tokens`, and
`cache_read_input_tokens` / `cache_creation_input_tokens` when the API reports them.
"""

from __future__ import annotations

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
    import anthropic
except ModuleNotFoundError as e:
    raise ExtraNotInstalledError(__name__, "anthropic", e.name) from None

# The httpx module the installed SDK's client takes: httpx2 (anthropic 2), else httpx.
try:
    import httpx2
except ModuleNotFoundError:
    httpx2 = None
if httpx2 is not None and issubclass(anthropic.DefaultHttpxClient, httpx2.Client):
    http_module: Any = httpx2
else:
    try:
        import httpx as http_module
    except ModuleNotFoundError as e:
        raise ExtraNotInstalledError(__name__, "anthropic", e.name) from None


def _is_async_client(client: Any) -> bool:
    return isinstance(client, anthropic.AsyncAnthropic)


def _usage(body: Any, events: Optional[list]) -> Optional[dict]:
    """A message's token counts: its `usage`, or, from a stream, `message_start`'s updated by
    `message_delta`'s (which carries the final output count)."""
    if events is not None:
        usage: dict = {}
        for _, data in events:
            if not isinstance(data, dict):
                continue
            if data.get("type") == "message_start":
                usage.update((data.get("message") or {}).get("usage") or {})
            elif data.get("type") == "message_delta":
                usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
    else:
        usage = body.get("usage") if isinstance(body, dict) and body.get("type") == "message" else None
    if not isinstance(usage, dict) or not usage:
        return None
    read, creation = usage.get("cache_read_input_tokens"), usage.get("cache_creation_input_tokens")
    out = {
        "input_tokens": (usage.get("input_tokens") or 0) + (read or 0) + (creation or 0),
        "output_tokens": usage.get("output_tokens"),
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": creation,
    }
    return {k: v for k, v in out.items() if v is not None}


# The SDK reports any exception its transport raises as APIConnectionError, and retries it,
# unless it is an AnthropicError: a replay's divergence would come back as a connection error.
API = HttpApi(http_module, sdk="Anthropic", async_client="AsyncAnthropic",
              is_async_client=_is_async_client, usage=_usage, sdk_error=anthropic.AnthropicError)
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
    """A replay of one recorded execution's Anthropic calls; `wrap(client)` answers from it
    (`recorded.HttpReplay` has the modes)."""

    api = API
    transports = _transports


replay = Replay.replay

__all__ = list(SDK_MODULE_NAMES)
