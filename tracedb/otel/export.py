"""Executions as OTLP/JSON (`tracedb export ID --format otlp-json`), readable by any OTLP tool.

One execution is one `ExportTraceServiceRequest` document (hex ids, integer enums, 64-bit
integers as strings, as the OTLP/JSON encoding asks); several are JSON lines, one document a line,
which is what the OpenTelemetry file exporter writes and the Collector's `otlpjsonfile` receiver
reads.

An execution recorded from OpenTelemetry gives its spans back: ids, parents, names, kinds, times,
status, attributes (the messages and tool arguments the events hold are written back as the
`gen_ai.*` attributes they came from; an OpenInference span's were kept as sent), span events,
links, scope. Any other execution becomes one
trace whose id is derived from the execution id: a root span named after the intent, from its
creation to its last event, and one span event per recorded event (its type, seq and payload).
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Optional

import orjson

from tracedb.records.record import ExecutionRecord
from tracedb.otel import mapping as M

_SCOPE = {"name": "tracedb", "version": ""}


def _value(v: Any) -> dict:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    if isinstance(v, dict):
        return {"kvlistValue": {"values": _attrs(v)}}
    return {}


def _attrs(d: dict) -> list:
    return [{"key": str(k), "value": _value(v)} for k, v in d.items()]


def _enum(names: tuple, v: Any, default: int) -> int:
    if isinstance(v, int):
        return v
    try:
        return names.index(v)
    except ValueError:
        return default


def _json_text(v: Any) -> str:
    return orjson.dumps(v).decode()


def _span(trace_id: str, span_id: str, otel: dict, attrs: dict) -> dict:
    span = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": otel.get("name", ""),
        "kind": _enum(M.KINDS, otel.get("kind"), 1),
        "startTimeUnixNano": str(int(otel.get("start_ns") or 0)),
        "endTimeUnixNano": str(int(otel.get("end_ns") or 0)),
        "attributes": _attrs(attrs),
        "status": {"code": _enum(M.STATUS_CODES, otel.get("status"), 0)},
    }
    if otel.get("status_message"):
        span["status"]["message"] = otel["status_message"]
    if otel.get("parent_span_id"):
        span["parentSpanId"] = otel["parent_span_id"]
        if otel.get("parent_remote"):
            span["flags"] = 0x300
    if otel.get("trace_state"):
        span["traceState"] = otel["trace_state"]
    if otel.get("events"):
        span["events"] = [
            {"timeUnixNano": str(int(e.get("time_ns") or 0)), "name": e.get("name", ""),
             "attributes": _attrs(e.get("attributes") or {})}
            for e in otel["events"]
        ]
    if otel.get("links"):
        span["links"] = [
            {"traceId": lk.get("trace_id", ""), "spanId": lk.get("span_id", ""),
             "attributes": _attrs(lk.get("attributes") or {})}
            for lk in otel["links"]
        ]
    return span


def _lifted(requested: Optional[dict], responded: dict, kind: str) -> dict:
    """The gen_ai.* attributes the events lifted out of a span, written back."""
    out: dict[str, Any] = {}
    if kind == "llm":
        req = (requested or {}).get("request") or {}
        if "messages" in req:
            out[M.INPUT_MESSAGES] = _json_text(req["messages"])
        if "system" in req:
            out[M.SYSTEM_INSTRUCTIONS] = _json_text(req["system"])
        resp = responded.get("response") or {}
        if "messages" in resp:
            out[M.OUTPUT_MESSAGES] = _json_text(resp["messages"])
    else:
        if requested is not None and requested.get("arguments") is not None:
            out[M.TOOL_ARGUMENTS] = _json_text(requested["arguments"])
        if responded.get("response") is not None:
            out[M.TOOL_RESULT] = _json_text(responded["response"])
    return out


def _otel_spans(record: ExecutionRecord, trace_id: str) -> list[tuple[dict, dict]]:
    requests: dict[str, dict] = {}
    spans = []
    for e in record.events:
        p = e.payload
        if not isinstance(p, dict) or not isinstance(p.get("span_id"), str):
            continue
        otel = p.get("otel")
        if not isinstance(otel, dict):
            requests[p["span_id"]] = p  # a request event: its response event follows
            continue
        attrs = dict(otel.get("attributes") or {})
        requested = requests.pop(p["span_id"], None)
        # An OpenInference span's attributes were all kept as sent: nothing to write back.
        if e.type in ("llm.responded", "tool.responded") and M.OI_SPAN_KIND not in attrs:
            attrs.update(_lifted(requested, p, e.type.split(".")[0]))
        spans.append((otel.get("scope") or _SCOPE, _span(trace_id, p["span_id"], otel, attrs)))
    return spans


def _iso_ns(iso: str) -> int:
    try:
        return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1e9)
    except (ValueError, AttributeError):
        return 0


def _native_spans(record: ExecutionRecord, trace_id: str, times: Optional[dict]) -> list[tuple[dict, dict]]:
    start = _iso_ns(record.header.createdUtcIso)
    times = times or {}
    end = max([start, *times.values()])
    events = [
        {"timeUnixNano": str(times.get(e.seq, start)), "name": e.type,
         "attributes": _attrs({"tracedb.seq": e.seq, "tracedb.payload": _json_text(e.payload)})}
        for e in record.events
    ]
    status = {"completed": 1, "incomplete": 2, "invalidated": 2}.get(record.status, 0)
    span = {
        "traceId": trace_id,
        "spanId": hashlib.sha256(record.execution_id.encode()).hexdigest()[32:48],
        "name": record.intent or "execution",
        "kind": 1,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": _attrs({
            "tracedb.execution_id": record.execution_id,
            "tracedb.status": record.status,
            "tracedb.envelope_hash": record.header.envelopeHash,
        }),
        "events": events,
        "status": {"code": status},
    }
    if status == 2:
        span["status"]["message"] = record.header.replayableReason or record.status
    return [(_SCOPE, span)]


def _by_scope(spans: list) -> list[dict]:
    groups: dict[tuple, dict] = {}
    for scope, span in spans:
        key = (scope.get("name", ""), scope.get("version", ""))
        if key not in groups:
            groups[key] = {"scope": {"name": key[0], "version": key[1]}, "spans": []}
        groups[key]["spans"].append(span)
    return list(groups.values())


def to_otlp_json(record: ExecutionRecord, times: Optional[dict] = None) -> dict:
    """One execution as an OTLP/JSON ExportTraceServiceRequest. `times` ({seq: ns}) dates the
    span events of an execution not recorded from OpenTelemetry."""
    trace_id = M.trace_id_of(record.execution_id)
    resource: dict = {}
    if trace_id is not None:
        spans = _otel_spans(record, trace_id)
        resource = (record.envelope or {}).get("resource") or {}
    else:
        trace_id = hashlib.sha256(record.execution_id.encode()).hexdigest()[:32]
        spans = _native_spans(record, trace_id, times)
    if "service.name" not in resource:
        resource = {"service.name": record.intent or "tracedb", **resource}
    return {
        "resourceSpans": [{
            "resource": {"attributes": _attrs(resource)},
            "scopeSpans": _by_scope(spans),
        }]
    }
