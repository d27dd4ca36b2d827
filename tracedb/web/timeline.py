"""An execution's events laid out on a time axis: calls as bars, every event as a tick.

LLM and tool calls are paired the way event-log replay pairs them (`tracedb.replay.EventLog`:
by `request_seq`, else by call key, else in order; a test holds the two to the same answer), so a
bar is exactly the call replay would serve. A call with no response in an execution that stopped is drawn open to where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tracedb.records.outcomes import event_error
from tracedb.reads.reader import Timeline
from tracedb.records.record import LLM_REQUESTED, LLM_RESPONDED, STATUS_RUNNING, TOOL_REQUESTED, TOOL_RESPONDED
from tracedb.replay import args_hash, prompt_hash

LLM = "llm"
TOOL = "tool"


@dataclass(frozen=True)
class Bar:
    """One LLM or tool call: from its request to its response (None: never answered)."""

    kind: str
    label: str
    request_seq: int
    response_seq: Optional[int]
    start_ns: int
    end_ns: Optional[int]
    lane: int
    error: Optional[dict] = None  # {code, message} of a call whose answer was an error

    @property
    def duration_ns(self) -> Optional[int]:
        return None if self.end_ns is None else max(0, self.end_ns - self.start_ns)


@dataclass(frozen=True)
class Tick:
    """One event at the time it was recorded."""

    seq: int
    type: str
    at_ns: int


@dataclass(frozen=True)
class Layout:
    """Where everything goes: the axis [t0, t1], the bars in lanes per kind, a tick per event,
    the event an execution that will not go on stopped at (None while it runs or when it finished)."""

    t0: int
    t1: int
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...]
    lanes: dict
    stopped_at: Optional[Tick]
    call_of_seq: dict  # request or response seq -> its Bar
    errors: dict  # seq -> {code, message} of each event that records an error (tracedb.records.outcomes)

    def x(self, ns: int, width: float) -> float:
        """The position of time `ns` on an axis `width` wide."""
        span = max(1, self.t1 - self.t0)
        return (ns - self.t0) / span * width


def _label(kind: str, payload) -> str:
    if not isinstance(payload, dict):
        return kind
    if kind == TOOL:
        return str(payload.get("name") or payload.get("tool") or "tool")
    request = payload.get("request")
    model = request.get("model") if isinstance(request, dict) else payload.get("model")
    return str(model or "llm")


@dataclass
class Call:
    """A request event and the response paired with it (None: unanswered)."""

    kind: str
    request_seq: int
    request: object
    response_seq: Optional[int] = None


_REQUEST = {LLM_REQUESTED: LLM, TOOL_REQUESTED: TOOL}
_RESPONSE = {LLM_RESPONDED: LLM, TOOL_RESPONDED: TOOL}


def _key(kind: str, payload, *, request: bool):
    """What event-log replay keys a call on; computed only for a response without request_seq."""
    if not isinstance(payload, dict):
        return None
    if kind == LLM:
        h = payload.get("prompt_hash")
        if h is None and request and isinstance(payload.get("request"), dict):
            h = prompt_hash(payload["request"])
        return h
    name = payload.get("name", payload.get("tool"))
    h = payload.get("args_hash")
    if h is None and request and "arguments" in payload:
        h = args_hash(payload["arguments"])
    return None if name is None or h is None else (name, h)


def pair_calls(events) -> list[Call]:
    """LLM and tool calls with their responses, paired as event-log replay pairs them
    (`tracedb.replay.EventLog`): by the response's `request_seq`; without one, the first
    unanswered call with the same key, else the first unanswered call of that kind. Keys are
    hashed only for responses that need them, so a 10,000-event execution pairs in a few ms."""
    calls: list[Call] = []
    by_seq: dict[int, Call] = {}
    pending: dict[str, list[Call]] = {LLM: [], TOOL: []}
    for e in events:
        kind = _REQUEST.get(e.type)
        if kind is not None:
            call = Call(kind, e.seq, e.payload)
            calls.append(call)
            by_seq[e.seq] = call
            pending[kind].append(call)
            continue
        kind = _RESPONSE.get(e.type)
        if kind is None or not pending[kind]:
            continue
        ref = e.payload.get("request_seq") if isinstance(e.payload, dict) else None
        call = by_seq.get(ref) if isinstance(ref, int) and not isinstance(ref, bool) else None
        if call is None or call.kind != kind or call.response_seq is not None:
            want = _key(kind, e.payload, request=False)
            call = next((c for c in pending[kind] if want is not None and _key(kind, c.request, request=True) == want),
                        pending[kind][0])
        pending[kind].remove(call)
        call.response_seq = e.seq
    return calls


def layout(timeline: Timeline) -> Layout:
    """The layout of `timeline` (the read API's record with its event times)."""
    record = timeline.record
    at = {t.seq: t.recorded_at_ns for t in timeline.event_times}
    errors = {}
    for e in record.events:
        err = event_error(e.type, e.payload)
        if err is not None:
            errors[e.seq] = err
    t0 = timeline.created_at_ns or (timeline.event_times[0].recorded_at_ns if timeline.event_times else 0)
    ticks = tuple(Tick(e.seq, e.type, at.get(e.seq, t0)) for e in record.events)
    t1 = max([t0 + 1] + [t.at_ns for t in ticks])
    finished = record.finalResponse is not None
    stopped = ticks[-1] if ticks and record.status != STATUS_RUNNING and not finished else None
    if stopped is None and not ticks and record.status != STATUS_RUNNING and not finished:
        stopped = Tick(0, "start", t0)
    if stopped is not None:
        # Room after the stop: a call left unanswered shows as an open bar running past it.
        t1 += max(1, (t1 - t0) // 12)
    bars: list[Bar] = []
    lane_ends: dict[str, list[int]] = {LLM: [], TOOL: []}
    for call in pair_calls(record.events):
        start = at.get(call.request_seq, t0)
        end = at.get(call.response_seq) if call.response_seq is not None else None
        # Parallel calls of one kind go to the first lane free at their start.
        ends = lane_ends[call.kind]
        lane = next((i for i, e in enumerate(ends) if e <= start), len(ends))
        stop = end if end is not None else t1
        if lane == len(ends):
            ends.append(stop)
        else:
            ends[lane] = stop
        bars.append(Bar(call.kind, _label(call.kind, call.request), call.request_seq, call.response_seq,
                        start, end, lane, errors.get(call.response_seq)))
    call_of_seq = {}
    for b in bars:
        call_of_seq[b.request_seq] = b
        if b.response_seq is not None:
            call_of_seq[b.response_seq] = b
    lanes = {kind: max(1, len(ends)) if ends else 0 for kind, ends in lane_ends.items()}
    return Layout(t0, t1, tuple(bars), ticks, lanes, stopped, call_of_seq, errors)
