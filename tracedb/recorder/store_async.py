"""The asyncio twin of the embedded store: the same names, awaited; never blocks the event loop.

Records are numbered by the store's staging object (`tracedb.recorder.staging.Staging`, `store.staging`) and queued on the WAL's group commit under
the execution's lock; the caller awaits a future that resolves once they are durable. With
`[wal] aio` on, the event loop itself writes each group and runs its fdatasync (`wal.Wal.attach_loop`).
Database work runs in the default executor.
"""

from __future__ import annotations

import asyncio
from asyncio import get_running_loop
from typing import TYPE_CHECKING, Any, Callable, Optional

from tracedb.recorder import handles
from tracedb.records.codec import OP_INVALIDATE, OP_RECORDING_FAILURE
from tracedb.projection.compactor import CompactResult
from tracedb.config import Config, as_config
from tracedb.records.record import FINAL_RESPONSE, ExecutionRecord
from tracedb.maintenance.recovery import RecoverResult
from tracedb.maintenance.retention import PruneResult
from tracedb.recorder.staging import Staging
from tracedb.recorder.state import StagedBatch, StageMiss
from tracedb.recorder.store import Store
from tracedb.maintenance.verify import VerifyResult

if TYPE_CHECKING:
    from tracedb.reads.rows import TraceSummary


class _Queue:
    """A sink that queues each record on the WAL as it is handed over (under the execution's
    lock, so LSN order follows seq order); `durable()` waits for it."""

    __slots__ = ("staging", "loop", "future", "closing")

    def __init__(self, staging: Staging, loop: asyncio.AbstractEventLoop):
        self.staging = staging
        self.loop = loop
        self.future: Optional[asyncio.Future] = None
        self.closing = False

    def put(self, data: bytes, hint, state, closing: bool) -> None:
        if closing:
            batch = StagedBatch()
            batch.put(data, hint, state, closing)
            self.future = self.staging.append_staged(batch, self.loop)
            self.closing = True
        else:
            self.future = self.staging.append_one_future(data, self.loop, hint)

    async def durable(self) -> None:
        """Wait until what was handed over is durable. Cancelling the caller never takes the
        record back: the WAL writes it anyway."""
        await _Acked(self, None)


class _Acked:
    """The awaitable of a record queued at call time: yields until the record is durable, then
    gives `value` (the event's seq). An object rather than a coroutine: one less frame per event."""

    __slots__ = ("sink", "value")

    def __init__(self, sink: _Queue, value):
        self.sink = sink
        self.value = value

    def __await__(self):
        sink = self.sink
        fut = sink.future
        if fut is not None:
            if sink.closing:
                # Shielded: the state learns its closing record's LSN whether or not anyone waits.
                yield from asyncio.shield(fut).__await__()
            else:
                yield from fut.__await__()
            sink.staging.note_append()
        return self.value


