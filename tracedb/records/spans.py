"""The span tree of an execution that came with nesting: OpenTelemetry spans (`tracedb.otel`)
and the OpenAI Agents SDK's spans (`tracedb.integrations.agents`).

Both recorders keep a span id and the parent's on the events of a span: OTel as `span_id` and
`parent_span_id` (the span's last event also in its `otel` object, with `parent_remote`), the
Agents SDK as `span_id` and `parent_id` (its model requests, recorded before this rule, only
inside `request`; their responses point at them with `request_seq`). `span_tree` gathers them into
one tree, pure (no I/O): the web view draws it beside the timeline.

A parent that the events name but no event belongs to (an OTel parent that has not ended yet:
the SDK exports children first) is kept as a node of its own, `recorded=False`, so a running
trace is already nested. A parent in another process (`parent_remote`) makes a root.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from tracedb.records.outcomes import event_error

# Event-type prefixes and the kind of span they stand for.
_KIND_OF_TYPE = (("llm.", "llm"), ("tool.", "tool"), ("otel.invoke_agent", "agent"), ("agents.handoff", "handoff"))
# The Agents SDK's span types, as kinds.
_AGENTS_KIND = {"response": "llm", "generation": "llm", "function": "tool"}


@dataclass(frozen=True)
class SpanNode:
    """One span: its events (seqs, in order), name and kind, when it ran (the span's own times
    where the source gave them, else its events'), its error, and where it hangs."""

    span_id: str
    parent_id: Optional[str]
    name: str
    kind: str
    seqs: tuple[int, ...]
    start_ns: Optional[int]
    end_ns: Optional[int]
    error: Optional[dict]  # {code, message} of the first error its events record (tracedb.records.outcomes)
    children: tuple[str, ...]
    depth: int
    recorded: bool = True

    @property
    def duration_ns(self) -> Optional[int]:
        if self.start_ns is None or self.end_ns is None:
            return None
        return max(0, self.end_ns - self.start_ns)


@dataclass(frozen=True)
class SpanTree:
    """The spans of one execution: roots first-started first, each node's children likewise."""

    roots: tuple[str, ...]
    nodes: Mapping[str, SpanNode]
    span_of_seq: Mapping[int, str]

    def walk(self) -> list[SpanNode]:
        """Every node, depth first, in the order a tree view lists them."""
        out: list[SpanNode] = []
        stack = list(reversed(self.roots))
        seen: set[str] = set()
        while stack:
            sid = stack.pop()
            if sid in seen:
                continue
            seen.add(sid)
            node = self.nodes[sid]
            out.append(node)
            stack.extend(reversed(node.children))
        return out

    @property
    def start_ns(self) -> Optional[int]:
        starts = [n.start_ns for n in self.nodes.values() if n.start_ns is not None]
        return min(starts) if starts else None

    @property
    def end_ns(self) -> Optional[int]:
        ends = [n.end_ns for n in self.nodes.values() if n.end_ns is not None]
        return max(ends) if ends else None


class _Acc:
    __slots__ = ("parent", "remote", "name", "label", "kind", "seqs", "start", "end", "t0", "t1", "error")

    def __init__(self) -> None:
        self.parent: Optional[str] = None
        self.remote = False
        self.name: Optional[str] = None  # the span's own name (OTel, Agents SDK)
        self.label: Optional[str] = None  # else one from its events (the model, the tool)
        self.kind: Optional[str] = None
        self.seqs: list[int] = []
        self.start: Optional[int] = None  # the source's span times
        self.end: Optional[int] = None
        self.t0: Optional[int] = None  # its events' recorded times
        self.t1: Optional[int] = None
        self.error: Optional[dict] = None


def _str(value) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def _int(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _ids(payload: dict) -> tuple[Optional[str], Optional[str]]:
    """The span id an event belongs to and its parent's (None: not given)."""
    request = payload.get("request")
    sid = _str(payload.get("span_id")) or (_str(request.get("span_id")) if isinstance(request, dict) else None)
    otel = payload.get("otel")
    parent = _str(payload.get("parent_span_id")) or _str(payload.get("parent_id"))
    if parent is None and isinstance(otel, dict):
        parent = _str(otel.get("parent_span_id"))
    return sid, parent


def _kind_of(event_type: str, payload: dict) -> Optional[str]:
    agents_type = _str(payload.get("type")) if event_type.startswith("agents.span.") else None
    if agents_type is not None:
        return _AGENTS_KIND.get(agents_type, agents_type)
    for prefix, kind in _KIND_OF_TYPE:
        if event_type.startswith(prefix):
            return kind
    if event_type.startswith("otel."):
        return event_type[len("otel."):] if event_type != "otel.span" else "span"
    return None


def _label_of(event_type: str, payload: dict) -> Optional[str]:
    if event_type.startswith("llm."):
        request = payload.get("request")
        return _str(request.get("model")) if isinstance(request, dict) else None
    if event_type.startswith("tool."):
        return _str(payload.get("name"))
    if event_type == "agents.handoff":
        to = _str(payload.get("to_agent"))
        return f"handoff → {to}" if to else "handoff"
    return None


def span_tree(events: Iterable, recorded_at_ns: Optional[Mapping[int, int]] = None) -> Optional[SpanTree]:
    """The span tree of `events` (objects with seq, type, payload; in seq order), or None when
    they carry no nesting (no span has a parent). `recorded_at_ns` maps seq to when the event
    was recorded: the times of spans whose source gave none."""
    at = recorded_at_ns or {}
    spans: dict[str, _Acc] = {}
    span_of_seq: dict[int, str] = {}
    for e in events:
        payload = e.payload
        if not isinstance(payload, dict):
            continue
        sid, parent = _ids(payload)
        if sid is None:
            # A response that says which request it answers belongs to that request's span.
            ref = payload.get("request_seq")
            sid = span_of_seq.get(ref) if isinstance(ref, int) and not isinstance(ref, bool) else None
            if sid is None:
                continue
        acc = spans.get(sid)
        if acc is None:
            acc = spans[sid] = _Acc()
        span_of_seq[e.seq] = sid
        acc.seqs.append(e.seq)
        if parent is not None and parent != sid:
            acc.parent = parent
        otel = payload.get("otel")
        if isinstance(otel, dict):
            acc.remote = acc.remote or bool(otel.get("parent_remote"))
            acc.name = _str(otel.get("name")) or acc.name
            acc.start = _int(otel.get("start_ns")) or acc.start
            acc.end = _int(otel.get("end_ns")) or acc.end
        if e.type.startswith("agents.span."):
            acc.name = _str(payload.get("name")) or acc.name
        acc.label = acc.label or _label_of(e.type, payload)
        kind = _kind_of(e.type, payload)
        if kind is not None and (acc.kind is None or acc.kind in ("span", "custom")):
            acc.kind = kind
        acc.error = acc.error or event_error(e.type, payload)
        t = at.get(e.seq)
        if t is not None:
            acc.t0 = t if acc.t0 is None else min(acc.t0, t)
            acc.t1 = t if acc.t1 is None else max(acc.t1, t)
    # Parents named but never recorded: nodes of their own.
    for sid, acc in list(spans.items()):
        if acc.parent is not None and not acc.remote and acc.parent not in spans:
            spans[acc.parent] = _Acc()
    if not any(acc.parent is not None and not acc.remote for acc in spans.values()):
        return None
    children: dict[str, list[str]] = {sid: [] for sid in spans}
    roots: list[str] = []
    for sid, acc in spans.items():
        if acc.parent is None or acc.remote:
            roots.append(sid)
        else:
            children[acc.parent].append(sid)

    def first(sid: str) -> Optional[int]:
        acc = spans[sid]
        return acc.start if acc.start is not None else acc.t0

    def start_of(sid: str) -> tuple:
        # Unrecorded parents (no times) go before their children; ties by first event.
        t = first(sid)
        return (t if t is not None else -1, spans[sid].seqs[0] if spans[sid].seqs else -1)

    # A cycle of parents has no root: its first span becomes one, so that every span is drawn.
    reachable: set[str] = set()

    def reach(sid: str) -> None:
        stack = [sid]
        while stack:
            s = stack.pop()
            if s not in reachable:
                reachable.add(s)
                stack.extend(children[s])

    for sid in roots:
        reach(sid)
    for sid in spans:
        if sid not in reachable:
            roots.append(sid)
            children[spans[sid].parent].remove(sid)
            reach(sid)
    roots.sort(key=start_of)
    nodes: dict[str, SpanNode] = {}
    order: list[tuple[str, int]] = []  # parents before children
    stack: list[tuple[str, int]] = [(sid, 0) for sid in roots]
    while stack:
        sid, depth = stack.pop()
        order.append((sid, depth))
        children[sid].sort(key=start_of)
        stack.extend((k, depth + 1) for k in children[sid])
    for sid, depth in reversed(order):  # children first: an unrecorded parent spans them
        acc = spans[sid]
        kids = tuple(children[sid])
        start, end = first(sid), acc.end if acc.end is not None else acc.t1
        if not acc.seqs:
            starts = [nodes[k].start_ns for k in kids if nodes[k].start_ns is not None]
            ends = [nodes[k].end_ns for k in kids if nodes[k].end_ns is not None]
            start, end = (min(starts) if starts else None), (max(ends) if ends else None)
        nodes[sid] = SpanNode(
            span_id=sid,
            parent_id=None if acc.remote else acc.parent,
            name=acc.name or acc.label or (acc.kind if acc.seqs else sid),
            kind=acc.kind or "span",
            seqs=tuple(acc.seqs),
            start_ns=start,
            end_ns=end,
            error=acc.error,
            children=kids,
            depth=depth,
            recorded=bool(acc.seqs),
        )
    return SpanTree(tuple(roots), nodes, span_of_seq)
