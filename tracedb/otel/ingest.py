"""Record OpenTelemetry spans into a store through the staged group commit.

`SpanIngest.record(spans)`, called on the event loop that owns the store's group commit, maps the
spans to events and looks up new traces in a worker thread, then, back on the loop and in the
order requests arrived, stages every new span's events into one `StagedBatch` (the path the
sidecar's native requests take: `Staging.stage_*`, then `Staging.append_staged`). It returns once
that batch is durable: one WAL call and one fdatasync for a whole request, shared with whatever
else the recorder is writing.

Dedup. A span is stored once, keyed by (trace id, span id). The ingest keeps, per trace, the
span ids it has staged and whether the trace is still open; a span seen again (an exporter's
retry) is answered as accepted once what recorded it is durable, and writes nothing. A trace it
does not hold (the recorder restarted, or the trace was closed long ago and forgotten) is looked
up in the store: its execution's events carry their span ids. After a restart, recovery has
marked every unfinished trace incomplete: spans it stored are acknowledged again, new ones are
rejected (partial success), as are spans of a trace whose root already ended.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

import sqlalchemy as sa

from tracedb.projection.db import open_store_engine
from tracedb.errors import ExecutionClosedError, ExecutionExistsError, InvalidInputError
from tracedb.projection.models import traces
from tracedb.records.record import STATUS_COMPLETED, STATUS_RUNNING
from tracedb.recorder.state import StagedBatch, StageMiss
from tracedb.otel import mapping as M

# Closed traces whose span ids stay in memory; older ones are looked up in the store again.
KEEP_CLOSED_TRACES = 4096
# Messages kept for a partial-success answer (the count covers every rejected span).
MAX_MESSAGES = 5


@dataclass
class IngestResult:
    """What became of one request's spans."""

    accepted: int = 0  # recorded now
    duplicates: int = 0  # recorded before (a retry): acknowledged, not written again
    rejected: list[str] = field(default_factory=list)  # one message per span refused

    @property
    def rejected_count(self) -> int:
        return len(self.rejected)

    def message(self) -> str:
        """The partial-success message: the first few reasons and how many there were."""
        if not self.rejected:
            return ""
        head = "; ".join(self.rejected[:MAX_MESSAGES])
        more = len(self.rejected) - MAX_MESSAGES
        return head + (f"; and {more} more" if more > 0 else "")


class TraceEntry:
    """What the ingest knows of one trace."""

    __slots__ = ("execution_id", "spans", "status", "ready", "start", "refused", "last_output")

    def __init__(self, execution_id: str):
        self.execution_id = execution_id
        self.spans: set[str] = set()
        self.status: Optional[str] = None  # None until resolved
        self.ready: Optional[asyncio.Future] = None  # set while it is looked up off the loop
        self.start = None  # a reserved StagedStart waiting to be staged
        self.refused: Optional[str] = None  # why its execution cannot be started (intent, envelope)
        # The output messages of the last model call staged: the answer when the root has none.
        self.last_output = None


