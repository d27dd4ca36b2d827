"""Record OpenAI Agents SDK runs into tracedb, and replay their model calls offline.

    from agents import set_trace_processors
    from tracedb.integrations.agents import ReplayModelProvider, TraceDBProcessor

    set_trace_processors([TraceDBProcessor(store)])       # each run: one execution, durable span by span
    ...
    provider = ReplayModelProvider(reader, execution_id)  # the recorded model answers, no network
    result = await Runner.run(agent, question, run_config=RunConfig(model_provider=provider))

`TraceDBProcessor` is a tracing processor (the SDK's `add_trace_processor` / `set_trace_processors`
hook). Each trace becomes an execution (intent: the workflow name), recorded through any sync
recorder: `tracedb.open(...)` or `tracedb.client.connect(...)`. Every callback returns only once
its events are durable (the recorder acknowledges after fdatasync). What it writes:

    agents.span.started   {span_id, parent_id, type, name}          every span, when it starts
    llm.requested         {prompt_hash, request: {model, instructions, input, span_id}, span_id, parent_id}
    llm.responded         {prompt_hash, request_seq, response, span_id, parent_id}   a model call
                                                                     (response span): the Responses
                                                                     API response
    tool.requested        {name, arguments, args_hash, span_id, parent_id}   a function tool call
    tool.responded        {name, args_hash, request_seq, response, span_id, parent_id} or {..., error}
    agents.handoff        {span_id, parent_id, from_agent, to_agent}
    agents.span.ended     {span_id, parent_id, type, name, error, data}   agent, turn, guardrail, ...
    FINAL_RESPONSE        {status, payload: {final_output, last_agent}[, error]}   when the trace ends

`ReplayModelProvider` replays a recorded run's model answers through the SDK's `Model` interface,
with the event-log replay engine (`tracedb.replay.ReplaySession`): a model call matches a
recorded one by the content hash of its input (the conversation so far, tool results included);
the agent loop itself, tools and handoffs included, runs again. Strict (the default) raises
ReplayDivergenceError at the first call that differs; permissive (`strict=False`) serves what it
has, calls `live` (a ModelProvider) for the rest and records the run's model calls into a new
execution linked to the replayed one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Dict, Optional

import orjson
from pydantic import TypeAdapter, ValidationError

from tracedb.recorder import handles
from tracedb.errors import ExtraNotInstalledError, InvalidInputError, UsageError
from tracedb.records.record import LLM_REQUESTED, LLM_RESPONDED, TOOL_REQUESTED, TOOL_RESPONDED
from tracedb.replay.eventlog import args_hash
from tracedb.integrations.recorded import ReplayCounts, content_key, is_async_recorder, linked_execution_factory

try:
    from agents.items import ModelResponse
    from agents.models.interface import Model, ModelProvider, ModelTracing
    from agents.models.openai_provider import OpenAIProvider
    from agents.tracing import TracingProcessor, response_span
    from agents.usage import Usage
    from openai.types.responses import Response, ResponseCompletedEvent, ResponseOutputItem, ResponseUsage
    from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
except ModuleNotFoundError as e:
    raise ExtraNotInstalledError(__name__, "openai", e.name) from None

log = logging.getLogger(__name__)

SPAN_STARTED = "agents.span.started"
SPAN_ENDED = "agents.span.ended"
HANDOFF = "agents.handoff"

_OUTPUT_ITEM = TypeAdapter(ResponseOutputItem)


# -- what is recorded, and the key a model call is matched on ----------------------------------


def _default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if dump is not None:
        # Only the fields that were set: what the SDK itself sends back to the model.
        return dump(mode="json", exclude_unset=True)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def jsonable(value: Any) -> Any:
    """`value` as plain JSON (pydantic models as their set fields, anything else unknown as str)."""
    return orjson.loads(orjson.dumps(value, default=_default))


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def model_input_key(model_input: Any) -> str:
    """The key a model call is matched on: the content hash of its input items (a string input
    counts as one user message), null fields left out."""
    items = jsonable(model_input)
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    return content_key(_without_nulls(items))


def final_output_of(response: Any) -> Optional[str]:
    """The text of a recorded model response's last message, or None when it has none."""
    if not isinstance(response, dict):
        return None
    text = None
    for item in response.get("output") or []:
        if isinstance(item, dict) and item.get("type") == "message":
            parts = [p.get("text", "") for p in item.get("content") or [] if isinstance(p, dict)]
            text = "".join(parts)
    return text


