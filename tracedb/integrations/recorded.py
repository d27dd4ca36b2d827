"""What the integrations share: the recorded execution a replay reads, the linked execution a
permissive replay records into, recording calls made from a worker thread for an event loop, and
the HTTP transports that record and replay an SDK's requests (`http_transports`: the OpenAI and
Anthropic SDKs each hand their client one, and differ only in what `HttpApi` says).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import inspect
import threading
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Optional

import orjson

from tracedb.recorder import handles
from tracedb.errors import NotReplayableError, RecordedCallError, TraceDBError, UsageError
from tracedb.records.record import LLM_REQUESTED, LLM_RESPONDED, ExecutionRecord
from tracedb.replay.eventlog import ReplaySession, intent_of


def content_key(value: Any) -> str:
    """"sha256:<hex>" of `value` as JSON with sorted keys: equal content, equal key."""
    return "sha256:" + hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def load_record(source: Any, execution_id: Optional[str] = None, *, force: bool = False) -> ExecutionRecord:
    """The record to replay: `source` is an ExecutionRecord, or anything with `get(id)` (a
    `tracedb.reads.reader.Reader`, a store, a recording client).

    A record that is not replayable (an execution that never finished: incomplete, or still
    running; invalidated; a recording failure) raises NotReplayableError, as `tracedb replay`
    does, unless `force`.
    """
    if isinstance(source, ExecutionRecord):
        record = source
    else:
        if execution_id is None:
            raise UsageError(
                "replay needs the id of the execution to replay",
                hint="pass execution_id=, or the ExecutionRecord itself",
            )
        getter = getattr(source, "get", None)
        if getter is None:
            raise UsageError(
                f"cannot read executions from {type(source).__name__}",
                hint="pass a tracedb.reads.reader.Reader, a store (tracedb.open), a client, or an ExecutionRecord",
            )
        record = getter(execution_id)
        if inspect.isawaitable(record):
            _discard(record)
            raise UsageError(
                "replay reads its record synchronously and was given an asyncio reader",
                hint="pass the record itself: `record = await reader.get(execution_id)`",
            )
    if not force and record.header.replayable is not True:
        reason = record.header.replayableReason or f"status {record.status}"
        raise NotReplayableError(reason, execution_id=record.execution_id)
    return record


def is_async_recorder(recorder: Any) -> bool:
    """True for an asyncio recorder (`tracedb.open_async`, `tracedb.client.connect_async`)."""
    return inspect.iscoroutinefunction(getattr(recorder, "start", None))


def on_loop(loop: asyncio.AbstractEventLoop, make: Callable[[], Any]) -> Any:
    """From a worker thread: run the awaitable `make()` returns on `loop` and wait for its result.

    The awaitable is made on the loop itself, since the asyncio recorders submit their request as
    soon as it is made.
    """

    async def run() -> Any:
        return await make()

    return asyncio.run_coroutine_threadsafe(run(), loop).result()


class LoopExecution:
    """A sync handle over an asyncio execution, for code that runs on a worker thread while the
    execution's event loop runs: each call is awaited on the loop and waited for here."""

    def __init__(self, execution: handles.AsyncExecution, loop: asyncio.AbstractEventLoop):
        self.execution = execution
        self.loop = loop
        self.execution_id = execution.execution_id

    def event(self, type: str, payload: Any = None) -> int:
        """Record an event; returns its seq once durable."""
        return on_loop(self.loop, lambda: self.execution.event(type, payload))

    def finish(self, response: dict) -> int:
        """Record the final response; returns its seq once durable."""
        return on_loop(self.loop, lambda: self.execution.finish(response))


