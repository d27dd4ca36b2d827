"""OTLP/HTTP ingest into `tracedb serve`, next to the same spans through the native protocol.

Realistic GenAI traces of 8 spans (an `invoke_agent` root, three `chat` spans with input and
output messages and usage, three `execute_tool` spans with arguments and results, one plain
span), 64 traces to a request of 512 spans. 16 exporters each send one request at a time, as
the SDK's BatchSpanProcessor does (batch 512), and wait for its 200: the request's spans are
durable then. The native run sends the very events the mapping makes of those spans (start,
events, finish, with the same payloads) over 16 sidecar connections, 512 spans' worth at a time,
pipelined, and waits for every acknowledgment. Both count spans/s and the p99 of one batch.

Every request carries new traces (the trace ids' last 8 bytes are a per-request tag, swapped in
the prebuilt body), so that each span is stored, not deduplicated.

    python -c "from benchmarks import otel as b; print(*b.report_lines(b.run('/tmp')), sep='\\n')"
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time

import orjson

from .common import pct
from .sidecar import free_port, start_server, stop_server

SPANS_PER_TRACE = 8
_MESSAGES_IN = [
    {"role": "system", "parts": [{"type": "text", "content": "You are a support agent. Answer briefly and cite the order."}]},
    {"role": "user", "parts": [{"type": "text", "content": "Where is my order 81723? It was due on Monday."}]},
    {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "lookup_order", "arguments": {"order": 81723}}]},
    {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": {"status": "in transit", "eta": "Thursday"}}]},
]
_MESSAGES_OUT = [{"role": "assistant", "finish_reason": "stop", "parts": [
    {"type": "text", "content": "Your order 81723 is in transit and should arrive on Thursday."}]}]


def _kv(key: str, value):
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    if isinstance(value, bool):
        v = AnyValue(bool_value=value)
    elif isinstance(value, int):
        v = AnyValue(int_value=value)
    elif isinstance(value, float):
        v = AnyValue(double_value=value)
    else:
        v = AnyValue(string_value=value)
    return KeyValue(key=key, value=v)


def _trace_spans(trace_id: bytes, t0: int, k: int) -> list:
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    def span_id(i: int) -> bytes:
        return (k * 16 + i + 1).to_bytes(4, "big") + b"\x5a\x5a\x5a\x5a"

    root = span_id(0)
    spans = []
    t = t0
    for i in range(3):
        chat = Span(trace_id=trace_id, span_id=span_id(1 + 2 * i), parent_span_id=root, name="chat gpt-4o-mini",
                    kind=Span.SPAN_KIND_CLIENT, start_time_unix_nano=t, end_time_unix_nano=t + 900_000_000)
        chat.attributes.extend([
            _kv("gen_ai.operation.name", "chat"), _kv("gen_ai.provider.name", "openai"),
            _kv("gen_ai.request.model", "gpt-4o-mini"), _kv("gen_ai.request.temperature", 0.2),
            _kv("gen_ai.response.model", "gpt-4o-mini-2024-07-18"), _kv("gen_ai.response.id", f"chatcmpl-{k}-{i}"),
            _kv("gen_ai.usage.input_tokens", 211 + i), _kv("gen_ai.usage.output_tokens", 38),
            _kv("gen_ai.input.messages", orjson.dumps(_MESSAGES_IN[: 2 + i]).decode()),
            _kv("gen_ai.output.messages", orjson.dumps(_MESSAGES_OUT).decode()),
        ])
        t += 1_000_000_000
        tool = Span(trace_id=trace_id, span_id=span_id(2 + 2 * i), parent_span_id=root, name="execute_tool lookup_order",
                    kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=t, end_time_unix_nano=t + 40_000_000)
        tool.attributes.extend([
            _kv("gen_ai.operation.name", "execute_tool"), _kv("gen_ai.tool.name", "lookup_order"),
            _kv("gen_ai.tool.call.id", f"call_{i}"), _kv("gen_ai.tool.call.arguments", '{"order": 81723}'),
            _kv("gen_ai.tool.call.result", '{"status": "in transit", "eta": "Thursday", "carrier": "DHL", "tracking": "JD014600003828"}'),
        ])
        t += 50_000_000
        spans += [chat, tool]
    plain = Span(trace_id=trace_id, span_id=span_id(7), parent_span_id=root, name="render answer",
                 start_time_unix_nano=t, end_time_unix_nano=t + 2_000_000)
    plain.attributes.extend([_kv("template", "support.reply"), _kv("chars", 61)])
    agent = Span(trace_id=trace_id, span_id=root, name="invoke_agent SupportBot", kind=Span.SPAN_KIND_INTERNAL,
                 start_time_unix_nano=t0 - 1000, end_time_unix_nano=t + 3_000_000)
    agent.attributes.extend([_kv("gen_ai.operation.name", "invoke_agent"), _kv("gen_ai.agent.name", "SupportBot")])
    return spans + [plain, agent]


TAG = b"\xa1\xb2\xc3\xd4\xe5\xf6\x07\x18"  # the last 8 bytes of every trace id of a template


def template(exporter: int, batch: int) -> tuple[bytes, list]:
    """One exporter's request body (protobuf) and the same spans as mapping.Spans."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

    from tracedb.otel import mapping as M

    req = ExportTraceServiceRequest()
    rs = ResourceSpans()
    rs.resource.attributes.extend([_kv("service.name", "support-agent"), _kv("service.instance.id", f"bench-{exporter}")])
    ss = ScopeSpans()
    ss.scope.name = "support-agent"
    t0 = time.time_ns()
    for k in range(batch // SPANS_PER_TRACE):
        tid = (exporter * 1_000_000 + k + 1).to_bytes(8, "big") + TAG
        ss.spans.extend(_trace_spans(tid, t0, k))
    rs.scope_spans.append(ss)
    req.resource_spans.append(rs)
    spans, _rejected = M.spans_from_proto(req)
    return req.SerializeToString(), spans


def request_tag(n: int) -> bytes:
    """The trace ids' last 8 bytes for the n-th request (TAG in the prebuilt bodies)."""
    return b"\x7e" + n.to_bytes(7, "big")


def native_frames(spans: list) -> bytes:
    """The native requests for `spans`: per trace a start, the mapped events (with seqs), the
    finish; the trace ids' tag hex (TAG.hex()) is swapped per batch as in the OTLP body."""
    from tracedb.otel import mapping as M

    out = []
    rid = 0
    for tid, group in M.by_trace(spans).items():
        eid = M.execution_id_of(tid)
        root = next(s for s in group if s.is_root)
        intent = M.intent_of(root, group[0])
        rid += 1
        out.append(orjson.dumps({"id": rid, "op": "start", "intent": intent, "execution_id": eid,
                                 "envelope": M.envelope_of(group[0], intent)}))
        seq = 0
        for span in group:
            events = M.span_events(span)
            M.link_request_seq(events, seq + 1)
            for type_, payload in events:
                seq += 1
                rid += 1
                out.append(orjson.dumps({"id": rid, "op": "event", "execution_id": eid, "seq": seq,
                                         "type": type_, "payload": payload}))
        seq += 1
        rid += 1
        out.append(orjson.dumps({"id": rid, "op": "finish", "execution_id": eid, "seq": seq,
                                 "response": M.response_of(root)}))
    return b"\n".join(out) + b"\n"


class _Window:
    """What the clients of one run measure: each request tagged with the next tag, its latency
    and spans counted when it ends within the `seconds` after `warmup`, the errors."""

    def __init__(self, seconds: float, warmup: float):
        self.seconds = seconds
        start = time.perf_counter()
        self.measure_from, self.stop_at = start + warmup, start + warmup + seconds
        self.lat: list[float] = []
        self.spans = 0
        self.errors = 0
        self.counter = 0

    def open(self) -> bool:
        return time.perf_counter() < self.stop_at

    def next_tag(self) -> bytes:
        self.counter += 1
        return request_tag(self.counter)

    def answered(self, t0: float, spans: int) -> None:
        t1 = time.perf_counter()
        if self.measure_from <= t1 <= self.stop_at:
            self.lat.append(t1 - t0)
            self.spans += spans

    def result(self) -> dict:
        lat = sorted(self.lat)
        return {"spans_per_s": self.spans / self.seconds, "p50_ms": pct(lat, 0.5) * 1e3,
                "p99_ms": pct(lat, 0.99) * 1e3, "requests": len(lat), "errors": self.errors}


async def _drive_otlp(port: int, bodies: list[bytes], seconds: float, warmup: float, token: str) -> dict:
    import httpx

    url = f"http://127.0.0.1:{port}/v1/traces"
    headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {token}"}
    w = _Window(seconds, warmup)
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))

    async def exporter(http, body: bytes, per: int) -> None:
        while w.open():
            payload = body.replace(TAG, w.next_tag())
            t0 = time.perf_counter()
            r = await http.post(url, content=payload, headers=headers)
            if r.status_code != 200:
                w.errors += 1
                continue
            w.answered(t0, per)

    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        await asyncio.gather(*(exporter(http, b, n) for b, n in bodies))
    return w.result()