def _chat_text(output: Any) -> Optional[str]:
    text = None
    for message in output or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            text = content
    return text


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
    return jsonable(raw)


def _span_name(data: Any) -> Optional[str]:
    # An agent's or a tool's name; a turn is named by its agent.
    return getattr(data, "name", None) or getattr(data, "agent_name", None)


# -- recording: the tracing processor ---------------------------------------------------------------


@dataclass
class _Run:
    execution: Any
    spans: Dict[str, tuple] = field(default_factory=dict)  # span_id -> (parent_id, type, name)
    final_output: Optional[str] = None  # the text of the last model message so far
    last_agent: Optional[str] = None
    error: Any = None
    failed: bool = False


class TraceDBProcessor(TracingProcessor):
    """Records each Agents SDK run (a trace) as one tracedb execution; see the module docstring.

    `recorder` is a sync recorder: a store (`tracedb.open`) or a client (`tracedb.client.connect`).
    `intent` names the executions (default: the trace's workflow name). The callbacks record on a
    thread of their own and return once the recorder acknowledged (after its fdatasync), so the
    SDK's event loop may call them. A recording that fails stops that run's recording and marks
    the execution incomplete (the recorder's recovery does, if the recorder itself is gone); the
    run itself goes on (the SDK ignores a processor's errors).
    """

    def __init__(self, recorder: Any, *, intent: Optional[str] = None):
        if is_async_recorder(recorder):
            raise UsageError(
                "the tracing processor records synchronously (its callbacks return once durable) "
                "and was given an asyncio recorder",
                hint="pass tracedb.open(...) or tracedb.client.connect(...)",
            )
        self.recorder = recorder
        self.intent = intent
        self._runs: Dict[str, _Run] = {}
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracedb-agents")

    def execution_id(self, trace_id: str) -> Optional[str]:
        """The execution a running trace records into."""
        run = self._runs.get(trace_id)
        return None if run is None else run.execution.execution_id

    # -- the hooks -------------------------------------------------------------------------------

    def on_trace_start(self, trace: Any) -> None:
        info = trace.export() or {}
        intent = self.intent or info.get("workflow_name") or "agents.run"
        envelope = {
            "intent": intent,
            "workflow_name": info.get("workflow_name"),
            "trace_id": trace.trace_id,
            "group_id": info.get("group_id"),
            "metadata": jsonable(info.get("metadata")),
        }
        try:
            ex = self._on_thread(lambda: self.recorder.start(intent, envelope))
        except Exception:
            log.exception("tracedb: could not start recording the run %s", trace.trace_id)
            return
        with self._lock:
            self._runs[trace.trace_id] = _Run(ex)

    def on_trace_end(self, trace: Any) -> None:
        with self._lock:
            run = self._runs.pop(trace.trace_id, None)
        if run is None or run.failed:
            return
        response: Dict[str, Any] = {
            "status": "error" if run.error is not None else "success",
            "payload": {"final_output": run.final_output, "last_agent": run.last_agent},
        }
        if run.error is not None:
            response["error"] = run.error
        self._record(run, lambda: run.execution.finish(response))

    def on_span_start(self, span: Any) -> None:
        run = self._runs.get(span.trace_id)
        if run is None or run.failed:
            return
        data = span.span_data
        name = _span_name(data)
        run.spans[span.span_id] = (span.parent_id, data.type, name)
        payload = {"span_id": span.span_id, "parent_id": span.parent_id, "type": data.type, "name": name}
        self._record(run, lambda: run.execution.event(SPAN_STARTED, payload))

    def on_span_end(self, span: Any) -> None:
        run = self._runs.get(span.trace_id)
        if run is None or run.failed:
            return
        data = span.span_data
        kind = data.type
        if kind == "response" and data.response is not None:
            self._record(run, lambda: self._model_call(run, span))
        elif kind == "function":
            self._record(run, lambda: self._tool_call(run, span))
        elif kind == "handoff":
            payload = {"span_id": span.span_id, "parent_id": span.parent_id, "from_agent": data.from_agent,
                       "to_agent": data.to_agent}
            self._record(run, lambda: run.execution.event(HANDOFF, payload))
        else:
            if kind == "generation":  # a chat completions model: its answer is a chat message
                text = _chat_text(getattr(data, "output", None))
                if text is not None:
                    run.final_output = text
                    run.last_agent = self._agent_of(run, span.parent_id)
            if span.error is not None and kind in ("agent", "task"):
                run.error = jsonable(span.error)
            payload = {
                "span_id": span.span_id,
                "parent_id": span.parent_id,
                "type": kind,
                "name": run.spans.get(span.span_id, (None, None, None))[2],
                "error": jsonable(span.error),
                "data": jsonable(data.export()),
            }
            self._record(run, lambda: run.execution.event(SPAN_ENDED, payload))
        run.spans.pop(span.span_id, None)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

    def force_flush(self) -> None:
        """Nothing waits: every callback returned once its events were durable."""

    # -- writing ----------------------------------------------------------------------------------

    def _model_call(self, run: _Run, span: Any) -> None:
        data = span.span_data
        model_input = jsonable(data.input)
        response = jsonable(data.response)
        key = model_input_key(model_input)
        request = {
            "model": response.get("model"),
            "instructions": response.get("instructions"),
            "input": model_input,
            "span_id": span.span_id,
        }
        ids = {"span_id": span.span_id, "parent_id": span.parent_id}  # every event nests in the span tree
        seq = run.execution.event(LLM_REQUESTED, {"prompt_hash": key, "request": request, **ids})
        run.execution.event(LLM_RESPONDED, {"prompt_hash": key, "request_seq": seq, "response": response, **ids})
        text = final_output_of(response)
        if text is not None:
            run.final_output = text
        run.last_agent = self._agent_of(run, span.parent_id)

    def _tool_call(self, run: _Run, span: Any) -> None:
        data = span.span_data
        arguments = _arguments(data.input)
        h = args_hash(arguments)
        ids = {"span_id": span.span_id, "parent_id": span.parent_id}
        seq = run.execution.event(TOOL_REQUESTED, {"name": data.name, "arguments": arguments, "args_hash": h, **ids})
        answer: Dict[str, Any] = {"name": data.name, "args_hash": h, "request_seq": seq, **ids}
        if span.error is not None:
            answer["error"] = {"type": "ToolError", "message": str(span.error.get("message", span.error))}
        else:
            answer["response"] = jsonable(data.output)
        run.execution.event(TOOL_RESPONDED, answer)

    @staticmethod
    def _agent_of(run: _Run, span_id: Optional[str]) -> Optional[str]:
        seen = 0
        while span_id is not None and seen < 64:
            parent, kind, name = run.spans.get(span_id, (None, None, None))
            if kind == "agent":
                return name
            span_id, seen = parent, seen + 1
        return None

    def _on_thread(self, fn: Callable[[], Any]) -> Any:
        # The SDK calls from its event loop, where a sync recorder refuses to wait for an fsync:
        # the call runs here, on one thread (so events keep their order), and is waited for.
        return self._pool.submit(fn).result()

    def _record(self, run: _Run, fn: Callable[[], Any]) -> None:
        try:
            self._on_thread(fn)
        except Exception as e:
            run.failed = True
            log.error("tracedb: recording the run into %s failed, it is marked incomplete: %s",
                      run.execution.execution_id, e)
            try:
                self._on_thread(lambda: run.execution.abandon(f"recording failed: {e}"))
            except Exception:  # the recorder itself is gone: recovery marks it incomplete
                log.exception("tracedb: could not mark %s incomplete", run.execution.execution_id)