def linked_execution_factory(
    recorder: Any, record: ExecutionRecord, loop: Optional[asyncio.AbstractEventLoop] = None
) -> Optional[Callable[[], Any]]:
    """What a permissive replay calls at its first live call: a new execution on `recorder`,
    linked to the replayed one (parent_execution_id), as `tracedb.replay_session` makes.

    With an asyncio recorder the factory must run on a worker thread while `loop` runs.
    None when there is no recorder: the replay then records nothing.
    """
    if recorder is None:
        return None
    intent, envelope = intent_of(record), record.envelope
    parent = record.execution_id
    if is_async_recorder(recorder):

        def make_async() -> Any:
            if loop is None:
                raise UsageError(
                    "an asyncio recorder needs an asyncio client to record a permissive replay",
                    hint="use the SDK's asyncio client (AsyncOpenAI, AsyncAnthropic) with "
                    "tracedb.open_async / connect_async, or a sync recorder (tracedb.open, "
                    "tracedb.client.connect) with the sync client",
                )
            ex = on_loop(loop, lambda: recorder.start(intent, envelope, parent_execution_id=parent))
            return LoopExecution(ex, loop)

        return make_async

    def make() -> Any:
        return recorder.start(intent, envelope, parent_execution_id=parent)

    return make


class ReplayCounts:
    """A replay of a record's model calls through a `ReplaySession`: the record and the session
    loaded (`load_replay`), and what the session reports, for a class that makes the linked
    execution of a permissive rerun in `_new_execution`."""

    record: Any
    session: ReplaySession

    def load_replay(self, source: Any, execution_id: Optional[str], *, strict: bool, recorder: Any,
                    force: bool) -> None:
        """Load the record (`load_record`: NotReplayableError unless `force`) and set up the
        session that replays its model calls (llm.requested, llm.responded). Permissive, the live
        calls of the rerun are recorded on `recorder` (default: `source` when it can record), into
        what the class's `_new_execution` makes."""
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

    @property
    def execution_id(self) -> str:
        """The replayed execution's id."""
        return self.record.execution_id

    @property
    def new_execution_id(self) -> Optional[str]:
        """Permissive mode: the execution the rerun is recorded into, once a live call made it."""
        return getattr(self.session.execution, "execution_id", None)

    @property
    def served(self) -> int:
        """Calls answered from the recording."""
        return self.session.served

    @property
    def consumed(self) -> bool:
        """Strict mode: True once every recorded call was asked again."""
        return self.session.consumed


def _discard(pending: Any) -> None:
    if hasattr(pending, "close"):
        pending.close()


# -- HTTP: the transports an SDK's client is handed ------------------------------------------------

# Response headers not kept: the body is stored decoded and whole, and cookies are secrets.
_DROPPED_RESPONSE_HEADERS = frozenset(
    {"content-length", "content-encoding", "transfer-encoding", "connection", "set-cookie", "keep-alive"}
)


