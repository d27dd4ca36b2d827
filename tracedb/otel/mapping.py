"""OpenTelemetry spans as tracedb events, and back (docs/otel.md has the whole table).

One trace is one execution, `otel-<trace id>`. Each span becomes events, written in the order
the spans arrive (the SDK exports a span when it ends, so children come before their parent):

- LLM calls (GenAI `chat` / `text_completion` / `generate_content` spans, OpenInference `LLM`
  spans): `llm.requested` (model, input messages, request parameters) then `llm.responded`
  (output messages, finish reasons, usage), in the payload shape event-log replay reads
  (`request`, `request_seq`, `response`; it computes the prompt and argument hashes itself);
- tool calls (GenAI `execute_tool`, OpenInference `TOOL`): `tool.requested` (name, arguments)
  then `tool.responded` (result);
- every other span: one `otel.span` event (or `otel.<gen_ai.operation.name>`, e.g.
  `otel.invoke_agent`; OpenInference kinds likewise: `otel.invoke_agent`, `otel.chain`, ...).

Both conventions give the same payload shape: messages are GenAI's {"role", "parts"}, which
OpenInference's flattened `llm.*_messages.N.message.*` attributes are rebuilt into, and one
table (`USAGE`, `REQUEST_PARAMS`) names the attributes of both.

Each span's last event carries an `otel` object with whatever the events do not already hold
(name, kind, times, status, the remaining attributes, span events, links, scope), so that
`to_otlp_json` gives the spans back. The root span (no parent, or a remote one) also finishes
the execution.

Spans come from three places, all turned into `Span`: OTLP protobuf (`spans_from_proto`),
OTLP/JSON (`spans_from_json`), and the SDK's `ReadableSpan` (`spans_from_sdk`).
"""

from __future__ import annotations

import base64
from typing import Any, Iterable, Optional

import orjson

from tracedb.records.ids import OTEL_PREFIX
from tracedb.records.record import LLM_REQUESTED, LLM_RESPONDED, TOOL_REQUESTED, TOOL_RESPONDED
from tracedb.records.validation import check_response, payload_json

EXECUTION_PREFIX = OTEL_PREFIX
SPAN_EVENT = "otel.span"
LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
TOOL_OPERATION = "execute_tool"
DEFAULT_INTENT = "otel"

# OTLP's SpanKind and StatusCode numbers, by name (and back).
KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")
STATUS_CODES = ("unset", "ok", "error")
# Span.flags: bit 8 says whether bit 9 is known; bit 9 says the parent is remote.
_PARENT_REMOTE_KNOWN = 0x100
_PARENT_REMOTE = 0x200

# Attributes lifted into structured fields of the events; `to_otlp_json` writes them back.
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
LIFTED = (INPUT_MESSAGES, OUTPUT_MESSAGES, SYSTEM_INSTRUCTIONS, TOOL_ARGUMENTS, TOOL_RESULT)
# Older conventions put messages in span events of these names.
_INPUT_EVENT_ROLES = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
# Request parameters: (event field, GenAI `gen_ai.request.<name>`, OpenInference
# `llm.invocation_parameters` keys, the first present taken).
REQUEST_PARAMS = (
    ("temperature", "temperature", ("temperature",)),
    ("max_tokens", "max_tokens", ("max_tokens", "max_completion_tokens", "max_output_tokens")),
    ("top_p", "top_p", ("top_p",)),
    ("top_k", "top_k", ("top_k",)),
    ("frequency_penalty", "frequency_penalty", ("frequency_penalty",)),
    ("presence_penalty", "presence_penalty", ("presence_penalty",)),
    ("stop_sequences", "stop_sequences", ("stop_sequences", "stop")),
    ("seed", "seed", ("seed",)),
    ("choice_count", "choice.count", ("n",)),
    ("encoding_formats", "encoding_formats", ()),
)
# Token counts: (event field in `response.usage`, GenAI attribute, OpenInference attribute).
# Both conventions count cached tokens inside the input count; the cache counts are parts of it.
GENAI, OPENINFERENCE = 1, 2
USAGE = (
    ("input_tokens", "gen_ai.usage.input_tokens", "llm.token_count.prompt"),
    ("output_tokens", "gen_ai.usage.output_tokens", "llm.token_count.completion"),
    ("total_tokens", None, "llm.token_count.total"),
    ("cache_read_input_tokens", "gen_ai.usage.cache_read.input_tokens", "llm.token_count.prompt_details.cache_read"),
    ("cache_creation_input_tokens", "gen_ai.usage.cache_creation.input_tokens",
     "llm.token_count.prompt_details.cache_write"),
    ("reasoning_output_tokens", "gen_ai.usage.reasoning.output_tokens", "llm.token_count.completion_details.reasoning"),
    ("audio_input_tokens", None, "llm.token_count.prompt_details.audio"),
    ("audio_output_tokens", None, "llm.token_count.completion_details.audio"),
)
# OpenInference span kinds other than LLM and TOOL, as event types: the GenAI operation's name
# where the two conventions share one (an agent, embeddings), else otel.<kind>.
OI_SPAN_KIND = "openinference.span.kind"
OI_EVENT_TYPES = {"AGENT": "otel.invoke_agent", "EMBEDDING": "otel.embeddings"}