class AsyncStore:
    """The asyncio twin of `Store`: the same names, awaited."""

    def __init__(self, store: Store):
        self.store = store
        self._event_sink: Optional[_Queue] = None  # see event()

    @property
    def config(self) -> Config:
        """The store's resolved configuration."""
        return self.store.config

    async def __aenter__(self) -> "AsyncStore":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _run(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: fn(*args, **kwargs))

    def _sink(self) -> _Queue:
        return _Queue(self.store.staging, asyncio.get_running_loop())

    async def start(
        self,
        intent: str,
        envelope: dict,
        execution_id: Optional[str] = None,
        *,
        parent_execution_id: Optional[str] = None,
        forked_at_seq: Optional[int] = None,
        created_at_ns: Optional[int] = None,
        meta: Optional[dict] = None,
    ) -> "AsyncExecution":
        """Start an execution; returns once its start record is durable (`Store.start`)."""
        s = self.store.staging
        start = s.reserve_start(
            intent, envelope, execution_id, parent_execution_id, forked_at_seq, created_at_ns, meta=meta
        )
        sink = self._sink()
        try:
            if start.state is not None and (start.explicit or parent_execution_id is not None):
                await self._run(s.check_new_in_db, start)
            # Once queued, the start is the WAL's: a cancelled caller does not take it back.
            s.stage_start(sink, start)
        finally:
            s.cancel_start(start)
        await sink.durable()
        return AsyncExecution(self, start.execution_id, start.envelope_hash)

    async def event(self, execution_id: str, type: str, payload: Any = None) -> int:
        """Record one event; returns its seq once durable."""
        # One sink per event loop, reused: `put` and the `future` read below run with no await
        # in between, so no other event of the loop comes between them. (An event is not a
        # closing record: its future is awaited as it is, no shield.)
        if type == FINAL_RESPONSE:  # it closes the execution: finish's own path
            return await self.finish(execution_id, payload)
        loop = get_running_loop()
        sink = self._event_sink
        if sink is None or sink.loop is not loop:
            sink = self._event_sink = _Queue(self.store.staging, loop)
        sink.future = None
        try:
            seq = sink.staging.stage_event(sink, execution_id, type, payload)
        except StageMiss:
            raise await self._run(sink.staging.not_held_error, execution_id) from None
        fut = sink.future
        if fut is not None:
            await fut  # cancelling the caller never takes the record back: the WAL writes it
            sink.staging.note_append()
        return seq

    async def finish(self, execution_id: str, response: dict) -> int:
        """Record the final response and close the execution; returns its seq once durable."""
        sink = self._sink()
        try:
            seq = sink.staging.stage_finish(sink, execution_id, response)
        except StageMiss:
            raise await self._run(sink.staging.not_held_error, execution_id) from None
        return await _Acked(sink, seq)

    async def invalidate(self, execution_id: str, reason: str) -> None:
        """Mark an execution invalidated (manually_invalidated); durable when this returns."""
        await self._status_change(execution_id, OP_INVALIDATE, reason)

    async def mark_recording_failure(self, execution_id: str, detail: str) -> None:
        """Flag an execution not replayable (recording_failure)."""
        await self._status_change(execution_id, OP_RECORDING_FAILURE, detail)

    async def _status_change(self, execution_id: str, op: str, text: str) -> None:
        s = self.store.staging
        sink = self._sink()
        if not s.stage_status_change(sink, execution_id, op, text, held_only=True):
            # Only the database knows it: look it up off the loop, and hand over from there.
            await self._run(s.stage_status_change, sink, execution_id, op, text)
        await sink.durable()

    async def abandon(self, execution_id: str, why: str) -> str:
        """Mark a running execution incomplete now because its agent died; returns the status it had."""
        sink = self._sink()
        status = sink.staging.stage_abandon(sink, execution_id, why)
        if status is None:
            return await self._run(self.store.abandon, execution_id, why)
        await sink.durable()
        return status

    async def record_execution(
        self,
        intent: str,
        envelope: dict,
        execution_id: Optional[str] = None,
        *,
        events=(),
        response: Optional[dict] = None,
        closing=(),
        created_at_ns: Optional[int] = None,
        meta: Optional[dict] = None,
        recorded_at_ns=None,
    ) -> "AsyncExecution":
        """`Store.record_execution` (a whole execution checked, then one WAL append), off the loop."""
        ex = await self._run(
            self.store.record_execution, intent, envelope, execution_id, events=events, response=response,
            closing=closing, created_at_ns=created_at_ns, meta=meta, recorded_at_ns=recorded_at_ns,
        )
        return AsyncExecution(self, ex.execution_id, ex.envelope_hash)

    async def get(self, execution_id: str) -> ExecutionRecord:
        """The execution's whole record."""
        return await self._run(self.store.get, execution_id)

    async def list(
        self,
        status: Optional[str] = None,
        since=None,
        until=None,
        limit: Optional[int] = None,
    ) -> list[TraceSummary]:
        """Executions by creation time, filtered."""
        return await self._run(self.store.list, status, since, until, limit)

    async def compact(self, *, progress: Optional[Callable[[int, int], None]] = None) -> CompactResult:
        """Apply every durable WAL record to the database now."""
        return await self._run(self.store.compact, progress=progress)

    async def recover(self, *, progress: Optional[Callable[[int, int], None]] = None) -> RecoverResult:
        """Compact and mark orphaned running executions incomplete."""
        return await self._run(self.store.recover, progress=progress)

    async def prune(
        self,
        older_than_s: Optional[float] = None,
        dry_run: bool = False,
        *,
        progress: Optional[Callable[[int, int], None]] = None,
    ) -> PruneResult:
        """Delete old terminal traces."""
        return await self._run(self.store.prune, older_than_s, dry_run, progress=progress)

    async def pin(self, execution_id: str) -> None:
        """Keep a trace forever."""
        await self._run(self.store.pin, execution_id)

    async def unpin(self, execution_id: str) -> None:
        """Let prune delete a trace again."""
        await self._run(self.store.unpin, execution_id)

    async def verify(self, execution_id: Optional[str] = None) -> VerifyResult:
        """Check hashes, event order and database integrity."""
        return await self._run(self.store.verify, execution_id)

    async def sweep_idle(self, now_ns: Optional[int] = None) -> int:
        """Mark idle executions incomplete."""
        return await self._run(self.store.sweep_idle, now_ns)

    async def close(self) -> None:
        """Close the store (marks running executions incomplete, compacts, releases the lock)."""
        self.store.wal.detach_loop()  # waits for the fdatasync (or rotation) under way
        await self._run(self.store.close)


class AsyncExecution(handles.AsyncExecution):
    """One execution being recorded through an `AsyncStore`."""

    @property
    def astore(self) -> AsyncStore:
        """The store it records into."""
        return self.recorder


async def open_store_async(data_dir=None, *, config=None, clock: Optional[Callable[[], int]] = None) -> AsyncStore:
    """Open the data directory for asyncio callers; recovery runs in a worker thread."""
    loop = asyncio.get_running_loop()
    cfg = as_config(config, data_dir)
    store = await loop.run_in_executor(None, lambda: Store(cfg, clock=clock))
    if cfg.wal_aio:
        try:
            store.wal.attach_loop()  # this loop flushes its own appends (wal.Wal.attach_loop)
        except BaseException:
            await loop.run_in_executor(None, store.close)
            raise
    return AsyncStore(store)
