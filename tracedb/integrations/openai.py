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
response: {status, headers, body | text}} once the body has been read (a stream is passed through
chunk by chunk and recorded when it closes). Request headers (the API key among them) are never
recorded.

Replay is the event-log replay (`tracedb.replay.ReplaySession`): a request matches a recorded one
when its method, path and JSON body are equal (key order aside); occurrences are counted, so two
identical requests get their two recorded answers in order. Strict (the default) raises
ReplayDivergenceError at the first request that differs from the recording; permissive
(`strict=False`) serves what it has and sends the rest to the server, recording the run into a new
execution linked to the replayed one.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from typing import Any, Optional

import orjson

from .. import handles
from ..errors import ExtraNotInstalledError, RecordedCallError, UsageError
from ..record import LLM_REQUESTED, LLM_RESPONDED
from ..replay.eventlog import ReplaySession
from .recorded import ReplayCounts, content_key, is_async_recorder, linked_execution_factory, load_record

try:
    import httpx
except ModuleNotFoundError as e:
    raise ExtraNotInstalledError(__name__, "openai", e.name) from None

# Response headers not kept: the body is stored decoded and whole, and cookies are secrets.
_DROPPED_RESPONSE_HEADERS = frozenset(
    {"content-length", "content-encoding", "transfer-encoding", "connection", "set-cookie", "keep-alive"}
)


# -- what is recorded --------------------------------------------------------------------------


def describe_request(request: httpx.Request, content: bytes) -> dict:
    """The recorded form of a request: method, path (with its query), model, and the body."""
    out: dict[str, Any] = {"method": request.method, "path": request.url.raw_path.decode("ascii")}
    body = _body(content, request.headers.get("content-type", "application/json"))
    if isinstance(body.get("body"), dict) and "model" in body["body"]:
        out["model"] = body["body"]["model"]
    out.update(body)
    return out


def request_key(described: dict) -> str:
    """The key a request is matched on: the content hash of its recorded form."""
    return content_key(described)


def describe_response(status: int, headers: httpx.Headers, content: bytes, *, complete: bool = True) -> dict:
    """The recorded form of a response: status, headers (as pairs), and the decoded body."""
    out: dict[str, Any] = {
        "status": status,
        "headers": [[k, v] for k, v in headers.multi_items() if k.lower() not in _DROPPED_RESPONSE_HEADERS],
    }
    out.update(_body(content, headers.get("content-type", "")))
    if not complete:
        out["complete"] = False  # the caller closed the stream before its end
    return out


def _body(content: bytes, content_type: str) -> dict:
    if not content:
        return {"body": None}
    if "json" in content_type:
        try:
            return {"body": orjson.loads(content)}
        except orjson.JSONDecodeError:
            pass
    try:
        return {"text": content.decode("utf-8")}
    except UnicodeDecodeError:
        return {"body_b64": base64.b64encode(content).decode("ascii")}


def _content_of(recorded: dict) -> bytes:
    if "body_b64" in recorded:
        return base64.b64decode(recorded["body_b64"])
    if "text" in recorded:
        return recorded["text"].encode("utf-8")
    body = recorded.get("body")
    return b"" if body is None else orjson.dumps(body)


def build_response(recorded: Any, request: httpx.Request) -> httpx.Response:
    """An httpx response from its recorded form."""
    if not isinstance(recorded, dict) or "status" not in recorded:
        raise RecordedCallError(None, "UnreadableRecord", f"not a recorded HTTP response: {recorded!r:.200}")
    return httpx.Response(
        recorded["status"], headers=recorded.get("headers") or [], content=_content_of(recorded), request=request
    )


def _decoded(status: int, headers: httpx.Headers, raw: bytes) -> bytes:
    # The transport hands over the bytes as sent (gzip and all); the record keeps them decoded.
    if not headers.get("content-encoding"):
        return raw
    return httpx.Response(status, headers=headers, content=raw).read()


def _error(exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "message": str(exc)}


def _as_transport_error(err: RecordedCallError, request: httpx.Request) -> BaseException:
    # A recorded connection failure replays as that failure, so the SDK retries it as it did live.
    cls = getattr(httpx, err.error_type, None)
    if isinstance(cls, type) and issubclass(cls, httpx.TransportError):
        return cls(err.error_message, request=request)
    return err