class BadSpan(ValueError):
    """A span that cannot be recorded (bad ids); it is rejected, the rest of the request is not."""


class Span:
    """One ended span, whatever it came from. Ids are lowercase hex."""

    __slots__ = (
        "trace_id", "span_id", "parent_span_id", "parent_remote", "name", "kind", "start_ns",
        "end_ns", "status_code", "status_message", "attributes", "events", "links", "resource",
        "scope", "trace_state",
    )

    def __init__(self, trace_id, span_id, parent_span_id, name, kind=1, start_ns=0, end_ns=0,
                 status_code=0, status_message="", attributes=None, events=(), links=(),
                 resource=None, scope=None, parent_remote=False, trace_state=""):
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_span_id = parent_span_id or None
        self.parent_remote = parent_remote
        self.name = name
        self.kind = kind
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.status_code = status_code
        self.status_message = status_message
        self.attributes = attributes if attributes is not None else {}
        self.events = list(events)
        self.links = list(links)
        self.resource = resource if resource is not None else {}
        self.scope = scope if scope is not None else {}
        self.trace_state = trace_state

    @property
    def is_root(self) -> bool:
        """The trace's local root: no parent, or a parent in another process."""
        return self.parent_span_id is None or self.parent_remote


def execution_id_of(trace_id: str) -> str:
    """The execution a trace records into."""
    return EXECUTION_PREFIX + trace_id


def trace_id_of(execution_id: str) -> Optional[str]:
    """The trace id an execution id was derived from, or None."""
    if execution_id.startswith(EXECUTION_PREFIX) and len(execution_id) == len(EXECUTION_PREFIX) + 32:
        return execution_id[len(EXECUTION_PREFIX):]
    return None


# -- decoding ---------------------------------------------------------------------------------

def _hex_id(raw: bytes, size: int, what: str) -> str:
    if len(raw) != size or not any(raw):
        raise BadSpan(f"{what} must be {size} bytes and not all zero, got {len(raw)} bytes")
    return raw.hex()


