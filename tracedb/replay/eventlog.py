"""Event-log replay: serve recorded LLM and tool responses to re-running agent code.

An agent written against a session (`session.llm(request)`, `session.tool(name, arguments)`,
`session.event(type, payload)`, `session.finish(response)`) runs the same way live and in replay:

- `live_session(execution, llm=..., tools=...)` calls the real model and tools and records each call
  as a request/response pair of events (`llm.requested`/`llm.responded`,
  `tool.requested`/`tool.responded`).
- `ReplaySession(record, strict=...)` serves those responses back, no model or tool called.

LLM responses are keyed on the prompt's content hash (system and user messages, model, tool
definitions, output schema); tool responses on the tool's name plus the hash of its arguments.
Occurrences are counted: the third identical call gets the third recorded answer, so repeated
calls replay in their recorded order and never collapse to one cached answer.

Strict mode compares everything the code emits with the log, in order, and raises
ReplayDivergenceError pinned to the first recorded event that differs. Permissive mode serves any
call it has a recorded answer for, runs the others live, and records the whole new run (served and
live events alike) into a new execution linked to the original, created at the first live call.

Recorded payloads (what the session writes, what it reads back):

    llm.requested   {"prompt_hash", "request"}
    llm.responded   {"prompt_hash", "request_seq", "response"} or {..., "error": {"type", "message"}}
    tool.requested  {"name", "arguments", "args_hash"}
    tool.responded  {"name", "args_hash", "request_seq", "response"} or {..., "error": {...}}

Sessions are not thread-safe: one session per running agent.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from tracedb.errors import InvalidInputError, RecordedCallError, ReplayDivergenceError, UsageError
from tracedb.records.record import (
    FINAL_RESPONSE,
    LLM_REQUESTED,
    LLM_RESPONDED,
    TOOL_REQUESTED,
    TOOL_RESPONDED,
    ExecutionEvent,
    ExecutionRecord,
)
from tracedb.replay._canon import canonical_json, content_hash, state_bytes

# The parts of an LLM request that make up its content hash. Anything else in the
# request (ids, timestamps, client options) does not change which recorded answer it gets.
PROMPT_FIELDS = ("system", "messages", "model", "tools", "output_schema")

LLM = "llm"
TOOL = "tool"
_REQUEST_KIND = {LLM_REQUESTED: LLM, TOOL_REQUESTED: TOOL}
_RESPONSE_KIND = {LLM_RESPONDED: LLM, TOOL_RESPONDED: TOOL}
_RESPONSE_TYPE = {LLM: LLM_RESPONDED, TOOL: TOOL_RESPONDED}

# Events the library itself writes around a replay; user code never re-emits them.
IGNORED_PREFIXES = ("replay.", "tracedb.")


def prompt_hash(request: Mapping[str, Any]) -> str:
    """Content hash of an LLM prompt: system, messages, model, tools and output_schema only."""
    return content_hash({k: request.get(k) for k in PROMPT_FIELDS})


def args_hash(arguments: Any) -> str:
    """Deterministic hash of a tool call's arguments (canonical JSON, sorted keys)."""
    return content_hash(arguments)


def intent_of(record: ExecutionRecord) -> str:
    """The intent to start a derived execution (replay, fork) with: the original's."""
    return record.intent or str(record.envelope.get("intent") or "replay")


def _tool_name(payload: Mapping[str, Any]) -> Optional[str]:
    return payload.get("name", payload.get("tool"))


def _call_key(kind: str, payload: Any) -> Optional[str]:
    if not isinstance(payload, Mapping):
        return None
    if kind == LLM:
        h = payload.get("prompt_hash")
        if h is None and isinstance(payload.get("request"), Mapping):
            h = prompt_hash(payload["request"])
        return h
    name = _tool_name(payload)
    h = payload.get("args_hash")
    if h is None and "arguments" in payload:
        h = args_hash(payload["arguments"])
    if name is None or h is None:
        return None
    return f"{name}:{h}"