# -- replay: the model provider ----------------------------------------------------------------------


def _usage(recorded: Any) -> Usage:
    if not isinstance(recorded, dict):
        return Usage(requests=1)
    # Built without validation: the token details grow fields from one openai release to the next.
    input_details = {"cached_tokens": 0, **(recorded.get("input_tokens_details") or {})}
    output_details = {"reasoning_tokens": 0, **(recorded.get("output_tokens_details") or {})}
    return Usage(
        requests=1,
        input_tokens=recorded.get("input_tokens") or 0,
        output_tokens=recorded.get("output_tokens") or 0,
        total_tokens=recorded.get("total_tokens") or 0,
        input_tokens_details=InputTokensDetails.model_construct(**input_details),
        output_tokens_details=OutputTokensDetails.model_construct(**output_details),
    )


def _output(recorded: dict) -> list:
    try:
        return [_OUTPUT_ITEM.validate_python(item) for item in recorded.get("output") or []]
    except ValidationError as e:
        raise InvalidInputError(
            f"the recorded model response {recorded.get('id')!r} has an output item the SDK cannot read: {e}",
            hint="replay it with the openai package version it was recorded with",
        ) from None


def model_response(recorded: Any) -> ModelResponse:
    """The SDK's ModelResponse for a recorded Responses API response."""
    if not isinstance(recorded, dict):
        raise InvalidInputError(
            "the recording holds no model response for this call",
            hint="record with trace_include_sensitive_data on (the SDK's default)",
        )
    return ModelResponse(output=_output(recorded), usage=_usage(recorded.get("usage")), response_id=recorded.get("id"))


