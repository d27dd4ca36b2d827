"""`TraceDBSpanExporter`: the OpenTelemetry SDK records straight into tracedb, in-process.

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from tracedb.otel.exporter import TraceDBSpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(TraceDBSpanExporter()))

It records through `tracedb.client.connect()` (a running `tracedb serve`, found the way the
client finds it, or else the embedded store), or through the recorder it is given: a
`tracedb.open(...)` Store or a `tracedb.client` Client. The mapping is the receiver's
(`tracedb.otel.mapping`, docs/otel.md); each event is durable before `export` returns.

`export` runs where the span processor calls it: BatchSpanProcessor's worker thread, or, with
SimpleSpanProcessor, the thread that ended the span. A sync Store refuses calls from inside a
running event loop, so an asyncio application uses BatchSpanProcessor.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Optional, Sequence

from tracedb.client import connect
from tracedb.errors import ExecutionClosedError, ExecutionExistsError, ExtraNotInstalledError, InvalidInputError, TraceDBError
from tracedb.records.record import STATUS_COMPLETED, STATUS_RUNNING
from tracedb.otel import mapping as M
from tracedb.otel.ingest import KEEP_CLOSED_TRACES, TraceEntry

try:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
except ModuleNotFoundError as e:
    raise ExtraNotInstalledError(__name__, "otel", e.name) from None

log = logging.getLogger("tracedb.otel")


class TraceDBSpanExporter(SpanExporter):
    """A SpanExporter that records each trace as a tracedb execution (see the module doc)."""

    def __init__(self, recorder=None, *, sidecar: Optional[str] = None, data_dir: Optional[str] = None,
                 keep_closed: int = KEEP_CLOSED_TRACES):
        self._owned = recorder is None
        if recorder is None:
            recorder = connect(sidecar, data_dir=data_dir)
        self.recorder = recorder
        self.traces: "OrderedDict[str, TraceEntry]" = OrderedDict()
        self.keep_closed = keep_closed
        self.rejected: list[str] = []  # the last export's refused spans, with why
        self._lock = threading.Lock()
        self._shut = False

    def export(self, spans: Sequence) -> SpanExportResult:
        """Record the spans; SUCCESS once every one is durable (or known already, or refused for
        a closed trace), FAILURE if the recorder failed."""
        if self._shut:
            return SpanExportResult.FAILURE
        ok = True
        with self._lock:
            self.rejected = []
            for tid, group in M.by_trace(M.spans_from_sdk(spans)).items():
                try:
                    self._record_trace(tid, group)
                except TraceDBError as e:
                    log.warning("tracedb: spans of trace %s not recorded: %s", tid, e)
                    self.traces.pop(tid, None)  # looked up again next time
                    ok = False
            self._trim()
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def _entry(self, tid: str, group: list) -> TraceEntry:
        entry = self.traces.get(tid)
        if entry is not None:
            return entry
        entry = TraceEntry(M.execution_id_of(tid))
        root = next((s for s in group if s.is_root), None)
        intent = M.intent_of(root, group[0])
        try:
            ex = self.recorder.start(intent, M.envelope_of(group[0], intent), entry.execution_id)
            # A sidecar takes a start it already holds (same intent and envelope) as a resend, and
            # tells how far the execution got: then its spans are looked up like a known one's.
            known = (getattr(ex, "last_seq", 0) or 0) > 0
            entry.status = STATUS_RUNNING
        except ExecutionExistsError:
            known = True
        if known:
            record = self.recorder.get(entry.execution_id)
            entry.spans = M.recorded_span_ids(record)
            entry.status = record.status
        self.traces[tid] = entry
        return entry

    def _record_trace(self, tid: str, group: list) -> None:
        entry = self._entry(tid, group)
        rec = self.recorder
        eid = entry.execution_id
        for span in group:
            if span.span_id in entry.spans:
                continue
            if entry.status != STATUS_RUNNING:
                self.rejected.append(f"span {span.span_id}: execution {eid} is {entry.status}")
                continue
            events = M.span_events(span)
            final = M.response_of(span) if span.is_root else None
            try:
                M.check_storable(events, final)
                first = rec.event(eid, *events[0])
                M.link_request_seq(events, first)
                for type_, payload in events[1:]:
                    rec.event(eid, type_, payload)
                entry.spans.add(span.span_id)
                output = M.model_output(events)
                if output is not None:
                    entry.last_output = output
                if final is not None:
                    rec.finish(eid, M.with_answer(final, entry.last_output))
                    entry.status = STATUS_COMPLETED
            except ExecutionClosedError as e:
                entry.status = e.status
                self.rejected.append(f"span {span.span_id}: execution {eid} is {e.status}")
            except InvalidInputError as e:
                entry.spans.add(span.span_id)
                self.rejected.append(f"span {span.span_id}: {e}")

    def _trim(self) -> None:
        if len(self.traces) <= 2 * self.keep_closed:
            return
        drop = len(self.traces) - self.keep_closed
        for tid in list(self.traces):
            if drop <= 0:
                break
            if self.traces[tid].status != STATUS_RUNNING:
                del self.traces[tid]
                drop -= 1

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered: every export is durable when it returns."""
        return True

    def shutdown(self) -> None:
        """Close the recorder if this exporter opened it (traces still open stay running; the
        recorder marks them incomplete when it closes)."""
        with self._lock:
            if self._shut:
                return
            self._shut = True
            if self._owned:
                self.recorder.close()