# -- recording -----------------------------------------------------------------------------------


class _RecordingStream(httpx.SyncByteStream):
    def __init__(self, response: httpx.Response, on_done):
        self._response = response
        self._on_done = on_done
        self._chunks: list[bytes] = []
        self._complete = False
        self._failed: Optional[BaseException] = None
        self._done = False

    def __iter__(self):
        try:
            for chunk in self._response.stream:
                self._chunks.append(chunk)
                yield chunk
        except Exception as e:
            self._failed = e
            raise
        self._complete = True

    def close(self) -> None:
        try:
            self._response.close()
        finally:
            if not self._done:
                self._done = True
                self._on_done(b"".join(self._chunks), self._complete, self._failed)


class _AsyncRecordingStream(httpx.AsyncByteStream):
    def __init__(self, response: httpx.Response, on_done):
        self._response = response
        self._on_done = on_done
        self._chunks: list[bytes] = []
        self._complete = False
        self._failed: Optional[BaseException] = None
        self._done = False

    async def __aiter__(self):
        try:
            async for chunk in self._response.stream:
                self._chunks.append(chunk)
                yield chunk
        except Exception as e:
            self._failed = e
            raise
        self._complete = True

    async def aclose(self) -> None:
        try:
            await self._response.aclose()
        finally:
            if not self._done:
                self._done = True
                await self._on_done(b"".join(self._chunks), self._complete, self._failed)


class RecordingTransport(httpx.BaseTransport):
    """Sends each request through `transport` and records it, and its answer, into `execution`
    (a sync handle: `store.start(...)` of `tracedb.open`, or `tracedb.client.connect().start(...)`).

    `llm.requested` is durable before the request leaves; `llm.responded` once the body is read.
    """

    def __init__(self, execution: handles.Execution, transport: Optional[httpx.BaseTransport] = None):
        if isinstance(execution, handles.AsyncExecution):
            raise UsageError(
                "the sync OpenAI client records through a sync execution handle",
                hint="use AsyncOpenAI with an asyncio execution, or start the execution on tracedb.open",
            )
        self.execution = execution
        self._transport = transport or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        described = describe_request(request, request.read())
        key = request_key(described)
        seq = self.execution.event(LLM_REQUESTED, {"prompt_hash": key, "request": described})
        try:
            response = self._transport.handle_request(request)
        except Exception as e:
            self.execution.event(LLM_RESPONDED, {"prompt_hash": key, "request_seq": seq, "error": _error(e)})
            raise

        def done(raw: bytes, complete: bool, failed: Optional[BaseException]) -> None:
            answer: dict[str, Any] = {"prompt_hash": key, "request_seq": seq}
            if failed is not None:
                answer["error"] = _error(failed)
            else:
                content = _decoded(response.status_code, response.headers, raw)
                answer["response"] = describe_response(
                    response.status_code, response.headers, content, complete=complete
                )
            self.execution.event(LLM_RESPONDED, answer)

        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_RecordingStream(response, done),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._transport.close()


class AsyncRecordingTransport(httpx.AsyncBaseTransport):
    """The asyncio twin of RecordingTransport. `execution` is an asyncio handle
    (`tracedb.open_async`, `connect_async`), or a sync one, whose calls then run on a thread."""

    def __init__(self, execution: Any, transport: Optional[httpx.AsyncBaseTransport] = None):
        self.execution = execution
        self._transport = transport or httpx.AsyncHTTPTransport()

    async def _event(self, type: str, payload: dict) -> int:
        if isinstance(self.execution, handles.AsyncExecution):
            return await self.execution.event(type, payload)
        return await asyncio.to_thread(self.execution.event, type, payload)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        described = describe_request(request, await request.aread())
        key = request_key(described)
        seq = await self._event(LLM_REQUESTED, {"prompt_hash": key, "request": described})
        try:
            response = await self._transport.handle_async_request(request)
        except Exception as e:
            await self._event(LLM_RESPONDED, {"prompt_hash": key, "request_seq": seq, "error": _error(e)})
            raise

        async def done(raw: bytes, complete: bool, failed: Optional[BaseException]) -> None:
            answer: dict[str, Any] = {"prompt_hash": key, "request_seq": seq}
            if failed is not None:
                answer["error"] = _error(failed)
            else:
                content = _decoded(response.status_code, response.headers, raw)
                answer["response"] = describe_response(
                    response.status_code, response.headers, content, complete=complete
                )
            await self._event(LLM_RESPONDED, answer)

        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_AsyncRecordingStream(response, done),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._transport.aclose()