class SpanIngest:
    """Spans into one Store, on the event loop that owns the store's group commit."""

    def __init__(self, store, *, keep_closed: int = KEEP_CLOSED_TRACES):
        self.store = store
        self.staging = store.staging  # numbering, closing and the batch's append
        self.loop = asyncio.get_running_loop()
        self.traces: "OrderedDict[str, TraceEntry]" = OrderedDict()
        self.keep_closed = keep_closed
        self.last: Optional[asyncio.Future] = None  # the future of the last batch appended
        self.spans_accepted = 0
        self.spans_duplicate = 0
        self.spans_rejected = 0
        self._engine = None  # read-only, for the lookups of new traces (`_in_database`)
        self._tail: Optional[asyncio.Future] = None  # done once the last request to arrive has staged

    async def record(self, spans: list) -> IngestResult:
        """Record `spans` (mapping.Span); returns once everything they wrote is durable."""
        # Requests stage in the order they arrived (their mapping runs in parallel, off the loop):
        # each waits for the one before it to have staged (not for it to be durable: they share
        # group commits).
        before, turn = self._tail, self.loop.create_future()
        self._tail = turn
        try:
            return await self._record(spans, before, turn)
        finally:
            if not turn.done():
                turn.set_result(None)

    async def _record(self, spans: list, before: Optional[asyncio.Future], turn: asyncio.Future) -> IngestResult:
        result = IngestResult()
        groups = M.by_trace(spans)
        fresh: list[tuple[TraceEntry, list]] = []
        waits: list[asyncio.Future] = []
        for tid, group in groups.items():
            entry = self.traces.get(tid)
            if entry is None:
                entry = self.traces[tid] = TraceEntry(M.execution_id_of(tid))
                entry.ready = self.loop.create_future()
                fresh.append((entry, group))
            elif entry.ready is not None:
                waits.append(entry.ready)
        # Mapping spans to events and looking up new traces run off the loop: a request of
        # hundreds of spans would otherwise hold up every other client of the recorder.
        try:
            mapped = await self.loop.run_in_executor(None, self._prepare, groups, fresh)
        except BaseException:
            for entry, _group in fresh:
                self._forget(entry, group_tid=_group[0].trace_id)
            raise
        finally:
            for entry, _group in fresh:
                ready, entry.ready = entry.ready, None
                if ready is not None and not ready.done():
                    ready.set_result(None)
        for w in waits:
            await asyncio.shield(w)
        if before is not None and not before.done():
            await asyncio.shield(before)
        # From here to the append, nothing awaits: the batch is staged and appended in one go.
        batch = StagedBatch()
        for tid, group in groups.items():
            entry = self.traces.get(tid)
            if entry is None or entry.status is None:
                # Its lookup failed in another request; that request reported the error.
                result.rejected.extend(f"span {s.span_id}: the recorder could not look up its trace" for s in group)
                continue
            self._stage_trace(batch, entry, group, mapped, result)
        fut = self.staging.append_staged(batch, self.loop)
        turn.set_result(None)
        if fut is not None:
            self.last = fut
        else:
            fut = self.last if result.duplicates else None
        if fut is not None and not fut.done():
            await asyncio.shield(fut)
        elif fut is not None:
            fut.result()  # raises if that batch failed
        self.spans_accepted += result.accepted
        self.spans_duplicate += result.duplicates
        self.spans_rejected += result.rejected_count
        self._trim()
        return result

    # -- off the loop ------------------------------------------------------------------------
    def _prepare(self, groups: dict, fresh: list) -> dict:
        """Look up the new traces, and map every span: {id(span): (events, final response or
        None, why it cannot be stored or None)}."""
        if fresh:
            self._resolve(fresh)
        mapped = {}
        for group in groups.values():
            for span in group:
                events = M.span_events(span)
                final = M.response_of(span) if span.is_root else None
                try:
                    M.check_storable(events, final)
                except InvalidInputError as e:
                    mapped[id(span)] = (events, final, str(e))
                else:
                    mapped[id(span)] = (events, final, None)
        return mapped

    def _resolve(self, fresh: list) -> None:
        """Reserve a start for each new trace; look up the ones the store knows already. What
        `Staging.check_new_in_db` does for one id, for a whole request in one query: the store's
        memory holds every execution not yet compacted, the database the others."""
        store = self.store
        starts = []
        try:
            for entry, group in fresh:
                root = next((s for s in group if s.is_root), None)
                intent = M.intent_of(root, group[0])
                try:
                    starts.append((entry, self.staging.reserve_start(intent, M.envelope_of(group[0], intent), entry.execution_id)))
                except ExecutionExistsError:
                    starts.append((entry, None))  # the store holds it: an execution this ingest forgot
                except InvalidInputError as e:
                    # Its resource or service name cannot be stored (the same rules as every
                    # other way in): its spans are rejected, the rest of the request is not.
                    entry.refused = str(e)
                    entry.status = "refused"
            stored = self._in_database([e.execution_id for e, start in starts if start is not None])
        except BaseException:
            for _entry, start in starts:
                if start is not None:
                    self.staging.cancel_start(start)
            raise
        for entry, start in starts:
            if start is not None and entry.execution_id in stored:
                self.staging.cancel_start(start)
                start = None
            if start is not None:
                entry.start = start
                entry.status = STATUS_RUNNING
                continue
            record = store.get(entry.execution_id)
            entry.spans = M.recorded_span_ids(record)
            held = self.staging.next_seq(entry.execution_id) is not None
            entry.status = self.staging.status_of(entry.execution_id) if held else record.status

    def _in_database(self, execution_ids: list) -> set:
        """Which of these executions the database holds (blocking)."""
        if not execution_ids:
            return set()
        if self._engine is None:
            cfg = self.store.config
            self._engine = open_store_engine(cfg.database, busy_timeout_ms=cfg.busy_timeout_ms)
        found = set()
        with self._engine.connect() as conn:
            for i in range(0, len(execution_ids), 500):
                chunk = execution_ids[i:i + 500]
                found.update(conn.execute(
                    sa.select(traces.c.execution_id).where(traces.c.execution_id.in_(chunk))
                ).scalars())
        return found

    def close(self) -> None:
        """Release the database connections of the lookups."""
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    # -- on the loop -----------------------------------------------------------------------
    def _stage_trace(self, batch: StagedBatch, entry: TraceEntry, group: list, mapped: dict,
                     result: IngestResult) -> None:
        eid = entry.execution_id
        for span in group:
            if entry.refused is not None:
                result.rejected.append(f"span {span.span_id}: {entry.refused}")
                continue
            if span.span_id in entry.spans:
                result.duplicates += 1
                continue
            if entry.status != STATUS_RUNNING:
                result.rejected.append(self._closed_message(span, entry))
                continue
            events, final, unstorable = mapped[id(span)]
            if unstorable is not None:
                result.rejected.append(f"span {span.span_id}: {unstorable}")
                entry.spans.add(span.span_id)  # a retry would be refused alike
                continue
            if entry.start is not None:
                # Started with its first span that is stored: a request whose spans are all
                # refused leaves no execution behind.
                self.staging.stage_start(batch, entry.start)
                entry.start = None
            try:
                first = self.staging.stage_event(batch, eid, *events[0])
                M.link_request_seq(events, first)
                for type_, payload in events[1:]:
                    self.staging.stage_event(batch, eid, type_, payload)
                output = M.model_output(events)
                if output is not None:
                    entry.last_output = output
                if final is not None:
                    self.staging.stage_finish(batch, eid, M.with_answer(final, entry.last_output))
                    self._close(entry, STATUS_COMPLETED)
            except ExecutionClosedError as e:
                self._close(entry, e.status)
                result.rejected.append(self._closed_message(span, entry))
                continue
            except StageMiss:
                self._close(entry, "closed")
                result.rejected.append(self._closed_message(span, entry))
                continue
            except InvalidInputError as e:
                result.rejected.append(f"span {span.span_id}: {e}")
                entry.spans.add(span.span_id)  # a retry would be refused alike
                continue
            entry.spans.add(span.span_id)
            result.accepted += 1

    def _closed_message(self, span, entry: TraceEntry) -> str:
        return (
            f"span {span.span_id} of trace {span.trace_id}: execution {entry.execution_id} is "
            f"{entry.status}, it takes no more spans"
        )

    @staticmethod
    def _close(entry: TraceEntry, status: str) -> None:
        entry.status = status

    def _forget(self, entry: TraceEntry, group_tid: str) -> None:
        if self.traces.get(group_tid) is entry:
            del self.traces[group_tid]

    def _trim(self) -> None:
        """Past twice `keep_closed` traces, forget the oldest ones that are closed (or that the
        store no longer holds: the idle sweeper closed them) down to `keep_closed`; the store
        answers for them if their spans come again."""
        if len(self.traces) <= 2 * self.keep_closed:
            return
        drop = len(self.traces) - self.keep_closed
        next_seq = self.staging.next_seq
        for tid in list(self.traces):
            if drop <= 0:
                break
            entry = self.traces[tid]
            if entry.ready is not None or entry.start is not None:
                continue
            if entry.status != STATUS_RUNNING or next_seq(entry.execution_id) is None:
                del self.traces[tid]
                drop -= 1