def response_object(recorded: dict) -> Response:
    """A whole Responses API `Response` for a recorded response (for a streamed replay)."""
    try:
        return Response.model_validate(recorded)
    except ValidationError:
        usage = recorded.get("usage")
        return Response.model_construct(
            id=recorded.get("id") or "replayed",
            object="response",
            created_at=recorded.get("created_at") or 0,
            model=recorded.get("model") or "replayed",
            output=_output(recorded),
            parallel_tool_calls=False,
            tool_choice="auto",
            tools=[],
            status="completed",
            usage=ResponseUsage.model_construct(**usage) if isinstance(usage, dict) else None,
        )


def _recordable(response: ModelResponse, model: Optional[str]) -> dict:
    out: Dict[str, Any] = {"id": response.response_id, "model": model, "output": jsonable(response.output)}
    u = response.usage
    out["usage"] = {
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "total_tokens": u.total_tokens,
        "input_tokens_details": {"cached_tokens": u.input_tokens_details.cached_tokens or 0},
        "output_tokens_details": {"reasoning_tokens": u.output_tokens_details.reasoning_tokens or 0},
    }
    return out


def _check_replayable_model_calls(record: Any) -> None:
    # Model calls recorded without their data cannot be answered: say so now, not as a
    # divergence at the first call.
    for e in record.events:
        if e.type != SPAN_ENDED or not isinstance(e.payload, dict):
            continue
        if e.payload.get("type") == "response":
            raise InvalidInputError(
                f"execution {record.execution_id!r} holds model calls recorded without their input "
                "and output, which replay needs",
                hint="record with RunConfig(trace_include_sensitive_data=True), the SDK's default "
                "(the OPENAI_AGENTS_TRACE_INCLUDE_SENSITIVE_DATA variable may turn it off)",
            )
        if e.payload.get("type") == "generation":
            raise InvalidInputError(
                f"execution {record.execution_id!r} was recorded on a chat completions model; "
                "replay answers runs on the Responses API model only",
                hint="run the agent on the SDK's default model (OpenAIResponsesModel) to record "
                "replayable runs; `tracedb replay ID` still gives back this run's final response",
            )