@dataclass
class RecordedCall:
    """One recorded LLM or tool call: its request event and, unless the run stopped, its response."""

    kind: str
    key: Optional[str]
    request_seq: int
    request: Any
    response_seq: Optional[int] = None
    response: Any = None

    @property
    def answered(self) -> bool:
        """True when the log holds a response for this call."""
        return self.response_seq is not None


class EventLog:
    """An execution's events indexed for replay: calls paired with their responses, by key."""

    def __init__(self, events: Iterable[ExecutionEvent]):
        self.events: List[ExecutionEvent] = sorted(events, key=lambda e: e.seq)
        self.calls: List[RecordedCall] = []
        self.by_request_seq: Dict[int, RecordedCall] = {}
        self.by_key: Dict[Tuple[str, Optional[str]], List[RecordedCall]] = defaultdict(list)
        self.response_seqs: set = set()
        pending: Dict[Tuple[str, Optional[str]], List[RecordedCall]] = defaultdict(list)
        for e in self.events:
            kind = _REQUEST_KIND.get(e.type)
            if kind is not None:
                call = RecordedCall(kind, _call_key(kind, e.payload), e.seq, e.payload)
                self.calls.append(call)
                self.by_request_seq[e.seq] = call
                self.by_key[(kind, call.key)].append(call)
                pending[(kind, call.key)].append(call)
                continue
            kind = _RESPONSE_KIND.get(e.type)
            if kind is None:
                continue
            call = self._pair(kind, e, pending)
            if call is not None:
                call.response_seq, call.response = e.seq, e.payload
                self.response_seqs.add(e.seq)

    def _pair(self, kind: str, e: ExecutionEvent, pending) -> Optional[RecordedCall]:
        payload = e.payload if isinstance(e.payload, Mapping) else {}
        ref = payload.get("request_seq")
        call = self.by_request_seq.get(ref) if ref is not None else None
        if call is not None and call.kind == kind and not call.answered:
            pending[(kind, call.key)].remove(call)
            return call
        # No usable request_seq (a log written by another recorder): first unanswered call with
        # the same key, else the first unanswered call of that kind.
        queue = pending.get((kind, _call_key(kind, payload)))
        if queue:
            return queue.pop(0)
        for (k, _), q in pending.items():
            if k == kind and q:
                return q.pop(0)
        return None

    @property
    def last_seq(self) -> int:
        """The highest seq in the log (0 when empty)."""
        return self.events[-1].seq if self.events else 0


@dataclass(frozen=True)
class ReplayState:
    """The state reconstructed from an event log: a deterministic projection, byte-comparable."""

    data: Dict[str, Any]

    def to_bytes(self) -> bytes:
        """Canonical JSON bytes: two replays of the same log give the same bytes."""
        return state_bytes(self.data)

    @property
    def digest(self) -> str:
        """"sha256:<hex>" of the state."""
        return content_hash(self.data)


def reconstruct_state(
    source: Union[ExecutionRecord, Sequence[ExecutionEvent]], final_response: Any = None
) -> ReplayState:
    """Fold an event log into its state: calls with their answers, other events, final response.

    The state holds no seq numbers, ids or times, so a log re-emitted by a faithful replay (whose
    own seqs may be numbered differently) reconstructs to the very same bytes.
    """
    if isinstance(source, ExecutionRecord):
        events, final_response = source.events, source.finalResponse
    else:
        events = source
    log = EventLog(events)
    timeline: List[Dict[str, Any]] = []
    llm_calls = tool_calls = 0
    for e in log.events:
        call = log.by_request_seq.get(e.seq)
        if call is not None:
            item: Dict[str, Any] = {"kind": call.kind, "key": call.key}
            if call.kind == LLM:
                llm_calls += 1
                req = call.request.get("request") if isinstance(call.request, Mapping) else None
                item["model"] = req.get("model") if isinstance(req, Mapping) else None
            else:
                tool_calls += 1
                item["name"] = _tool_name(call.request) if isinstance(call.request, Mapping) else None
                item["arguments"] = (
                    call.request.get("arguments") if isinstance(call.request, Mapping) else None
                )
            if call.answered and isinstance(call.response, Mapping):
                if "error" in call.response:
                    item["error"] = call.response["error"]
                else:
                    item["response"] = call.response.get("response")
            else:
                item["unanswered"] = True
            timeline.append(item)
        elif e.seq in log.response_seqs:
            continue
        elif e.type == FINAL_RESPONSE:
            if final_response is None:
                final_response = e.payload
        elif not e.type.startswith(IGNORED_PREFIXES):
            timeline.append({"kind": "event", "type": e.type, "payload": e.payload})
    return ReplayState(
        {
            "timeline": timeline,
            "llm_calls": llm_calls,
            "tool_calls": tool_calls,
            "final_response": final_response,
        }
    )


