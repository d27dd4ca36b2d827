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


# -- OpenInference ----------------------------------------------------------------------------

def test_openinference_kinds_other_than_llm_and_tool_get_their_types_and_lift_documents_and_texts():
    def types(kind, **attrs):
        (t, payload), = M.span_events(span(attrs={"openinference.span.kind": kind, **attrs}))
        return t, payload

    assert types("AGENT")[0] == "otel.invoke_agent"  # GenAI's name for the same span
    assert types("CHAIN")[0] == "otel.chain" and types("chain")[0] == "otel.chain"
    assert [types(k)[0] for k in ("GUARDRAIL", "EVALUATOR", "PROMPT")] == [
        "otel.guardrail", "otel.evaluator", "otel.prompt"]
    t, p = types("RETRIEVER", **{
        "input.value": "capital of France", "input.mime_type": "text/plain",
        "retrieval.documents.0.document.id": "d1", "retrieval.documents.0.document.content": "Paris is...",
        "retrieval.documents.0.document.score": 0.9, "retrieval.documents.0.document.metadata": '{"src": "wiki"}',
        "retrieval.documents.1.document.id": "d2", "retrieval.documents.1.document.content": "Lyon is...",
    })
    assert t == "otel.retriever" and p["query"] == "capital of France"
    assert p["documents"] == [{"id": "d1", "content": "Paris is...", "score": 0.9, "metadata": {"src": "wiki"}},
                              {"id": "d2", "content": "Lyon is..."}]
    assert p["otel"]["attributes"]["retrieval.documents.1.document.id"] == "d2"  # kept as sent
    t, p = types("EMBEDDING", **{"embedding.model_name": "text-embedding-3-small",
                                 "embedding.embeddings.0.embedding.text": "hello",
                                 "embedding.embeddings.0.embedding.vector": [0.1, 0.2]})
    assert (t, p["model"], p["texts"]) == ("otel.embeddings", "text-embedding-3-small", ["hello"])
    # GenAI's operation name wins over an OpenInference kind on the same span.
    both = span(attrs={"gen_ai.operation.name": "chat", "openinference.span.kind": "CHAIN"})
    assert [t for t, _ in M.span_events(both)] == ["llm.requested", "llm.responded"]


def test_openinference_messages_are_rebuilt_with_their_parts_and_counts_with_their_details():
    s = span(attrs={
        "openinference.span.kind": "LLM", "llm.model_name": "claude-x", "llm.provider": "anthropic",
        "llm.invocation_parameters": '{"max_completion_tokens": 64, "stop": "END", "n": 2, "top_p": 0.5}',
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.contents.0.message_content.type": "text",
        "llm.input_messages.0.message.contents.0.message_content.text": "what is this?",
        "llm.input_messages.0.message.contents.1.message_content.type": "image",
        "llm.input_messages.0.message.contents.1.message_content.image.image.url": "data:image/png;base64,AA",
        "llm.input_messages.1.message.role": "assistant",
        "llm.input_messages.1.message.function_call_name": "lookup",
        "llm.input_messages.1.message.function_call_arguments_json": '{"q": 1}',
        # index 10 after 2: indexes are numbers, not strings
        "llm.input_messages.10.message.role": "user", "llm.input_messages.10.message.content": "last",
        "llm.input_messages.2.message.role": "user", "llm.input_messages.2.message.content": "third",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.contents.0.message_content.type": "reasoning",
        "llm.output_messages.0.message.contents.0.message_content.text": "hmm",
        "llm.output_messages.0.message.content": "a cat",
        "llm.finish_reason": "end_turn",
        "llm.token_count.prompt": 100, "llm.token_count.completion": 20, "llm.token_count.total": 120,
        "llm.token_count.prompt_details.cache_read": 60, "llm.token_count.prompt_details.cache_write": 30,
        "llm.token_count.completion_details.reasoning": 5,
    })
    (_, requested), (_, responded) = M.span_events(s)
    req, resp = requested["request"], responded["response"]
    assert requested["provider"] == "anthropic" and req["model"] == "claude-x"
    assert (req["max_tokens"], req["stop_sequences"], req["choice_count"], req["top_p"]) == (64, ["END"], 2, 0.5)
    assert req["messages"] == [
        {"role": "user", "parts": [{"type": "text", "content": "what is this?"},
                                   {"type": "uri", "modality": "image", "uri": "data:image/png;base64,AA"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "name": "lookup", "arguments": {"q": 1}}]},
        {"role": "user", "parts": [{"type": "text", "content": "third"}]},
        {"role": "user", "parts": [{"type": "text", "content": "last"}]},
    ]
    assert resp["messages"] == [{"role": "assistant", "finish_reason": "end_turn", "parts": [
        {"type": "text", "content": "a cat"}, {"type": "reasoning", "content": "hmm"}]}]
    assert resp["finish_reasons"] == ["end_turn"]
    assert resp["usage"] == {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120,
                             "cache_read_input_tokens": 60, "cache_creation_input_tokens": 30,
                             "reasoning_output_tokens": 5}
    genai = span(attrs={"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 100,
                        "gen_ai.usage.cache_read.input_tokens": 60, "gen_ai.usage.cache_creation.input_tokens": 30})
    assert M.span_events(genai)[1][1]["response"]["usage"] == {
        "input_tokens": 100, "cache_read_input_tokens": 60, "cache_creation_input_tokens": 30}