class HttpApi:
    """What the HTTP transports need to know of one SDK.

    `http`: the httpx module its client takes (`httpx`, or `httpx2`, which the newer SDKs speak;
    the two have one API, in two sets of classes). `sdk` and `async_client`: names for messages.
    `is_async_client(client)`: True for the SDK's asyncio client. `usage(body, sse_events)`: the
    token counts of an answer under the event names (`input_tokens`, `output_tokens`, ...), from
    its JSON body or its server-sent events (a list of (event, data) pairs), or None.
    `sdk_error`: the SDK's own exception class, for an SDK that turns any other exception its
    transport raises into a connection error (and retries it): tracedb's errors (a replay's
    divergence, a recorder that failed) then reach the caller as a subclass of both.
    """

    def __init__(
        self,
        http: Any,
        *,
        sdk: str,
        async_client: str,
        is_async_client: Callable[[Any], bool],
        usage: Optional[Callable[[Any, Optional[list]], Optional[dict]]] = None,
        sdk_error: Optional[type] = None,
    ):
        self.http = http
        self.sdk_error = sdk_error
        self._passing: dict[type, type] = {}
        self.sdk = sdk
        self.async_client = async_client
        self.is_async_client = is_async_client
        self.usage = usage

    def passing(self, err: TraceDBError) -> TraceDBError:
        """`err`, made to pass the SDK's handling of transport errors unchanged (see `sdk_error`).
        Its class becomes a subclass of its own and of the SDK's error: every field, the message
        and the hint stay, and `except ReplayDivergenceError` still catches it."""
        if self.sdk_error is None or isinstance(err, self.sdk_error):
            return err
        cls = type(err)
        sub = self._passing.get(cls)
        if sub is None:
            sub = self._passing[cls] = type(
                cls.__name__, (cls, self.sdk_error), {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
            )
        err.__class__ = sub
        return err


def sse_events(text: str) -> Iterator[tuple[Optional[str], Any]]:
    """The (event name, decoded JSON data) of each server-sent event of a recorded stream; data
    that is not JSON (`[DONE]`) is skipped."""
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        if not data:
            continue
        try:
            yield name, orjson.loads("\n".join(data))
        except orjson.JSONDecodeError:
            continue


def describe_request(request: Any, content: bytes) -> dict:
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


def describe_response(
    status: int, headers: Any, content: bytes, *, complete: bool = True, api: Optional[HttpApi] = None
) -> dict:
    """The recorded form of a response: status, headers (as pairs), the decoded body, and the
    token counts `api` reads in it (`usage`)."""
    out: dict[str, Any] = {
        "status": status,
        "headers": [[k, v] for k, v in headers.multi_items() if k.lower() not in _DROPPED_RESPONSE_HEADERS],
    }
    out.update(_body(content, headers.get("content-type", "")))
    if not complete:
        out["complete"] = False  # the caller closed the stream before its end
    if api is not None and api.usage is not None and 200 <= status < 300:
        events = list(sse_events(out["text"])) if "text" in out else None
        usage = api.usage(out.get("body"), events)
        if usage:
            out["usage"] = usage
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


def _error(exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "message": str(exc)}


def http_transports(api: HttpApi) -> SimpleNamespace:
    """The recording and replaying transports (sync and asyncio) for one SDK, over `api.http`'s
    classes: one definition, whichever httpx module the SDK's client takes."""
    http = api.http

    def build_response(recorded: Any, request: Any) -> Any:
        """An httpx response from its recorded form."""
        if not isinstance(recorded, dict) or "status" not in recorded:
            raise RecordedCallError(None, "UnreadableRecord", f"not a recorded HTTP response: {recorded!r:.200}")
        return http.Response(
            recorded["status"], headers=recorded.get("headers") or [], content=_content_of(recorded), request=request
        )

    def decoded(status: int, headers: Any, raw: bytes) -> bytes:
        # The transport hands over the bytes as sent (gzip and all); the record keeps them decoded.
        if not headers.get("content-encoding"):
            return raw
        return http.Response(status, headers=headers, content=raw).read()

    def described(status: int, headers: Any, raw: bytes, complete: bool = True) -> dict:
        return describe_response(status, headers, decoded(status, headers, raw), complete=complete, api=api)

    def passing(err: BaseException) -> BaseException:
        return api.passing(err) if isinstance(err, TraceDBError) else err

    def as_transport_error(err: RecordedCallError, request: Any) -> BaseException:
        # A recorded connection failure replays as that failure, so the SDK retries it as it did live.
        cls = getattr(http, err.error_type, None)
        if isinstance(cls, type) and issubclass(cls, http.TransportError):
            return cls(err.error_message, request=request)
        return err

    # -- recording ---------------------------------------------------------------------------

    class _Capture:
        """What a recording stream has read of a response; `on_done` gets it once, at close."""

        def __init__(self, response: Any, on_done):
            self._response = response
            self._on_done = on_done
            self._chunks: list[bytes] = []
            self._complete = False
            self._failed: Optional[BaseException] = None
            self._done = False

    class RecordingStream(_Capture, http.SyncByteStream):
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

    class AsyncRecordingStream(_Capture, http.AsyncByteStream):
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

    def answer_of(key: str, seq: int, response: Any, raw: bytes, complete: bool,
                  failed: Optional[BaseException]) -> dict:
        answer: dict[str, Any] = {"prompt_hash": key, "request_seq": seq}
        if failed is not None:
            answer["error"] = _error(failed)
        else:
            answer["response"] = described(response.status_code, response.headers, raw, complete)
        return answer

    class RecordingTransport(http.BaseTransport):
        """Sends each request through `transport` and records it, and its answer, into `execution`
        (a sync handle: `store.start(...)` of `tracedb.open`, or `tracedb.client.connect().start(...)`).

        `llm.requested` is durable before the request leaves; `llm.responded` once the body is read.
        """

        def __init__(self, execution: handles.Execution, transport: Any = None):
            if isinstance(execution, handles.AsyncExecution):
                raise UsageError(
                    f"the sync {api.sdk} client records through a sync execution handle",
                    hint=f"use {api.async_client} with an asyncio execution, or start the execution on tracedb.open",
                )
            self.execution = execution
            self._transport = transport or http.HTTPTransport()

        def handle_request(self, request: Any) -> Any:
            try:
                return self._handle(request)
            except TraceDBError as e:
                raise api.passing(e)  # noqa: B904 - the same exception, its class widened

        def _handle(self, request: Any) -> Any:
            form = describe_request(request, request.read())
            key = request_key(form)
            seq = self.execution.event(LLM_REQUESTED, {"prompt_hash": key, "request": form})
            try:
                response = self._transport.handle_request(request)
            except Exception as e:
                self.execution.event(LLM_RESPONDED, {"prompt_hash": key, "request_seq": seq, "error": _error(e)})
                raise

            def done(raw: bytes, complete: bool, failed: Optional[BaseException]) -> None:
                self.execution.event(LLM_RESPONDED, answer_of(key, seq, response, raw, complete, failed))

            return http.Response(
                response.status_code,
                headers=response.headers,
                stream=RecordingStream(response, done),
                extensions=response.extensions,
            )

        def close(self) -> None:
            self._transport.close()

    class AsyncRecordingTransport(http.AsyncBaseTransport):
        """The asyncio twin of RecordingTransport. `execution` is an asyncio handle
        (`tracedb.open_async`, `connect_async`), or a sync one, whose calls then run on a thread."""

        def __init__(self, execution: Any, transport: Any = None):
            self.execution = execution
            self._transport = transport or http.AsyncHTTPTransport()

        async def _event(self, type: str, payload: dict) -> int:
            if isinstance(self.execution, handles.AsyncExecution):
                return await self.execution.event(type, payload)
            return await asyncio.to_thread(self.execution.event, type, payload)

        async def handle_async_request(self, request: Any) -> Any:
            try:
                return await self._handle(request)
            except TraceDBError as e:
                raise api.passing(e)  # noqa: B904 - the same exception, its class widened

        async def _handle(self, request: Any) -> Any:
            form = describe_request(request, await request.aread())
            key = request_key(form)
            seq = await self._event(LLM_REQUESTED, {"prompt_hash": key, "request": form})
            try:
                response = await self._transport.handle_async_request(request)
            except Exception as e:
                await self._event(LLM_RESPONDED, {"prompt_hash": key, "request_seq": seq, "error": _error(e)})
                raise

            async def done(raw: bytes, complete: bool, failed: Optional[BaseException]) -> None:
                await self._event(LLM_RESPONDED, answer_of(key, seq, response, raw, complete, failed))

            return http.Response(
                response.status_code,
                headers=response.headers,
                stream=AsyncRecordingStream(response, done),
                extensions=response.extensions,
            )

        async def aclose(self) -> None:
            await self._transport.aclose()

    # -- replay ------------------------------------------------------------------------------

    class ReplayTransport(http.BaseTransport):
        """Answers each request from a Replay; a permissive replay sends unmatched ones through
        `transport` (read whole, then recorded)."""

        def __init__(self, replay: "HttpReplay", transport: Any = None):
            self.replay = replay
            self._transport = transport

        def _live(self, request: Any) -> dict:
            if self._transport is None:
                self._transport = http.HTTPTransport()
            response = self._transport.handle_request(request)
            try:
                raw = b"".join(response.stream)
            finally:
                response.close()
            return described(response.status_code, response.headers, raw)

        def handle_request(self, request: Any) -> Any:
            form = describe_request(request, request.read())
            try:
                with self.replay.lock:
                    recorded = self.replay.session.llm(form, lambda _: self._live(request), key=request_key(form))
            except RecordedCallError as e:
                raise passing(as_transport_error(e, request)) from None
            except TraceDBError as e:
                raise api.passing(e)  # noqa: B904 - the same exception, its class widened
            return build_response(recorded, request)

        def close(self) -> None:
            if self._transport is not None:
                self._transport.close()

    class AsyncReplayTransport(http.AsyncBaseTransport):
        """The asyncio twin of ReplayTransport. Strict replay answers on the event loop; a permissive
        one runs the session on a worker thread, its live calls and recording awaited on the loop."""

        def __init__(self, replay: "HttpReplay", transport: Any = None):
            self.replay = replay
            self._transport = transport

        async def _live(self, request: Any) -> dict:
            if self._transport is None:
                self._transport = http.AsyncHTTPTransport()
            response = await self._transport.handle_async_request(request)
            try:
                raw = b"".join([chunk async for chunk in response.stream])
            finally:
                await response.aclose()
            return described(response.status_code, response.headers, raw)

        async def handle_async_request(self, request: Any) -> Any:
            form = describe_request(request, await request.aread())
            key = request_key(form)
            replay = self.replay
            try:
                if replay.strict:
                    with replay.lock:  # strict never calls out or records: nothing here waits
                        recorded = replay.session.llm(form, key=key)
                else:
                    loop = asyncio.get_running_loop()
                    replay.bind_loop(loop)

                    def live(_: Any) -> dict:
                        return asyncio.run_coroutine_threadsafe(self._live(request), loop).result()

                    def run() -> Any:
                        with replay.lock:
                            return replay.session.llm(form, live, key=key)

                    recorded = await asyncio.to_thread(run)
            except RecordedCallError as e:
                raise passing(as_transport_error(e, request)) from None
            except TraceDBError as e:
                raise api.passing(e)  # noqa: B904 - the same exception, its class widened
            return build_response(recorded, request)

        async def aclose(self) -> None:
            if self._transport is not None:
                await self._transport.aclose()

    def recording_http_client(execution: Any, transport: Any = None, **kwargs: Any) -> Any:
        """An httpx `Client` that records every request into `execution` (a sync handle), for the
        SDK's `http_client=`."""
        return http.Client(transport=RecordingTransport(execution, transport), **kwargs)

    def async_recording_http_client(execution: Any, transport: Any = None, **kwargs: Any) -> Any:
        """The `AsyncClient` twin of `recording_http_client`, for the SDK's asyncio client."""
        return http.AsyncClient(transport=AsyncRecordingTransport(execution, transport), **kwargs)

    def record(client: Any, execution: Any, *, transport: Any = None) -> Any:
        """A copy of an SDK client (sync or asyncio) that records every call into `execution` (the
        handle `start` returned). `transport`: the httpx transport requests go through (default:
        httpx's own)."""
        if api.is_async_client(client):
            return client.with_options(http_client=async_recording_http_client(execution, transport))
        return client.with_options(http_client=recording_http_client(execution, transport))

    return SimpleNamespace(
        AsyncRecordingTransport=AsyncRecordingTransport,
        AsyncReplayTransport=AsyncReplayTransport,
        RecordingTransport=RecordingTransport,
        ReplayTransport=ReplayTransport,
        async_recording_http_client=async_recording_http_client,
        build_response=build_response,
        record=record,
        recording_http_client=recording_http_client,
    )


# The names each SDK's module (openai.py, anthropic.py) offers, over its own API and transports.
SDK_MODULE_NAMES = (
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
)


class HttpReplay(ReplayCounts):
    """A replay of one recorded execution's calls through an SDK's HTTP client; `wrap(client)`
    answers from it. A subclass names its SDK: `api` (HttpApi) and `transports` (http_transports).

    `source` is a `tracedb.reads.reader.Reader`, a store, a recording client, or the ExecutionRecord.
    Strict (default): every request must be the recorded one, in order (ReplayDivergenceError at
    the first that differs, or beyond the end of the log). Permissive (`strict=False`): recorded
    answers are served by request content, occurrence by occurrence; other requests go to the
    server and, with a `recorder` (a store or client; default: `source` when it can record), the
    run is recorded into a new execution linked to this one (`new_execution_id`). A record that is
    not replayable raises NotReplayableError unless `force`.
    """

    api: HttpApi
    transports: SimpleNamespace

    @classmethod
    def replay(
        cls,
        client: Any,
        source: Any,
        execution_id: Optional[str] = None,
        *,
        strict: bool = True,
        recorder: Any = None,
        force: bool = False,
    ) -> Any:
        """A copy of `client` that answers from a recorded execution: `cls(...).wrap(client)`; each
        SDK's module offers it as its `replay` function."""
        return cls(source, execution_id, strict=strict, recorder=recorder, force=force).wrap(client)

    def __init__(
        self,
        source: Any,
        execution_id: Optional[str] = None,
        *,
        strict: bool = True,
        recorder: Any = None,
        force: bool = False,
    ):
        self.load_replay(source, execution_id, strict=strict, recorder=recorder, force=force)

    def _new_execution(self) -> Any:
        factory = linked_execution_factory(self.recorder, self.record, self._loop)
        if factory is None:
            return NullSink()
        return factory()

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop an asyncio recorder of the linked execution runs on."""
        self._loop = loop

    @property
    def live(self) -> int:
        """How many requests went to the server (permissive mode)."""
        return self.session.live

    def http_client(self, transport: Any = None, **kwargs: Any) -> Any:
        """An httpx `Client` that answers from this replay (for the SDK's `http_client=`)."""
        return self.api.http.Client(transport=self.transports.ReplayTransport(self, transport), **kwargs)

    def async_http_client(self, transport: Any = None, **kwargs: Any) -> Any:
        """The `AsyncClient` twin of `http_client`, for the SDK's asyncio client."""
        return self.api.http.AsyncClient(transport=self.transports.AsyncReplayTransport(self, transport), **kwargs)

    def wrap(self, client: Any) -> Any:
        """A copy of an SDK client (sync or asyncio) that answers from this replay."""
        if self.api.is_async_client(client):
            return client.with_options(http_client=self.async_http_client())
        return client.with_options(http_client=self.http_client())

    def finish(self, response: dict) -> None:
        """Record the final response of the linked execution, if a permissive replay made one."""
        ex = self.session.execution
        if ex is None or isinstance(ex, NullSink):
            return
        if isinstance(ex, handles.AsyncExecution) or is_async_recorder(self.recorder):
            raise UsageError(
                "this replay records on an asyncio recorder", hint="use `await replay.afinish(response)`"
            )
        ex.finish(response)

    async def afinish(self, response: dict) -> None:
        """The asyncio twin of `finish`."""
        ex = self.session.execution
        if ex is None or isinstance(ex, NullSink):
            return
        await asyncio.to_thread(ex.finish, response)


class NullSink:
    """Where a permissive replay without a recorder writes: nowhere."""

    execution_id = None

    def __init__(self) -> None:
        self._seq = 0

    def event(self, type: str, payload: Any = None) -> int:
        self._seq += 1
        return self._seq

    def finish(self, response: dict) -> int:
        return self.event("FINAL_RESPONSE", response)