def _any_value(v) -> Any:
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which == "int_value":
        return v.int_value
    if which == "bool_value":
        return v.bool_value
    if which == "double_value":
        return v.double_value
    if which == "array_value":
        return [_any_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    return None


def _attrs(kvs) -> dict:
    return {kv.key: _any_value(kv.value) for kv in kvs}


def spans_from_proto(request) -> tuple[list[Span], list[str]]:
    """The spans of an `ExportTraceServiceRequest`, and one message per span rejected."""
    spans: list[Span] = []
    rejected: list[str] = []
    for rs in request.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            scope = {"name": ss.scope.name, "version": ss.scope.version} if ss.scope.name else {}
            for s in ss.spans:
                try:
                    trace_id = _hex_id(s.trace_id, 16, "trace_id")
                    span_id = _hex_id(s.span_id, 8, "span_id")
                    parent = _hex_id(s.parent_span_id, 8, "parent_span_id") if s.parent_span_id else None
                except BadSpan as e:
                    rejected.append(f"span {s.name!r}: {e}")
                    continue
                flags = s.flags
                spans.append(Span(
                    trace_id, span_id, parent, s.name, s.kind, s.start_time_unix_nano,
                    s.end_time_unix_nano, s.status.code, s.status.message, _attrs(s.attributes),
                    [{"name": e.name, "time_ns": e.time_unix_nano, "attributes": _attrs(e.attributes)}
                     for e in s.events],
                    [{"trace_id": lk.trace_id.hex(), "span_id": lk.span_id.hex(),
                      "attributes": _attrs(lk.attributes)} for lk in s.links],
                    resource, scope,
                    parent_remote=bool(flags & _PARENT_REMOTE_KNOWN and flags & _PARENT_REMOTE),
                    trace_state=s.trace_state,
                ))
    return spans, rejected


def _json_value(v: Any) -> Any:
    if not isinstance(v, dict):
        raise BadSpan("an attribute value must be an AnyValue object")
    for key, val in v.items():
        if key == "stringValue":
            return val
        if key == "intValue":
            return int(val)
        if key == "boolValue":
            return bool(val)
        if key == "doubleValue":
            return float(val)
        if key == "arrayValue":
            return [_json_value(x) for x in (val or {}).get("values", ())]
        if key == "kvlistValue":
            return _json_attrs((val or {}).get("values", ()))
        if key == "bytesValue":
            return val
    return None


def _json_attrs(kvs: Any) -> dict:
    if not isinstance(kvs, list):
        raise BadSpan("attributes must be a list of {key, value}")
    out = {}
    for kv in kvs:
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise BadSpan("an attribute must be {key, value}")
        out[kv["key"]] = _json_value(kv.get("value") or {})
    return out


def _json_hex(d: dict, key: str, size: int, required: bool = True) -> Optional[str]:
    raw = d.get(key)
    if raw in (None, "") and not required:
        return None
    if not isinstance(raw, str) or len(raw) != size * 2:
        raise BadSpan(f"{key} must be {size * 2} hex digits, got {raw!r:.60}")
    try:
        if not any(bytes.fromhex(raw)):
            raise BadSpan(f"{key} must not be all zero")
    except ValueError:
        raise BadSpan(f"{key} must be {size * 2} hex digits, got {raw!r:.60}") from None
    return raw.lower()


# Enum names some writers put where OTLP/JSON asks for the number.
_ENUM_NAMES = {
    **{f"SPAN_KIND_{name.upper()}": i for i, name in enumerate(KINDS)},
    **{f"STATUS_CODE_{name.upper()}": i for i, name in enumerate(STATUS_CODES)},
}


def _int(v: Any, what: str) -> int:
    if isinstance(v, str) and v in _ENUM_NAMES:
        return _ENUM_NAMES[v]
    try:
        return int(v or 0)
    except (TypeError, ValueError):
        raise BadSpan(f"{what} must be an integer, got {v!r:.40}") from None


def spans_from_json(doc: Any) -> tuple[list[Span], list[str]]:
    """The spans of an OTLP/JSON `ExportTraceServiceRequest` (hex ids, integer enums, int64s as
    strings or numbers). A malformed document raises ValueError; a malformed span is rejected."""
    if not isinstance(doc, dict):
        raise ValueError("the body must be a JSON object with resourceSpans")
    spans: list[Span] = []
    rejected: list[str] = []
    for rs in _list(doc, "resourceSpans"):
        resource = _json_attrs((rs.get("resource") or {}).get("attributes", []))
        for ss in _list(rs, "scopeSpans"):
            sc = ss.get("scope") or {}
            scope = {"name": sc.get("name", ""), "version": sc.get("version", "")} if sc.get("name") else {}
            for s in _list(ss, "spans"):
                name = s.get("name", "") if isinstance(s, dict) else ""
                try:
                    if not isinstance(s, dict):
                        raise BadSpan("a span must be an object")
                    status = s.get("status") or {}
                    flags = _int(s.get("flags"), "flags")
                    spans.append(Span(
                        _json_hex(s, "traceId", 16), _json_hex(s, "spanId", 8),
                        _json_hex(s, "parentSpanId", 8, required=False), str(name),
                        _int(s.get("kind", 1), "kind"),
                        _int(s.get("startTimeUnixNano"), "startTimeUnixNano"),
                        _int(s.get("endTimeUnixNano"), "endTimeUnixNano"),
                        _int(status.get("code"), "status.code"), str(status.get("message", "")),
                        _json_attrs(s.get("attributes", [])),
                        [{"name": e.get("name", ""), "time_ns": _int(e.get("timeUnixNano"), "timeUnixNano"),
                          "attributes": _json_attrs(e.get("attributes", []))} for e in s.get("events", ())],
                        [{"trace_id": lk.get("traceId", ""), "span_id": lk.get("spanId", ""),
                          "attributes": _json_attrs(lk.get("attributes", []))} for lk in s.get("links", ())],
                        resource, scope,
                        parent_remote=bool(flags & _PARENT_REMOTE_KNOWN and flags & _PARENT_REMOTE),
                        trace_state=str(s.get("traceState", "")),
                    ))
                except (ValueError, AttributeError, TypeError, RecursionError) as e:
                    rejected.append(f"span {str(name)[:80]!r}: {e}")
    return spans, rejected


def _list(d: Any, key: str) -> list:
    if not isinstance(d, dict):
        raise ValueError(f"expected an object holding {key}")
    v = d.get(key, [])
    if not isinstance(v, list):
        raise ValueError(f"{key} must be a list")
    return v


def _sdk_value(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        return [_sdk_value(x) for x in v]
    if isinstance(v, bytes):
        return base64.b64encode(v).decode("ascii")
    return v


def spans_from_sdk(sdk_spans: Iterable) -> list[Span]:
    """The SDK's ReadableSpans (what a SpanExporter is given) as Spans."""
    out = []
    for s in sdk_spans:
        ctx = s.context
        parent = s.parent
        res = s.resource.attributes if s.resource is not None else {}
        scope = s.instrumentation_scope
        out.append(Span(
            format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"),
            format(parent.span_id, "016x") if parent is not None else None,
            s.name, s.kind.value + 1, s.start_time or 0, s.end_time or 0,
            s.status.status_code.value, s.status.description or "",
            {k: _sdk_value(v) for k, v in (s.attributes or {}).items()},
            [{"name": e.name, "time_ns": e.timestamp,
              "attributes": {k: _sdk_value(v) for k, v in (e.attributes or {}).items()}} for e in s.events],
            [{"trace_id": format(lk.context.trace_id, "032x"), "span_id": format(lk.context.span_id, "016x"),
              "attributes": {k: _sdk_value(v) for k, v in (lk.attributes or {}).items()}} for lk in s.links],
            {k: _sdk_value(v) for k, v in res.items()},
            {"name": scope.name, "version": scope.version or ""} if scope is not None else {},
            parent_remote=bool(parent is not None and parent.is_remote),
        ))
    return out


# -- spans to events --------------------------------------------------------------------------

def _parsed(value: Any) -> Any:
    """An attribute holding JSON text (messages, tool arguments) as the value it encodes."""
    if isinstance(value, str) and value[:1] in ("[", "{", '"'):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _event_messages(span: Span) -> tuple[list, list]:
    """Input and output messages from span events, as older GenAI conventions record them."""
    inputs, outputs = [], []
    for e in span.events:
        name = e["name"]
        attrs = e["attributes"]
        role = _INPUT_EVENT_ROLES.get(name)
        if role is not None:
            msg = {"role": attrs.get("role", role)}
            if "content" in attrs:
                msg["content"] = _parsed(attrs["content"])
            inputs.append(msg)
        elif name == "gen_ai.choice":
            outputs.append({k: _parsed(v) for k, v in attrs.items()})
        elif name == "gen_ai.content.prompt" and "gen_ai.prompt" in attrs:
            inputs.append(_parsed(attrs["gen_ai.prompt"]))
        elif name == "gen_ai.content.completion" and "gen_ai.completion" in attrs:
            outputs.append(_parsed(attrs["gen_ai.completion"]))
    return inputs, outputs


def _otel_part(span: Span, attributes: dict) -> dict:
    """What a span's events need besides their own fields to give the span back."""
    part = {
        "name": span.name,
        "kind": KINDS[span.kind] if 0 <= span.kind < len(KINDS) else span.kind,
        "start_ns": span.start_ns,
        "end_ns": span.end_ns,
        "status": STATUS_CODES[span.status_code] if 0 <= span.status_code < len(STATUS_CODES) else span.status_code,
        "attributes": attributes,
    }
    if span.status_message:
        part["status_message"] = span.status_message
    if span.parent_span_id is not None:
        part["parent_span_id"] = span.parent_span_id
        if span.parent_remote:
            part["parent_remote"] = True
    if span.events:
        part["events"] = span.events
    if span.links:
        part["links"] = span.links
    if span.scope:
        part["scope"] = span.scope
    if span.trace_state:
        part["trace_state"] = span.trace_state
    return part


def _rest(attrs: dict) -> dict:
    return {k: v for k, v in attrs.items() if k not in LIFTED}


def _error_of(span: Span) -> Optional[dict]:
    if span.status_code != 2:
        return None
    error_type = span.attributes.get("error.type")
    message = span.status_message
    # OpenInference (and the SDK's record_exception) put what was raised in an `exception` event.
    for e in span.events:
        if e["name"] == "exception":
            error_type = error_type or e["attributes"].get("exception.type")
            message = message or e["attributes"].get("exception.message")
            break
    return {
        "type": str(error_type or "error"),
        "message": str(message or error_type or "span status ERROR"),
    }


def operation_of(span: Span) -> Optional[str]:
    """The span's `gen_ai.operation.name`, if it has one."""
    op = span.attributes.get("gen_ai.operation.name")
    return op if isinstance(op, str) and op else None


def openinference_kind(span: Span) -> Optional[str]:
    """The span's `openinference.span.kind` (LLM, TOOL, CHAIN, AGENT, ...), if it has one."""
    kind = span.attributes.get(OI_SPAN_KIND)
    return kind.upper() if isinstance(kind, str) and kind else None


def _safe_type_part(text: str) -> str:
    part = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in text)[:64]
    return part or "span"


def _usage(attrs: dict, convention: int) -> dict:
    """Token counts under the event's names; `convention` is the column of USAGE to read."""
    out = {}
    for row in USAGE:
        key = row[convention]
        if key is not None and attrs.get(key) is not None:
            out[row[0]] = attrs[key]
    return out


# -- GenAI semantic conventions ---------------------------------------------------------------

def _genai_llm(span: Span) -> tuple[dict, Any, dict]:
    """A GenAI chat span's request, provider and response."""
    attrs = span.attributes
    inputs, outputs = _event_messages(span)
    request: dict[str, Any] = {"model": attrs.get("gen_ai.request.model")}
    if INPUT_MESSAGES in attrs:
        request["messages"] = _parsed(attrs[INPUT_MESSAGES])
    elif inputs:
        request["messages"] = inputs
    if SYSTEM_INSTRUCTIONS in attrs:
        request["system"] = _parsed(attrs[SYSTEM_INSTRUCTIONS])
    for field, genai, _ in REQUEST_PARAMS:
        v = attrs.get("gen_ai.request." + genai)
        if v is not None:
            request[field] = v
    response: dict[str, Any] = {"model": attrs.get("gen_ai.response.model", request["model"])}
    if OUTPUT_MESSAGES in attrs:
        response["messages"] = _parsed(attrs[OUTPUT_MESSAGES])
    elif outputs:
        response["messages"] = outputs
    if "gen_ai.response.id" in attrs:
        response["id"] = attrs["gen_ai.response.id"]
    if "gen_ai.response.finish_reasons" in attrs:
        response["finish_reasons"] = attrs["gen_ai.response.finish_reasons"]
    usage = _usage(attrs, GENAI)
    if usage:
        response["usage"] = usage
    return request, attrs.get("gen_ai.provider.name", attrs.get("gen_ai.system")), response


def _genai_tool(span: Span) -> tuple[Any, Any, Any, Any]:
    """A GenAI execute_tool span's name, arguments, call id and result."""
    attrs = span.attributes
    return (attrs.get("gen_ai.tool.name") or span.name, _parsed(attrs.get(TOOL_ARGUMENTS)),
            attrs.get("gen_ai.tool.call.id"), _parsed(attrs.get(TOOL_RESULT)))


# -- OpenInference ----------------------------------------------------------------------------
#
# OpenInference flattens lists into indexed attributes (`llm.input_messages.0.message.role`);
# they are rebuilt here into the GenAI conventions' message shape, {"role", "parts": [...]}, so
# that an event reads the same whichever convention its span used. The span's attributes are
# all kept, as sent, in the event's `otel` part: export gives the span back unchanged.

def _indexed(attrs: dict, prefix: str) -> list[dict]:
    """The items of a flattened list (`prefix.N.rest` keys): one {rest: value} dict per index, in
    index order."""
    items: dict[int, dict] = {}
    head = prefix + "."
    for key, value in attrs.items():
        if key.startswith(head):
            index, _, rest = key[len(head):].partition(".")
            if index.isdigit() and rest:
                items.setdefault(int(index), {})[rest] = value
    return [items[i] for i in sorted(items)]


def _oi_value(attrs: dict, which: str) -> Any:
    """`input.value` / `output.value`: decoded when its mime type says JSON (or, with no mime
    type, when it reads as JSON), else the text."""
    value = attrs.get(which + ".value")
    mime = attrs.get(which + ".mime_type")
    if isinstance(value, str) and (mime == "application/json" or mime is None):
        return _parsed(value)
    return value


def _oi_tool_call(flat: dict) -> dict:
    part: dict[str, Any] = {"type": "tool_call"}
    if flat.get("tool_call.id") is not None:
        part["id"] = flat["tool_call.id"]
    part["name"] = flat.get("tool_call.function.name")
    part["arguments"] = _parsed(flat.get("tool_call.function.arguments"))
    return part


def _oi_content(flat: dict) -> dict:
    kind = flat.get("message_content.type")
    if kind in ("text", "reasoning", None):
        return {"type": kind or "text", "content": flat.get("message_content.text")}
    if kind in ("image", "audio", "video"):
        part = {"type": "uri", "modality": kind, "uri": flat.get(f"message_content.{kind}.{kind}.url")}
        mime = flat.get(f"message_content.{kind}.{kind}.mime_type")
        if mime is not None:
            part["mime_type"] = mime
        return part
    prefix = "message_content."
    return {"type": kind, **{k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix) and k != prefix + "type"}}