def test_a_failed_openinference_call_takes_its_error_from_the_exception_event_and_the_root_its_output():
    exc = {"name": "exception", "time_ns": 15,
           "attributes": {"exception.type": "openai.RateLimitError", "exception.message": "429 slow down"}}
    failed = span(attrs={"openinference.span.kind": "LLM", "llm.model_name": "m"}, events=[exc], status=2)
    _req, (_t, responded) = M.span_events(failed)
    assert responded["error"] == {"type": "openai.RateLimitError", "message": "429 slow down"}
    tool = span(attrs={"openinference.span.kind": "TOOL", "tool.name": "search", "tool.id": "call_9",
                       "input.value": "plain words"}, events=[exc], status=2)
    (_, requested), (_, responded) = M.span_events(tool)
    assert requested["arguments"] == "plain words" and requested["call_id"] == "call_9"
    assert responded["error"]["type"] == "openai.RateLimitError" and "response" not in responded
    root = span("run", attrs={"openinference.span.kind": "AGENT", "agent.name": "Planner",
                              "output.value": '{"answer": 42}', "output.mime_type": "application/json"})
    assert M.response_of(root)["payload"]["output"] == {"answer": 42}
    assert M.response_of(root)["payload"]["agent"] == "Planner"
    assert M.intent_of(root, span(resource={"service.name": "unknown_service"})) == "Planner"
    text = span("run", attrs={"output.value": '{"not": "json"}', "output.mime_type": "text/plain"})
    assert M.response_of(text)["payload"]["output"] == '{"not": "json"}'  # the mime type says text


def test_an_openinference_span_exports_back_with_its_attributes_as_sent():
    from tracedb.otel.export import to_otlp_json
    from tracedb.records.record import ExecutionEvent, ExecutionHeader, ExecutionRecord

    attrs = {"openinference.span.kind": "LLM", "llm.model_name": "m",
             "llm.input_messages.0.message.role": "user", "llm.input_messages.0.message.content": "hi",
             "llm.output_messages.0.message.role": "assistant", "llm.output_messages.0.message.content": "yo",
             "llm.token_count.prompt": 3}
    events = M.span_events(span(attrs=attrs))
    M.link_request_seq(events, 1)
    record = ExecutionRecord(
        header=ExecutionHeader(executionId=M.execution_id_of("ab" * 16), createdUtcIso="2026-01-01T00:00:00Z",
                               envelopeHash="sha256:x", replayable=True, replayableReason=None),
        envelope={"intent": "otel"},
        events=[ExecutionEvent(seq=i + 1, type=t, payload=p) for i, (t, p) in enumerate(events)],
    )
    (exported,) = to_otlp_json(record)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    back = M.spans_from_json({"resourceSpans": [{"scopeSpans": [{"spans": [exported]}]}]})[0][0]
    assert back.attributes == attrs  # no gen_ai.* attribute added, none lost