class ReplayModelProvider(ReplayCounts, ModelProvider):
    """Replays a recorded run's model answers; `RunConfig(model_provider=...)`.

    `source` is a `tracedb.reads.reader.Reader`, a store, a client, or the ExecutionRecord of the run
    (a run recorded by TraceDBProcessor). Every agent of the run gets its model from here, and
    all of them share one replay, so the calls are matched in the run's order. Permissive mode
    (`strict=False`) calls `live` (a ModelProvider; default: the SDK's OpenAIProvider) for what
    the recording cannot answer, and records into a new execution linked to the replayed one on
    `recorder` (default: `source` when it can record), finished by `aclose()`.
    A record that is not replayable raises NotReplayableError unless `force`.
    """

    def __init__(
        self,
        source: Any,
        execution_id: Optional[str] = None,
        *,
        strict: bool = True,
        recorder: Any = None,
        live: Optional[ModelProvider] = None,
        force: bool = False,
    ):
        self.load_replay(source, execution_id, strict=strict, recorder=recorder, force=force)
        _check_replayable_model_calls(self.record)
        self.live = live
        self._last_response: Any = None
        self._models: Dict[Optional[str], ReplayModel] = {}

    def _new_execution(self) -> Any:
        factory = linked_execution_factory(self.recorder, self.record, self._loop)
        return None if factory is None else factory()

    def get_model(self, model_name: Optional[str]) -> Model:
        model = self._models.get(model_name)
        if model is None:
            model = self._models[model_name] = ReplayModel(self, model_name)
        return model

    async def answer(self, request: dict, key: str, live: Callable[[], Any]) -> Any:
        """The recorded (or, permissive, live) response to one model call."""
        if self.strict:
            with self.lock:  # strict never calls out or records: nothing here waits
                recorded = self.session.llm(request, key=key)
        else:
            loop = asyncio.get_running_loop()
            self._loop = loop

            def call(_: Any) -> Any:
                return asyncio.run_coroutine_threadsafe(live(), loop).result()

            def run() -> Any:
                with self.lock:
                    return self.session.llm(request, call, key=key)

            recorded = await asyncio.to_thread(run)
        self._last_response = recorded
        return recorded

    def live_model(self, model_name: Optional[str]) -> Model:
        """The model permissive mode calls for what the recording cannot answer."""
        if self.live is None:
            self.live = OpenAIProvider()
        return self.live.get_model(model_name)

    async def aclose(self) -> None:
        """Finish the linked execution of a permissive replay (its final output: the last model
        message), and close the live provider."""
        ex = self.session.execution
        if ex is not None:
            response = {"status": "success", "payload": {"final_output": final_output_of(self._last_response)}}
            if isinstance(ex, handles.AsyncExecution):
                await ex.finish(response)
            else:
                await asyncio.to_thread(ex.finish, response)
        if self.live is not None:
            await self.live.aclose()


class ReplayModel(Model):
    """One model name of a ReplayModelProvider: answers from the recording.

    Each answer gets a response span, as a live model call does, so a replay run traced by
    TraceDBProcessor is recorded with its model calls (and can be replayed in its turn).
    """

    def __init__(self, provider: ReplayModelProvider, model_name: Optional[str]):
        self.provider = provider
        self.model_name = model_name

    async def _answer(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                      tracing: ModelTracing, args: tuple, kwargs: dict) -> dict:
        async def live() -> dict:
            # The span below traces this call; the live model's own would trace it twice.
            model = self.provider.live_model(self.model_name)
            response = await model.get_response(system_instructions, input, model_settings, tools,
                                                output_schema, handoffs, ModelTracing.DISABLED,
                                                *args, **kwargs)
            return _recordable(response, self.model_name)

        model_input = jsonable(input)
        request = {"model": self.model_name, "instructions": system_instructions, "input": model_input}
        with response_span(disabled=tracing.is_disabled()) as span:
            recorded = await self.provider.answer(request, model_input_key(model_input), live)
            if not isinstance(recorded, dict):
                raise InvalidInputError(
                    "the recording holds no model response for this call",
                    hint="record with trace_include_sensitive_data on (the SDK's default)",
                )
            if tracing.include_data():
                span.span_data.response = response_object(recorded)
                span.span_data.input = input
        return recorded

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema,
                           handoffs, tracing, *args: Any, **kwargs: Any) -> ModelResponse:
        recorded = await self._answer(system_instructions, input, model_settings, tools, output_schema,
                                      handoffs, tracing, args, kwargs)
        return model_response(recorded)

    async def stream_response(self, system_instructions, input, model_settings, tools, output_schema,
                              handoffs, tracing, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        recorded = await self._answer(system_instructions, input, model_settings, tools, output_schema,
                                      handoffs, tracing, args, kwargs)
        yield ResponseCompletedEvent(type="response.completed", response=response_object(recorded), sequence_number=0)


__all__ = [
    "HANDOFF",
    "ReplayModel",
    "ReplayModelProvider",
    "SPAN_ENDED",
    "SPAN_STARTED",
    "TraceDBProcessor",
    "final_output_of",
    "model_input_key",
    "model_response",
    "response_object",
]