def _oi_message(flat: dict) -> dict:
    """One `llm.*_messages.N.message.*` group as {"role", "parts"} (and `name`)."""
    msg: dict[str, Any] = {"role": flat.get("message.role")}
    if flat.get("message.name") is not None:
        msg["name"] = flat["message.name"]
    parts: list[dict] = []
    content = flat.get("message.content")
    call_id = flat.get("message.tool_call_id")
    if content is not None:
        if call_id is not None:  # a tool's result handed back to the model
            parts.append({"type": "tool_call_response", "id": call_id, "response": content})
        else:
            parts.append({"type": "text", "content": content})
    parts.extend(_oi_content(c) for c in _indexed(flat, "message.contents"))
    parts.extend(_oi_tool_call(c) for c in _indexed(flat, "message.tool_calls"))
    if flat.get("message.function_call_name") is not None:
        parts.append({"type": "tool_call", "name": flat["message.function_call_name"],
                      "arguments": _parsed(flat.get("message.function_call_arguments_json"))})
    msg["parts"] = parts
    return msg


def _oi_texts(items: list[dict], key: str, role: str) -> list[dict]:
    return [{"role": role, "parts": [{"type": "text", "content": item.get(key)}]} for item in items]


def _oi_llm(span: Span) -> tuple[dict, Any, dict]:
    """An OpenInference LLM span's request, provider and response, in the GenAI shape."""
    attrs = span.attributes
    params = _parsed(attrs.get("llm.invocation_parameters"))
    params = params if isinstance(params, dict) else {}
    model = attrs.get("llm.request.model_name") or attrs.get("llm.model_name") or params.get("model")
    request: dict[str, Any] = {"model": model}
    inputs, prompts = _indexed(attrs, "llm.input_messages"), _indexed(attrs, "llm.prompts")
    if inputs:
        request["messages"] = [_oi_message(m) for m in inputs]
    elif prompts:  # the completions API
        request["messages"] = _oi_texts(prompts, "prompt.text", "user")
    for field, _, names in REQUEST_PARAMS:
        for name in names:
            if params.get(name) is not None:
                value = params[name]
                request[field] = [value] if field == "stop_sequences" and isinstance(value, str) else value
                break
    response: dict[str, Any] = {"model": attrs.get("llm.response.model_name") or attrs.get("llm.model_name") or model}
    finish = attrs.get("llm.finish_reason")
    outputs, choices = _indexed(attrs, "llm.output_messages"), _indexed(attrs, "llm.choices")
    if outputs:
        response["messages"] = [_oi_message(m) for m in outputs]
    elif choices:
        response["messages"] = _oi_texts(choices, "completion.text", "assistant")
    if finish is not None:
        for m in response.get("messages", ()):
            m["finish_reason"] = finish
        response["finish_reasons"] = [finish]
    usage = _usage(attrs, OPENINFERENCE)
    if usage:
        response["usage"] = usage
    return request, attrs.get("llm.provider", attrs.get("llm.system")), response


