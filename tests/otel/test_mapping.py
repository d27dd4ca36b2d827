"""The span-to-event mapping's rules that the end-to-end tests do not reach."""

from __future__ import annotations

from tracedb.otel import mapping as M


def span(name="s", parent=None, attrs=None, events=(), resource=None, status=0, message=""):
    return M.Span("ab" * 16, "cd" * 8, parent, name, 3, 10, 20, status, message, attrs or {},
                  list(events), (), resource or {}, {})


def test_the_intent_is_the_service_name_else_the_root_else_otel():
    named = {"service.name": "billing-agent"}
    unnamed = {"service.name": "unknown_service:python"}
    root = span("invoke_agent Billing", attrs={"gen_ai.agent.name": "Billing"}, resource=unnamed)
    child = span("chat", parent="ef" * 8, resource=unnamed)
    assert M.intent_of(None, span(resource=named)) == "billing-agent"
    assert M.intent_of(root, root) == "Billing"
    assert M.intent_of(span("workflow", resource=unnamed), child) == "workflow"
    assert M.intent_of(None, child) == "otel"


def test_messages_in_span_events_of_older_conventions_are_taken():
    s = span(attrs={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}, events=[
        {"name": "gen_ai.system.message", "time_ns": 1, "attributes": {"content": "be brief"}},
        {"name": "gen_ai.user.message", "time_ns": 2, "attributes": {"content": "hi"}},
        {"name": "gen_ai.choice", "time_ns": 3, "attributes": {"index": 0, "message": '{"content": "hello"}'}},
    ])
    (t1, requested), (t2, responded) = M.span_events(s)
    assert (t1, t2) == ("llm.requested", "llm.responded")
    assert requested["request"]["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert responded["response"]["messages"] == [{"index": 0, "message": {"content": "hello"}}]


def test_a_failed_llm_call_records_its_error_and_the_root_its_status():
    s = span(attrs={"gen_ai.operation.name": "chat", "error.type": "RateLimitError"}, status=2, message="429")
    _req, (_t, responded) = M.span_events(s)
    assert responded["error"] == {"type": "RateLimitError", "message": "429"} and "response" not in responded
    root = span("run", status=2, message="boom")
    assert M.response_of(root)["status"] == "error"
    assert M.response_of(root)["error"]["message"] == "boom"


def test_other_operations_get_a_namespaced_type_and_a_remote_parent_makes_a_root():
    assert M.span_events(span(attrs={"gen_ai.operation.name": "embeddings"}))[0][0] == "otel.embeddings"
    assert M.span_events(span(attrs={"gen_ai.operation.name": "weird op!"}))[0][0] == "otel.weird_op_"
    assert M.span_events(span())[0][0] == "otel.span"
    s = span(parent="ef" * 8)
    assert not s.is_root
    s.parent_remote = True
    assert s.is_root


def test_otlp_json_spans_take_enum_names_too_and_a_bad_value_refuses_only_its_span():
    span_doc = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "chat", "kind": "SPAN_KIND_CLIENT",
                "startTimeUnixNano": "10", "endTimeUnixNano": 20, "status": {"code": "STATUS_CODE_ERROR"},
                "attributes": [{"key": "n", "value": {"intValue": "7"}}]}
    bad = dict(span_doc, spanId="ef" * 8, attributes=[{"key": "n", "value": {"intValue": "seven"}}])
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [span_doc, bad]}]}]}
    spans, rejected = M.spans_from_json(doc)
    assert len(spans) == 1 and len(rejected) == 1 and "seven" in rejected[0]
    s = spans[0]
    assert (s.kind, s.status_code, s.start_ns, s.end_ns, s.attributes) == (3, 2, 10, 20, {"n": 7})