async def _drive_native(sock: str, batches: list[tuple[bytes, int]], seconds: float, warmup: float) -> dict:
    w = _Window(seconds, warmup)
    hexed = TAG.hex().encode()

    async def client(frames: bytes, per: int) -> None:
        reader, writer = await asyncio.open_unix_connection(sock, limit=1 << 24)
        n = frames.count(b"\n")
        try:
            while w.open():
                data = frames.replace(hexed, w.next_tag().hex().encode())
                t0 = time.perf_counter()
                writer.write(data)
                got = 0
                while got < n:
                    line = await reader.readline()
                    got += 1
                    if b'"ok":false' in line:
                        w.errors += 1
                w.answered(t0, per)
        finally:
            writer.close()

    await asyncio.gather(*(client(f, n) for f, n in batches))
    return w.result()


def run(workdir: str, seconds: float = 3.0, warmup: float = 1.0, exporters: int = 16, batch: int = 512) -> dict:
    """Both runs, each against a fresh `tracedb serve`; the figures and their ratio."""
    made = [template(i, batch) for i in range(exporters)]
    out: dict = {"exporters": exporters, "batch": batch, "span_bytes": sum(len(b) for b, _ in made) // (exporters * batch)}
    d = tempfile.mkdtemp(dir=workdir)
    try:
        port = free_port()
        proc, _sock = start_server(os.path.join(d, "otlp"), extra_args=["--otlp-port", str(port)])
        try:
            _wait_port(port)
            with open(os.path.join(d, "otlp", "token")) as f:  # made by the recorder for its OTLP port
                token = f.read().strip()
            out["otlp"] = asyncio.run(_drive_otlp(port, [(b, len(s)) for b, s in made], seconds, warmup, token))
        finally:
            stop_server(proc)
        proc, sock = start_server(os.path.join(d, "native"))
        try:
            frames = [(native_frames(s), len(s)) for _b, s in made]
            out["native"] = asyncio.run(_drive_native(sock, frames, seconds, warmup))
        finally:
            stop_server(proc)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    out["ratio"] = out["otlp"]["spans_per_s"] / out["native"]["spans_per_s"] if out["native"]["spans_per_s"] else 0.0
    return out


def _wait_port(port: int, timeout_s: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)  # polling for the port with a deadline


def report_lines(r: dict) -> list[str]:
    o, n = r["otlp"], r["native"]
    return [
        f"OTLP/HTTP, {r['exporters']} exporters x batch {r['batch']} (~{r['span_bytes']} B/span protobuf): "
        f"{o['spans_per_s']:,.0f} spans/s, p99 {o['p99_ms']:.1f} ms per request ({o['errors']} errors)",
        f"native protocol, the same spans' events, {r['exporters']} connections x {r['batch']} spans: "
        f"{n['spans_per_s']:,.0f} spans/s, p99 {n['p99_ms']:.1f} ms per batch ({n['errors']} errors)",
        f"OTLP / native: {r['ratio']:.2f}x",
    ]