def _oi_tool(span: Span) -> tuple[Any, Any, Any, Any]:
    """An OpenInference TOOL span's name, arguments (`input.value`), call id and result
    (`output.value`)."""
    attrs = span.attributes
    return (attrs.get("tool.name") or span.name, _oi_value(attrs, "input"),
            attrs.get("tool_call.id", attrs.get("tool.id")), _oi_value(attrs, "output"))


def _oi_fields(kind: str, attrs: dict) -> dict:
    """What the other OpenInference kinds' events lift: retrieved documents, embedded texts."""
    if kind in ("RETRIEVER", "RERANKER"):
        prefix = "retrieval.documents" if kind == "RETRIEVER" else "reranker.output_documents"
        docs = [{k[len("document."):]: _parsed(v) if k == "document.metadata" else v
                 for k, v in d.items() if k.startswith("document.")} for d in _indexed(attrs, prefix)]
        out: dict[str, Any] = {"query": attrs.get("reranker.query", _oi_value(attrs, "input"))}
        if docs:
            out["documents"] = docs
        return out
    if kind == "EMBEDDING":
        texts = [e.get("embedding.text") for e in _indexed(attrs, "embedding.embeddings")]
        return {"model": attrs.get("embedding.model_name"), "texts": texts}
    return {}


# -- one shape for both -----------------------------------------------------------------------