# -- replay ---------------------------------------------------------------------------------------


class ReplayTransport(httpx.BaseTransport):
    """Answers each request from a Replay; a permissive replay sends unmatched ones through
    `transport` (read whole, then recorded)."""

    def __init__(self, replay: "Replay", transport: Optional[httpx.BaseTransport] = None):
        self.replay = replay
        self._transport = transport

    def _live(self, request: httpx.Request) -> dict:
        if self._transport is None:
            self._transport = httpx.HTTPTransport()
        response = self._transport.handle_request(request)
        try:
            raw = b"".join(response.stream)
        finally:
            response.close()
        return describe_response(
            response.status_code, response.headers, _decoded(response.status_code, response.headers, raw)
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        described = describe_request(request, request.read())
        try:
            with self.replay.lock:
                recorded = self.replay.session.llm(
                    described, lambda _: self._live(request), key=request_key(described)
                )
        except RecordedCallError as e:
            raise _as_transport_error(e, request) from None
        return build_response(recorded, request)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class AsyncReplayTransport(httpx.AsyncBaseTransport):
    """The asyncio twin of ReplayTransport. Strict replay answers on the event loop; a permissive
    one runs the session on a worker thread, its live calls and recording awaited on the loop."""

    def __init__(self, replay: "Replay", transport: Optional[httpx.AsyncBaseTransport] = None):
        self.replay = replay
        self._transport = transport

    async def _live(self, request: httpx.Request) -> dict:
        if self._transport is None:
            self._transport = httpx.AsyncHTTPTransport()
        response = await self._transport.handle_async_request(request)
        try:
            raw = b"".join([chunk async for chunk in response.stream])
        finally:
            await response.aclose()
        return describe_response(
            response.status_code, response.headers, _decoded(response.status_code, response.headers, raw)
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        described = describe_request(request, await request.aread())
        key = request_key(described)
        replay = self.replay
        try:
            if replay.strict:
                with replay.lock:  # strict never calls out or records: nothing here waits
                    recorded = replay.session.llm(described, key=key)
            else:
                loop = asyncio.get_running_loop()
                replay.bind_loop(loop)

                def live(_: Any) -> dict:
                    return asyncio.run_coroutine_threadsafe(self._live(request), loop).result()

                def run() -> Any:
                    with replay.lock:
                        return replay.session.llm(described, live, key=key)

                recorded = await asyncio.to_thread(run)
        except RecordedCallError as e:
            raise _as_transport_error(e, request) from None
        return build_response(recorded, request)

    async def aclose(self) -> None:
        if self._transport is not None:
            await self._transport.aclose()


class Replay(ReplayCounts):
    """A replay of one recorded execution's OpenAI calls; `wrap(client)` answers from it.

    `source` is a `tracedb.reads.Reader`, a store, a recording client, or the ExecutionRecord.
    Strict (default): every request must be the recorded one, in order (ReplayDivergenceError at
    the first that differs, or beyond the end of the log). Permissive (`strict=False`): recorded
    answers are served by request content, occurrence by occurrence; other requests go to the
    server and, with a `recorder` (a store or client; default: `source` when it can record), the
    run is recorded into a new execution linked to this one (`new_execution_id`). A record that is
    not replayable raises NotReplayableError unless `force`.
    """

    def __init__(
        self,
        source: Any,
        execution_id: Optional[str] = None,
        *,
        strict: bool = True,
        recorder: Any = None,
        force: bool = False,
    ):
        self.record = load_record(source, execution_id, force=force)
        self.strict = strict
        if recorder is None and not strict and hasattr(source, "start"):
            recorder = source
        self.recorder = recorder
        self.lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.session = ReplaySession(
            [e for e in self.record.events if e.type in (LLM_REQUESTED, LLM_RESPONDED)],
            strict=strict,
            sink_factory=None if strict else self._new_execution,
        )

    def _new_execution(self) -> Any:
        factory = linked_execution_factory(self.recorder, self.record, self._loop)
        if factory is None:
            return _NullSink()
        return factory()

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop an asyncio recorder of the linked execution runs on."""
        self._loop = loop

    @property
    def live(self) -> int:
        """How many requests went to the server (permissive mode)."""
        return self.session.live

    def http_client(self, transport: Optional[httpx.BaseTransport] = None, **kwargs: Any) -> httpx.Client:
        """An `httpx.Client` that answers from this replay (for `openai.OpenAI(http_client=...)`)."""
        return httpx.Client(transport=ReplayTransport(self, transport), **kwargs)

    def async_http_client(
        self, transport: Optional[httpx.AsyncBaseTransport] = None, **kwargs: Any
    ) -> httpx.AsyncClient:
        """The `httpx.AsyncClient` twin of `http_client`, for `openai.AsyncOpenAI`."""
        return httpx.AsyncClient(transport=AsyncReplayTransport(self, transport), **kwargs)

    def wrap(self, client: Any) -> Any:
        """A copy of an `openai.OpenAI` / `AsyncOpenAI` client that answers from this replay."""
        if _is_async_client(client):
            return client.with_options(http_client=self.async_http_client())
        return client.with_options(http_client=self.http_client())

    def finish(self, response: dict) -> None:
        """Record the final response of the linked execution, if a permissive replay made one."""
        ex = self.session.execution
        if ex is None or isinstance(ex, _NullSink):
            return
        if isinstance(ex, handles.AsyncExecution) or is_async_recorder(self.recorder):
            raise UsageError(
                "this replay records on an asyncio recorder", hint="use `await replay.afinish(response)`"
            )
        ex.finish(response)

    async def afinish(self, response: dict) -> None:
        """The asyncio twin of `finish`."""
        ex = self.session.execution
        if ex is None or isinstance(ex, _NullSink):
            return
        await asyncio.to_thread(ex.finish, response)


class _NullSink:
    """Where a permissive replay without a recorder writes: nowhere."""

    execution_id = None

    def __init__(self) -> None:
        self._seq = 0

    def event(self, type: str, payload: Any = None) -> int:
        self._seq += 1
        return self._seq

    def finish(self, response: dict) -> int:
        return self.event("FINAL_RESPONSE", response)


def _is_async_client(client: Any) -> bool:
    import openai

    return isinstance(client, openai.AsyncOpenAI)


# -- the short forms --------------------------------------------------------------------------------


def recording_http_client(execution: Any, transport: Optional[httpx.BaseTransport] = None, **kwargs: Any) -> httpx.Client:
    """An `httpx.Client` that records every request into `execution` (a sync handle), for
    `openai.OpenAI(http_client=...)`."""
    return httpx.Client(transport=RecordingTransport(execution, transport), **kwargs)


def async_recording_http_client(
    execution: Any, transport: Optional[httpx.AsyncBaseTransport] = None, **kwargs: Any
) -> httpx.AsyncClient:
    """The `httpx.AsyncClient` twin of `recording_http_client`, for `openai.AsyncOpenAI`."""
    return httpx.AsyncClient(transport=AsyncRecordingTransport(execution, transport), **kwargs)


def record(client: Any, execution: Any, *, transport: Any = None) -> Any:
    """A copy of an `openai.OpenAI` / `AsyncOpenAI` client that records every call into
    `execution` (the handle `start` returned). `transport`: the httpx transport requests go
    through (default: httpx's own)."""
    if _is_async_client(client):
        return client.with_options(http_client=async_recording_http_client(execution, transport))
    return client.with_options(http_client=recording_http_client(execution, transport))


def replay(
    client: Any,
    source: Any,
    execution_id: Optional[str] = None,
    *,
    strict: bool = True,
    recorder: Any = None,
    force: bool = False,
) -> Any:
    """A copy of `client` that answers from a recorded execution: `Replay(...).wrap(client)`."""
    return Replay(source, execution_id, strict=strict, recorder=recorder, force=force).wrap(client)


__all__ = [
    "AsyncRecordingTransport",
    "AsyncReplayTransport",
    "RecordingTransport",
    "Replay",
    "ReplayTransport",
    "async_recording_http_client",
    "build_response",
    "describe_request",
    "describe_response",
    "record",
    "recording_http_client",
    "replay",
    "request_key",
]
