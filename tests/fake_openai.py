"""A fake OpenAI-compatible HTTP server on 127.0.0.1 for tests: no network, every request counted.

The real `openai` client (and anything built on it) talks to it through `base_url`. Replies come
from a script (`push_chat`), or, when the script is empty, echo the last user message. Streaming
(`"stream": true`) is served as server-sent events, chunk by chunk, the way the real API does.

The Responses API (`POST /v1/responses`, which the OpenAI Agents SDK uses by default) has its own
script (`push_response`: text, or function calls), streamed or not. `push_stall()` makes the next
response hang until the server stops (`stalled` is set once a request is held there): a client
caught in the middle of a model call, for crash tests.

    with FakeOpenAI() as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="test")
        ...
        assert fake.request_count == 1
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
from typing import Any, Optional

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tracedb.sidecar.asgi import HttpEndpoint


class LocalServer:
    """A Starlette app (`self.app`) served on 127.0.0.1, on a free port, from a background thread;
    a context manager. Every request body it records is kept, in arrival order."""

    name = "fake-server"

    def __init__(self) -> None:
        self.requests: list[dict] = []  # every request body, in arrival order
        self.paths: list[str] = []
        self._release: Optional[asyncio.Event] = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._endpoint: Optional[HttpEndpoint] = None
        self._thread: Optional[threading.Thread] = None
        self.port = 0
        self.app: Optional[Starlette] = None

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    def _record(self, request: Request, body: dict) -> None:
        with self._lock:
            self.requests.append(body)
            self.paths.append(request.url.path)

    def start(self):
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._endpoint = HttpEndpoint(self.app, port=0, name=self.name)
            self._release = asyncio.Event()
            try:
                self.port = loop.run_until_complete(self._endpoint.start())
            except BaseException as e:  # noqa: BLE001 - reported to the starting thread
                failure.append(e)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._endpoint.close())
            loop.close()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        started.wait(10)
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            if self._release is not None:
                self._loop.call_soon_threadsafe(self._release.set)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class FakeOpenAI(LocalServer):
    """The server; a context manager that starts it on a free port in a background thread."""

    name = "fake-openai"

    def __init__(self) -> None:
        super().__init__()
        self._script: collections.deque = collections.deque()
        self._responses_script: collections.deque = collections.deque()
        self.stalled = threading.Event()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    # -- script ------------------------------------------------------------------------------

    def push_chat(self, content: Optional[str] = None, *, tool_calls: Optional[list[dict]] = None) -> None:
        """Queue the next chat completion: text, or tool calls (`{"name": ..., "arguments": {...}}`)."""
        self._script.append({"content": content, "tool_calls": tool_calls})

    def push_response(self, text: Optional[str] = None, *, tool_calls: Optional[list[dict]] = None) -> None:
        """Queue the next Responses API reply: text, or function calls (`{"name": ..., "arguments": {...}}`)."""
        self._responses_script.append({"content": text, "tool_calls": tool_calls})

    def push_stall(self) -> None:
        """The next Responses API request is held, unanswered, until the server stops."""
        self._responses_script.append({"stall": True})

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- handlers ----------------------------------------------------------------------------

    def _next_reply(self, body: dict) -> dict:
        with self._lock:
            if self._script:
                return self._script.popleft()
        last = ""
        for m in reversed(body.get("messages") or []):
            if m.get("role") == "user":
                c = m.get("content")
                last = c if isinstance(c, str) else orjson.dumps(c).decode()
                break
        return {"content": f"echo: {last}", "tool_calls": None}

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _chat(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return JSONResponse({"error": {"message": "invalid JSON body"}}, status_code=400)
        self._record(request, body)
        reply = self._next_reply(body)
        model = body.get("model", "fake-model")
        cid = f"chatcmpl-{next(self._ids)}"
        created = int(time.time())
        tool_calls = [
            {
                "id": f"call_{cid}_{i}",
                "type": "function",
                "function": {"name": tc["name"], "arguments": orjson.dumps(tc.get("arguments", {})).decode()},
            }
            for i, tc in enumerate(reply.get("tool_calls") or [])
        ]
        content = reply.get("content")
        finish = "tool_calls" if tool_calls else "stop"
        prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in body.get("messages") or [])
        completion_tokens = len((content or "").split()) + len(tool_calls)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if tool_calls:
                message["tool_calls"] = tool_calls
            return JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                }
            )

        def chunk(delta: dict, finish_reason=None, with_usage=None) -> bytes:
            obj = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [] if with_usage else [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
            if with_usage:
                obj["usage"] = with_usage
            return b"data: " + orjson.dumps(obj) + b"\n\n"

        async def events():
            yield chunk({"role": "assistant", "content": ""})
            for i, word in enumerate(content.split(" ") if content else []):
                yield chunk({"content": word if i == 0 else " " + word})
            for i, tc in enumerate(tool_calls):
                yield chunk({"tool_calls": [{"index": i, **tc}]})
            yield chunk({}, finish)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield chunk({}, with_usage=usage)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    # -- the Responses API -------------------------------------------------------------------

    def _next_response_reply(self, body: dict) -> dict:
        with self._lock:
            if self._responses_script:
                return self._responses_script.popleft()
        return {"content": f"echo: {_last_user_text(body.get('input'))}", "tool_calls": None}

    async def _responses(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return JSONResponse({"error": {"message": "invalid JSON body"}}, status_code=400)
        self._record(request, body)
        reply = self._next_response_reply(body)
        if reply.get("stall"):
            self.stalled.set()
            await self._release.wait()
            return JSONResponse({"error": {"message": "server stopped"}}, status_code=503)
        n = next(self._ids)
        rid = f"resp_{n}"
        output: list[dict] = []
        content = reply.get("content")
        if content is not None:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": content, "annotations": []}],
                }
            )
        for i, tc in enumerate(reply.get("tool_calls") or []):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{n}_{i}",
                    "call_id": f"call_{n}_{i}",
                    "name": tc["name"],
                    "arguments": orjson.dumps(tc.get("arguments", {})).decode(),
                    "status": "completed",
                }
            )
        input_tokens = len(orjson.dumps(body.get("input"))) // 4
        output_tokens = len((content or "").split()) + len(reply.get("tool_calls") or [])
        response = {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "model": body.get("model", "fake-model"),
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "usage": {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + output_tokens,
            },
        }
        if not body.get("stream"):
            return JSONResponse(response)

        seq = itertools.count()

        def event(type_: str, **fields) -> bytes:
            obj = {"type": type_, "sequence_number": next(seq), **fields}
            return b"event: " + type_.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"

        async def events():
            yield event("response.created", response={**response, "status": "in_progress", "output": [], "usage": None})
            for index, item in enumerate(output):
                if item["type"] == "message":
                    yield event("response.output_item.added", output_index=index,
                                item={**item, "status": "in_progress", "content": []})
                    part = {"type": "output_text", "text": "", "annotations": []}
                    yield event("response.content_part.added", output_index=index, item_id=item["id"],
                                content_index=0, part=part)
                    for i, word in enumerate(content.split(" ") if content else []):
                        yield event("response.output_text.delta", output_index=index, item_id=item["id"],
                                    content_index=0, delta=word if i == 0 else " " + word, logprobs=[])
                    yield event("response.output_text.done", output_index=index, item_id=item["id"],
                                content_index=0, text=content, logprobs=[])
                    yield event("response.content_part.done", output_index=index, item_id=item["id"],
                                content_index=0, part=item["content"][0])
                else:
                    yield event("response.output_item.added", output_index=index,
                                item={**item, "status": "in_progress", "arguments": ""})
                    yield event("response.function_call_arguments.delta", output_index=index,
                                item_id=item["id"], delta=item["arguments"])
                    yield event("response.function_call_arguments.done", output_index=index,
                                item_id=item["id"], arguments=item["arguments"])
                yield event("response.output_item.done", output_index=index, item=item)
            yield event("response.completed", response=response)

        return StreamingResponse(events(), media_type="text/event-stream")


def _last_user_text(items: Any) -> str:
    """The text of the last user message of a Responses API input (a string, or a list of items)."""
    if isinstance(items, str):
        return items
    for item in reversed(items or []):
        if isinstance(item, dict) and item.get("role") == "user":
            c = item.get("content")
            if isinstance(c, str):
                return c
            texts = [p.get("text", "") for p in c or [] if isinstance(p, dict)]
            return " ".join(texts)
    return ""