def _parent(span: Span) -> dict:
    # The request event of a call is written before the span's `otel` object (on its response):
    # it names the parent itself, so the span tree holds every event (tracedb.records.spans).
    return {"parent_span_id": span.parent_span_id} if span.parent_span_id is not None else {}


def _llm_events(span: Span, request: dict, provider: Any, response: dict, rest: dict) -> list[tuple[str, dict]]:
    # No prompt_hash: event-log replay computes it from `request` when it needs it.
    requested = {"request": request, "span_id": span.span_id, **_parent(span)}
    if provider is not None:
        requested["provider"] = provider
    responded: dict[str, Any] = {"request_seq": None}
    error = _error_of(span)
    if error is not None:
        responded["error"] = error
    else:
        responded["response"] = response
    responded["span_id"] = span.span_id
    responded["otel"] = _otel_part(span, rest)
    return [(LLM_REQUESTED, requested), (LLM_RESPONDED, responded)]


def _tool_events(span: Span, name: Any, arguments: Any, call_id: Any, result: Any,
                 rest: dict) -> list[tuple[str, dict]]:
    requested = {"name": name, "arguments": arguments, "span_id": span.span_id, **_parent(span)}
    if call_id is not None:
        requested["call_id"] = call_id
    responded: dict[str, Any] = {"name": name, "request_seq": None}
    error = _error_of(span)
    if error is not None:
        responded["error"] = error
    else:
        responded["response"] = result
    responded["span_id"] = span.span_id
    responded["otel"] = _otel_part(span, rest)
    return [(TOOL_REQUESTED, requested), (TOOL_RESPONDED, responded)]