def replay_log(record: ExecutionRecord) -> ReplayState:
    """Replay a recorded log into its state (no agent code): `reconstruct_state(record)`."""
    return reconstruct_state(record)


@dataclass
class _Entry:
    seq: int
    type: str
    payload: Any
    request_ref: Optional[int] = None  # session seq of the request a response answers
    sink_seq: Optional[int] = None  # seq of this event in the sink execution, once written


def _describe_event(e: ExecutionEvent) -> Dict[str, Any]:
    kind = _REQUEST_KIND.get(e.type)
    p = e.payload if isinstance(e.payload, Mapping) else {}
    if kind == LLM:
        req = p.get("request") if isinstance(p.get("request"), Mapping) else {}
        return {"type": e.type, "model": req.get("model"), "prompt_hash": _call_key(LLM, p)}
    if kind == TOOL:
        return {"type": e.type, "name": _tool_name(p), "args_hash": p.get("args_hash") or _call_key(TOOL, p)}
    return {"type": e.type, "payload_hash": content_hash(e.payload)}


def _short(d: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items() if v is not None)


class ReplaySession:
    """Serves a recorded log to re-running agent code; see the module docstring."""

    def __init__(
        self,
        source: Union[ExecutionRecord, Sequence[ExecutionEvent]],
        *,
        strict: bool = True,
        llm: Optional[Callable[[Mapping[str, Any]], Any]] = None,
        tools: Optional[Mapping[str, Callable[[Any], Any]]] = None,
        sink: Any = None,
        sink_factory: Optional[Callable[[], Any]] = None,
        live_after_log: bool = False,
        log_in_sink: Optional[Mapping[int, int]] = None,
    ):
        """Prepare a replay of `source` (a record, or its events).

        `llm` and `tools` are the live callables for calls the log cannot answer (permissive mode,
        or after the log in a fork). `sink` is an execution handle new events are written to;
        `sink_factory` creates one at the first live call instead. `live_after_log` lets a strict
        session run live once the whole log is consumed (a fork). `log_in_sink` maps the log's
        seqs to the sink's when the log is already in the sink (a fork's copied prefix).
        """
        if isinstance(source, ExecutionRecord):
            self._record: Optional[ExecutionRecord] = source
            events: Sequence[ExecutionEvent] = source.events
        else:
            self._record = None
            events = source
        self.strict = strict
        self._log = EventLog(events)
        self._llm = llm
        self._tools = dict(tools or {})
        self._sink = sink
        self._sink_factory = sink_factory
        self._live_after_log = live_after_log
        self._log_in_sink = dict(log_in_sink) if log_in_sink is not None else None
        self._cursor = 0  # strict: index into the log's events
        self._used: Dict[Tuple[str, Optional[str]], int] = defaultdict(int)  # permissive: per key
        self._entries: List[_Entry] = []
        self._final: Any = None
        self._finished = False
        self.served = 0
        self.live = 0

    # -- construction helpers ----------------------------------------------------------------

    @classmethod
    def from_store(
        cls,
        store: Any,
        execution_id: str,
        *,
        strict: bool = True,
        llm: Optional[Callable[[Mapping[str, Any]], Any]] = None,
        tools: Optional[Mapping[str, Callable[[Any], Any]]] = None,
    ) -> "ReplaySession":
        """A session over a stored execution; permissive sessions record into a new linked execution."""
        record = store.get(execution_id)
        factory = None
        if not strict:

            def factory() -> Any:
                return store.start(
                    intent_of(record),
                    record.envelope,
                    parent_execution_id=record.execution_id,
                )

        return cls(record, strict=strict, llm=llm, tools=tools, sink_factory=factory)

    # -- what the agent calls -------------------------------------------------------------------

    def llm(
        self,
        request: Mapping[str, Any],
        call: Optional[Callable[[Mapping[str, Any]], Any]] = None,
        *,
        key: Optional[str] = None,
    ) -> Any:
        """The response to an LLM request: recorded when the log has it, else from the live call.

        `key` is the content hash the request is matched on, for callers whose requests have
        another shape than the session's (an HTTP request, a framework's model input); by
        default it is `prompt_hash(request)`.
        """
        self._check_open()
        key = key or prompt_hash(request)
        got = {"type": LLM_REQUESTED, "model": request.get("model"), "prompt_hash": key}
        recorded = self._match(LLM, key, got)
        if recorded is not None and recorded.answered:
            return self._serve(recorded)
        fn = call or self._llm
        if fn is None:
            raise InvalidInputError(
                f"no recorded response for the LLM request {key} and no live LLM to call",
                hint="pass llm= to the session, or replay a log that holds this call",
            )
        payload = {"prompt_hash": key, "request": dict(request)}
        return self._run_live(LLM, payload, lambda: fn(request), recorded)

    def tool(self, name: str, arguments: Any, call: Optional[Callable[[Any], Any]] = None) -> Any:
        """The result of a tool call (`fn(arguments)`): recorded when the log has it, else live."""
        self._check_open()
        h = args_hash(arguments)
        key = f"{name}:{h}"
        got = {"type": TOOL_REQUESTED, "name": name, "args_hash": h}
        recorded = self._match(TOOL, key, got)
        if recorded is not None and recorded.answered:
            return self._serve(recorded)
        fn = call or self._tools.get(name)
        if fn is None:
            raise InvalidInputError(
                f"no recorded response for tool call {name}({canonical_json(arguments)}) "
                f"and no live tool {name!r}",
                hint="pass tools={name: fn} to the session, or replay a log that holds this call",
            )
        payload = {"name": name, "arguments": arguments, "args_hash": h}
        return self._run_live(TOOL, payload, lambda: fn(arguments), recorded)

    def event(self, type: str, payload: Any) -> int:
        """Emit any other event (router decision, dedup denial, ...); strict mode checks it.

        Returns its seq in this session's own log.
        """
        self._check_open()
        if self.strict:
            e = self._next_expected()
            if e is not None:
                if e.type != type or canonical_json(e.payload) != canonical_json(payload):
                    raise ReplayDivergenceError(
                        e.seq,
                        _short(_describe_event(e)),
                        _short({"type": type, "payload_hash": content_hash(payload)}),
                    )
                self._cursor += 1
                return self._emit(type, payload, orig_seq=e.seq).seq
            self._end_of_log({"type": type, "payload_hash": content_hash(payload)})
        return self._emit(type, payload).seq

    def finish(self, response: Mapping[str, Any]) -> None:
        """End the run; strict mode requires the whole log consumed and the same final response."""
        self._check_open()
        got = {"type": FINAL_RESPONSE, "response_hash": content_hash(response)}
        recorded_final = False
        if self.strict:
            e = self._next_expected()
            if e is not None:
                expected_response = self._record_final(e)
                if e.type != FINAL_RESPONSE or canonical_json(expected_response) != canonical_json(response):
                    exp = _describe_event(e)
                    if e.type == FINAL_RESPONSE:
                        exp = {"type": FINAL_RESPONSE, "response_hash": content_hash(expected_response)}
                    raise ReplayDivergenceError(e.seq, _short(exp), _short(got))
                self._cursor += 1
                recorded_final = True
            elif not self._live_after_log:
                self._end_of_log(got)
        self._final = response
        self._finished = True
        self._entries.append(_Entry(len(self._entries) + 1, FINAL_RESPONSE, response))
        if self._sink is not None and not (recorded_final and self._log_in_sink is not None):
            done = self._sink.finish(response)
            if inspect.isawaitable(done):
                _refuse_async(done)

    # -- results ----------------------------------------------------------------------------------

    @property
    def events(self) -> List[ExecutionEvent]:
        """The events this session emitted so far (served and live), numbered from 1."""
        return [ExecutionEvent(e.seq, e.type, e.payload) for e in self._entries]

    def state(self) -> ReplayState:
        """The state reconstructed from what this session emitted."""
        return reconstruct_state(self.events, self._final)

    def state_bytes(self) -> bytes:
        """`state().to_bytes()`."""
        return self.state().to_bytes()

    @property
    def execution(self) -> Any:
        """The execution new events go to (None until a permissive session made one)."""
        return self._sink

    @property
    def new_execution_id(self) -> Optional[str]:
        """The id of the execution this session records into, if any."""
        return getattr(self._sink, "execution_id", None)

    @property
    def consumed(self) -> bool:
        """Strict mode: True once every recorded event was matched."""
        return self._next_expected() is None

    # -- internals --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._finished:
            raise InvalidInputError(
                "this replay session is finished", hint="start a new session, or fork the execution"
            )

    def _record_final(self, e: ExecutionEvent) -> Any:
        if self._record is not None and self._record.finalResponse is not None:
            return self._record.finalResponse
        return e.payload

    def _next_expected(self) -> Optional[ExecutionEvent]:
        events = self._log.events
        while self._cursor < len(events):
            e = events[self._cursor]
            if e.seq in self._log.response_seqs or e.type.startswith(IGNORED_PREFIXES):
                self._cursor += 1
                continue
            if e.type in _RESPONSE_KIND:
                self._cursor += 1  # an answer without its request: nothing to compare it with
                continue
            return e
        return None

    def _end_of_log(self, got: Mapping[str, Any]) -> None:
        if not self._live_after_log:
            raise ReplayDivergenceError(self._log.last_seq + 1, "end of log", _short(got))

    def _match(self, kind: str, key: str, got: Mapping[str, Any]) -> Optional[RecordedCall]:
        if self.strict:
            e = self._next_expected()
            if e is None:
                self._end_of_log(got)
                return None
            call = self._log.by_request_seq.get(e.seq)
            if call is None or call.kind != kind or call.key != key:
                raise ReplayDivergenceError(e.seq, _short(_describe_event(e)), _short(got))
            self._cursor += 1
            if not call.answered and not self._live_after_log:
                raise ReplayDivergenceError(
                    e.seq, f"a recorded {_RESPONSE_TYPE[kind]} (the log ends inside this call)", _short(got)
                )
            return call
        calls = self._log.by_key.get((kind, key))
        i = self._used[(kind, key)]
        if calls is None or i >= len(calls):
            return None
        self._used[(kind, key)] = i + 1
        return calls[i]

    def _serve(self, call: RecordedCall) -> Any:
        self.served += 1
        req = self._emit(self._req_type(call.kind), call.request, orig_seq=call.request_seq)
        payload = call.response
        if isinstance(payload, Mapping):
            payload = {**payload, "request_seq": req.seq}
        self._emit(_RESPONSE_TYPE[call.kind], payload, request_ref=req.seq, orig_seq=call.response_seq)
        if isinstance(payload, Mapping) and "error" in payload:
            err = payload["error"] if isinstance(payload["error"], Mapping) else {"message": payload["error"]}
            raise RecordedCallError(
                call.request_seq, str(err.get("type", "Error")), str(err.get("message", ""))
            )
        return payload.get("response") if isinstance(payload, Mapping) else payload

    @staticmethod
    def _req_type(kind: str) -> str:
        return LLM_REQUESTED if kind == LLM else TOOL_REQUESTED

    def _run_live(
        self,
        kind: str,
        request_payload: dict,
        run: Callable[[], Any],
        recorded: Optional[RecordedCall],
    ) -> Any:
        self.live += 1
        self._materialize()
        if recorded is not None and self._log_in_sink is not None:
            # The request is already in the sink (a fork cut inside this call): answer it there.
            req = self._emit(self._req_type(kind), recorded.request, orig_seq=recorded.request_seq)
        else:
            req = self._emit(self._req_type(kind), request_payload)
        base = {k: request_payload[k] for k in ("prompt_hash", "name", "args_hash") if k in request_payload}
        try:
            result = run()
        except Exception as exc:
            self._emit(
                _RESPONSE_TYPE[kind],
                {**base, "request_seq": req.seq, "error": {"type": type(exc).__name__, "message": str(exc)}},
                request_ref=req.seq,
            )
            raise
        answer = {**base, "request_seq": req.seq, "response": result}
        self._emit(_RESPONSE_TYPE[kind], answer, request_ref=req.seq)
        return result

    def _materialize(self) -> None:
        if self._sink is not None or self._sink_factory is None:
            return
        self._sink = self._sink_factory()
        for entry in self._entries:
            self._write(entry)

    def _emit(
        self,
        type: str,
        payload: Any,
        *,
        request_ref: Optional[int] = None,
        orig_seq: Optional[int] = None,
    ) -> _Entry:
        entry = _Entry(len(self._entries) + 1, type, payload, request_ref)
        self._entries.append(entry)
        if orig_seq is not None and self._log_in_sink is not None and orig_seq in self._log_in_sink:
            entry.sink_seq = self._log_in_sink[orig_seq]  # already there: the fork copied it
        elif self._sink is not None:
            self._write(entry)
        return entry

    def _write(self, entry: _Entry) -> None:
        if entry.sink_seq is not None:
            return
        payload = entry.payload
        if entry.request_ref is not None and isinstance(payload, Mapping):
            # request_seq must name the request's seq in the sink, not in this session.
            payload = {**payload, "request_seq": self._entries[entry.request_ref - 1].sink_seq}
        seq = self._sink.event(entry.type, payload)
        if inspect.isawaitable(seq):
            _refuse_async(seq)
        entry.sink_seq = seq


def _refuse_async(pending: Any) -> None:
    # An un-awaited coroutine records nothing: fail loudly instead of losing the trace.
    if hasattr(pending, "close"):
        pending.close()
    raise UsageError(
        "replay sessions record synchronously and were given an asyncio execution handle",
        hint="record through a sync store (tracedb.open) or the sync sidecar client",
    )


def live_session(
    execution: Any,
    *,
    llm: Optional[Callable[[Mapping[str, Any]], Any]] = None,
    tools: Optional[Mapping[str, Callable[[Any], Any]]] = None,
) -> ReplaySession:
    """A session that calls the model and tools live and records every call into `execution`."""
    return ReplaySession([], strict=False, llm=llm, tools=tools, sink=execution)


def replay_session(
    store: Any,
    execution_id: str,
    *,
    strict: bool = True,
    llm: Optional[Callable[[Mapping[str, Any]], Any]] = None,
    tools: Optional[Mapping[str, Callable[[Any], Any]]] = None,
) -> ReplaySession:
    """`ReplaySession.from_store`: replay a stored execution's log, strict by default."""
    return ReplaySession.from_store(store, execution_id, strict=strict, llm=llm, tools=tools)
