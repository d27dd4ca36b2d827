"""`tracedb.records.spans.span_tree`: the nesting of an execution's spans, from what the OTel mapping and
the Agents SDK processor record (the real recorders' trees are checked in tests/otel and
tests/integrations)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tracedb.otel import mapping as M
from tracedb.records.spans import span_tree


def ev(seq, type_, **payload):
    return SimpleNamespace(seq=seq, type=type_, payload=payload)


def otel_events(spans):
    """The events the OTel mapping writes for `spans`, numbered from 1 as a trace records them."""
    out = []
    for s in spans:
        for type_, payload in M.span_events(s):
            out.append(ev(len(out) + 1, type_, **payload))
    return out


def span(sid, parent, name, start, end, attrs=None, status=0, message=""):
    return M.Span("ab" * 16, sid * 8, parent * 8 if parent else None, name, 1, start, end, status, message,
                  attrs or {})


AGENT = {"gen_ai.operation.name": "invoke_agent"}
CHAT = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o"}
TOOL = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"}


def test_no_parents_means_no_tree():
    assert span_tree([ev(1, "INTENT_RECEIVED", intent="x"), ev(2, "tool.requested", name="t")]) is None
    # One span alone, however many events it has, is not nesting either.
    assert span_tree(otel_events([span("aa", None, "root", 1, 9, AGENT)])) is None


def test_otel_spans_nest_by_parent_ids_in_the_order_they_started():
    # Exported as the SDK exports them: children first, as they end; the root last.
    events = otel_events([
        span("cc", "aa", "execute_tool search", 30, 40, TOOL),
        span("bb", "aa", "chat gpt-4o", 10, 20, CHAT, status=2, message="429 slow down"),
        span("dd", "cc", "inner", 32, 35),
        span("aa", None, "invoke_agent bot", 5, 50, AGENT),
    ])
    tree = span_tree(events)
    assert tree.roots == ("aa" * 8,)
    rows = [(n.depth, n.name, n.kind, n.seqs, n.start_ns, n.end_ns) for n in tree.walk()]
    assert rows == [
        (0, "invoke_agent bot", "agent", (6,), 5, 50),
        (1, "chat gpt-4o", "llm", (3, 4), 10, 20),  # started first, listed first
        (1, "execute_tool search", "tool", (1, 2), 30, 40),
        (2, "inner", "span", (5,), 32, 35),
    ]
    assert tree.nodes["bb" * 8].error == {"code": "error", "message": "429 slow down"}
    assert tree.nodes["cc" * 8].error is None
    # Every event of a call names the parent, the request (written first) too.
    assert events[0].payload["parent_span_id"] == "aa" * 8
    assert {tree.span_of_seq[s] for s in (1, 2)} == {"cc" * 8}


def test_a_parent_not_recorded_yet_is_a_node_spanning_its_children():
    # A running trace: its root has not ended, so it has no event yet.
    events = otel_events([span("bb", "aa", "chat", 10, 20, CHAT), span("cc", "aa", "tool", 25, 40, TOOL)])
    tree = span_tree(events)
    (root,) = tree.walk()[:1]
    assert (root.span_id, root.recorded, root.seqs, root.start_ns, root.end_ns) == ("aa" * 8, False, (), 10, 40)
    assert root.children == ("bb" * 8, "cc" * 8)


def test_a_remote_parent_makes_a_root():
    child = span("bb", "aa", "chat", 10, 20, CHAT)
    child.parent_remote = True
    inner = span("cc", "bb", "tool", 12, 18, TOOL)
    tree = span_tree(otel_events([inner, child]))
    assert tree.roots == ("bb" * 8,) and tree.nodes["bb" * 8].parent_id is None
    assert "aa" * 8 not in tree.nodes


def test_agents_sdk_events_nest_and_take_times_from_when_they_were_recorded():
    events = [
        ev(1, "agents.span.started", span_id="s_agent", parent_id=None, type="agent", name="triage"),
        ev(2, "agents.span.started", span_id="s_resp", parent_id="s_agent", type="response", name=None),
        # Recorded before responses carried their span: the request has it inside `request`,
        # the response only points at the request.
        ev(3, "llm.requested", prompt_hash="h", request={"model": "gpt-4o", "span_id": "s_resp"}),
        ev(4, "llm.responded", prompt_hash="h", request_seq=3, response={}),
        ev(5, "tool.requested", name="get_weather", arguments={}, span_id="s_fn", parent_id="s_agent"),
        ev(6, "tool.responded", name="get_weather", request_seq=5, error={"type": "ToolError", "message": "down"},
           span_id="s_fn", parent_id="s_agent"),
        ev(7, "agents.span.ended", span_id="s_agent", parent_id=None, type="agent", name="triage", error=None),
        ev(8, "FINAL_RESPONSE", status="success"),
    ]
    at = {i: 1000 * i for i in range(1, 9)}
    tree = span_tree(events, at)
    rows = [(n.depth, n.name, n.kind, n.seqs, n.start_ns, n.end_ns, n.error) for n in tree.walk()]
    assert rows == [
        (0, "triage", "agent", (1, 7), 1000, 7000, None),
        (1, "gpt-4o", "llm", (2, 3, 4), 2000, 4000, None),
        (1, "get_weather", "tool", (5, 6), 5000, 6000, {"code": "ToolError", "message": "down"}),
    ]
    assert 8 not in tree.span_of_seq


@pytest.mark.parametrize("cycle", [["a", "b"], ["a", "b", "c"]])
def test_a_cycle_of_parents_still_draws_every_span_once(cycle):
    events = [ev(i + 1, "otel.span", span_id=s, parent_span_id=cycle[i - 1]) for i, s in enumerate(cycle)]
    events.append(ev(len(cycle) + 1, "otel.span", span_id="z", parent_span_id="a"))
    tree = span_tree(events)
    walked = tree.walk()
    assert sorted(n.span_id for n in walked) == sorted([*cycle, "z"])
    assert len(tree.roots) == 1 and walked[0].depth == 0