def span_events(span: Span) -> list[tuple[str, dict]]:
    """The events one span becomes. A second event's `request_seq` is filled in by the caller
    (`link_request_seq`) once the first event has its seq."""
    attrs = span.attributes
    op = operation_of(span)
    if op in LLM_OPERATIONS:
        return _llm_events(span, *_genai_llm(span), _rest(attrs))
    if op == TOOL_OPERATION:
        return _tool_events(span, *_genai_tool(span), _rest(attrs))
    if op is not None:
        return [(f"otel.{_safe_type_part(op)}", {"span_id": span.span_id, "otel": _otel_part(span, dict(attrs))})]
    kind = openinference_kind(span)
    if kind == "LLM":
        return _llm_events(span, *_oi_llm(span), dict(attrs))
    if kind == "TOOL":
        return _tool_events(span, *_oi_tool(span), dict(attrs))
    if kind is not None:
        type_ = OI_EVENT_TYPES.get(kind) or f"otel.{_safe_type_part(kind.lower())}"
        return [(type_, {"span_id": span.span_id, **_oi_fields(kind, attrs), "otel": _otel_part(span, dict(attrs))})]
    return [(SPAN_EVENT, {"span_id": span.span_id, "otel": _otel_part(span, dict(attrs))})]


def check_storable(events: list[tuple[str, dict]], final: Optional[dict]) -> None:
    """Encode everything a span stages (InvalidInputError if any of it cannot be stored) before
    any of it is staged: a span is recorded whole or not at all, and a trace whose spans are all
    refused is never started."""
    for type_, payload in events:
        payload_json(payload, type_)
    if final is not None:
        check_response(final)


