"""A fake Anthropic Messages API on 127.0.0.1 for tests: no network, every request counted.

The real `anthropic` client talks to it through `base_url`. `POST /v1/messages` answers from a
script (`push_message`: text, tool use, cache token counts; `push_error`: an error answer such as
429 `rate_limit_error` or 529 `overloaded_error`), or, when the script is empty, echoes the last
user text. `"stream": true` is served as the API's server-sent events: `message_start`,
`content_block_start` / `content_block_delta` (`text_delta`, `input_json_delta` in pieces) /
`content_block_stop`, `message_delta` (stop reason, output tokens), `message_stop`.

    with FakeAnthropic() as fake:
        client = anthropic.Anthropic(base_url=fake.base_url, api_key="test")
        ...
        assert fake.request_count == 1
"""

from __future__ import annotations

import collections
from typing import Any, Optional

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fake_openai import LocalServer


class FakeAnthropic(LocalServer):
    """The server; a context manager that starts it on a free port in a background thread."""

    name = "fake-anthropic"

    def __init__(self) -> None:
        super().__init__()
        self.api_keys: list[Optional[str]] = []  # each request's key: x-api-key, or the bearer token
        self._script: collections.deque = collections.deque()
        self.app = Starlette(routes=[Route("/v1/messages", self._messages, methods=["POST"])])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def push_message(self, text: Optional[str] = None, *, tool_uses: Optional[list[dict]] = None,
                     cache_read: int = 0, cache_creation: int = 0) -> None:
        """Queue the next message: text, and/or tool uses (`{"name": ..., "input": {...}}`), with
        these cache token counts in its usage."""
        self._script.append({"text": text, "tool_uses": tool_uses or [],
                             "cache_read": cache_read, "cache_creation": cache_creation})

    def push_error(self, status: int, error_type: str, message: str) -> None:
        """Queue an error answer, as the API sends it: `{"type": "error", "error": {...}}`."""
        self._script.append({"error": (status, error_type, message)})

    def _next(self, body: dict) -> dict:
        with self._lock:
            if self._script:
                return self._script.popleft()
        return {"text": f"echo: {_last_user_text(body.get('messages'))}", "tool_uses": [],
                "cache_read": 0, "cache_creation": 0}

    async def _messages(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return _error(400, "invalid_request_error", "invalid JSON body")
        self._record(request, body)
        with self._lock:
            bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
            self.api_keys.append(request.headers.get("x-api-key") or bearer or None)
        reply = self._next(body)
        if "error" in reply:
            return _error(*reply["error"])
        n = next(self._ids)
        content: list[dict] = []
        if reply["text"] is not None:
            content.append({"type": "text", "text": reply["text"]})
        for i, use in enumerate(reply["tool_uses"]):
            content.append({"type": "tool_use", "id": f"toolu_{n}_{i}", "name": use["name"], "input": use.get("input", {})})
        usage = {
            "input_tokens": _words(body.get("system")) + sum(_words(m.get("content")) for m in body.get("messages") or []),
            "output_tokens": _words(reply["text"]) + 10 * len(reply["tool_uses"]),
            "cache_creation_input_tokens": reply["cache_creation"],
            "cache_read_input_tokens": reply["cache_read"],
        }
        message = {
            "id": f"msg_{n}", "type": "message", "role": "assistant", "model": body.get("model", "claude-fake"),
            "content": content, "stop_reason": "tool_use" if reply["tool_uses"] else "end_turn",
            "stop_sequence": None, "usage": usage,
        }
        headers = {"request-id": f"req_{n}"}
        if not body.get("stream"):
            return JSONResponse(message, headers=headers)

        def event(type_: str, **fields: Any) -> bytes:
            return b"event: " + type_.encode() + b"\ndata: " + orjson.dumps({"type": type_, **fields}) + b"\n\n"

        async def events():
            start = dict(message, content=[], stop_reason=None, usage=dict(usage, output_tokens=1))
            yield event("message_start", message=start)
            yield event("ping")
            for index, block in enumerate(content):
                if block["type"] == "text":
                    yield event("content_block_start", index=index, content_block={"type": "text", "text": ""})
                    for i, word in enumerate(block["text"].split(" ")):
                        yield event("content_block_delta", index=index,
                                    delta={"type": "text_delta", "text": word if i == 0 else " " + word})
                else:
                    yield event("content_block_start", index=index, content_block=dict(block, input={}))
                    args = orjson.dumps(block["input"]).decode()
                    for i in range(0, len(args), 7):  # the JSON in pieces, as the API sends it
                        yield event("content_block_delta", index=index,
                                    delta={"type": "input_json_delta", "partial_json": args[i:i + 7]})
                yield event("content_block_stop", index=index)
            yield event("message_delta", delta={"stop_reason": message["stop_reason"], "stop_sequence": None},
                        usage={"output_tokens": usage["output_tokens"]})
            yield event("message_stop")

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def _error(status: int, error_type: str, message: str) -> Response:
    return JSONResponse({"type": "error", "error": {"type": error_type, "message": message}}, status_code=status,
                        headers={"request-id": "req_error", "retry-after-ms": "10"})


def _words(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content.split())
    return sum(_words(b.get("text") or b.get("content")) for b in content if isinstance(b, dict))


def _last_user_text(messages: Any) -> str:
    for m in reversed(messages or []):
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, str):
                return c
            return " ".join(b.get("text", "") for b in c or [] if isinstance(b, dict) and b.get("type") == "text")
    return ""