def link_request_seq(events: list[tuple[str, dict]], first_seq: int) -> None:
    """Tell a span's response event the seq its request event got."""
    if len(events) == 2:
        events[1][1]["request_seq"] = first_seq


def intent_of(root: Optional[Span], any_span: Span) -> str:
    """The intent of a trace's execution, fixed when the trace's first spans arrive.

    The resource's `service.name` (OTEL_SERVICE_NAME), so that every trace of one agent gets the
    same intent whichever of its spans an export happens to carry first: the SDK exports on a
    timer, and a root that ends after the timer fired arrives in a later request. Without a
    service name (the SDK's `unknown_service` default): the root span's agent name
    (`gen_ai.agent.name`, or OpenInference's `agent.name`), else
    its name, when the root is among those first spans; else "otel". The root's name and agent
    name are in the final response either way."""
    service = any_span.resource.get("service.name")
    if isinstance(service, str) and service and not service.startswith("unknown_service"):
        return service[:200]
    if root is not None:
        agent = _agent_of(root)
        if isinstance(agent, str) and agent:
            return agent[:200]
        if root.name:
            return root.name[:200]
    return DEFAULT_INTENT


def _agent_of(span: Span) -> Any:
    return span.attributes.get("gen_ai.agent.name", span.attributes.get("agent.name"))


def envelope_of(span: Span, intent: str) -> dict:
    """The start envelope of a trace's execution."""
    env = {"intent": intent, "source": "otlp", "trace_id": span.trace_id}
    if span.resource:
        env["resource"] = span.resource
    return env


def response_of(root: Span) -> dict:
    """The final response a trace's root span gives its execution."""
    attrs = root.attributes
    payload: dict[str, Any] = {"span": root.name, "trace_id": root.trace_id}
    agent = _agent_of(root)
    if agent is not None:
        payload["agent"] = agent
    for key in (OUTPUT_MESSAGES, TOOL_RESULT):
        if key in attrs:
            payload["output"] = _parsed(attrs[key])
            break
    else:
        if "output.value" in attrs:  # OpenInference
            payload["output"] = _oi_value(attrs, "output")
    error = _error_of(root)
    if error is not None:
        return {"status": "error", "payload": payload, "error": error}
    return {"status": "success", "payload": payload}



def model_output(events: list[tuple[str, dict]]) -> Any:
    """The output messages of a span's model call (its `llm.responded`), or None."""
    for type_, payload in events:
        if type_ == LLM_RESPONDED:
            messages = (payload.get("response") or {}).get("messages")
            if messages:
                return messages
    return None


def with_answer(final: dict, last_output: Any) -> dict:
    """A root span's final response with the agent's answer: the root's own output, else the
    output messages of the trace's last model call (`output_from`: "last_model_response"), so
    that replay gives back what the agent answered, not only the root span's name."""
    payload = final.get("payload")
    if last_output is None or not isinstance(payload, dict) or "output" in payload:
        return final
    return {**final, "payload": {**payload, "output": last_output, "output_from": "last_model_response"}}


def by_trace(spans: Iterable[Span]) -> dict[str, list[Span]]:
    """Spans grouped by trace, in arrival order; in each trace the spans in the order they ended,
    the root last (its end closes the execution)."""
    groups: dict[str, list[Span]] = {}
    for s in spans:
        groups.setdefault(s.trace_id, []).append(s)
    for group in groups.values():
        if len(group) > 1:
            group.sort(key=lambda s: (s.is_root, s.end_ns))
    return groups


def recorded_span_ids(record) -> set[str]:
    """The span ids an execution's events hold (what a trace recorded before)."""
    out = set()
    for e in record.events:
        p = e.payload
        if isinstance(p, dict):
            sid = p.get("span_id")
            if isinstance(sid, str):
                out.add(sid)
    return out
