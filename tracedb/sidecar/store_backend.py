"""The embedded store as the sidecar server's backend (see backend.py for the contract).

Fast path (an event for an execution held in memory, with the expected seq): one call into the
store's `Staging.stage_event` (`tracedb.recorder.staging`), which numbers the event and frames its WAL
record into the current batch.
Slow paths run as `Deferred`s off the hot path: starts with a client-chosen id (the database is
asked whether the id exists), requests for executions only the database knows, and resent
requests, which are compared with what was recorded.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections import OrderedDict, deque
from typing import Any, Optional

import wal

import tracedb
from tracedb.reads import sqlite as sqlite_reads
from tracedb.records.codec import OP_RECORDING_FAILURE
from tracedb.errors import ExecutionClosedError, ExecutionExistsError, ExecutionNotFoundError
from tracedb.projection.models import TERMINAL_STATUSES
from tracedb.records.record import FINAL_RESPONSE, compute_envelope_hash, redacted_paths
from tracedb.recorder.state import StagedBatch, StageMiss
from tracedb.recorder.store_async import AsyncStore
from tracedb.sidecar import protocol as P
from tracedb.sidecar.backend import IN_BATCH, BackendStats, Deferred, Staged


# Resent events are compared with the recorded ones: the recorded steps of this many executions
# are kept, so that a burst of resends (a client's whole window after a reconnect) reads each
# execution's record once instead of once per request.
RESEND_CACHE_EXECUTIONS = 8


def seq_conflict(execution_id: str, message: str) -> P.ProtocolError:
    """The error for an expected seq that does not fit the execution."""
    return P.ProtocolError(P.SEQ_CONFLICT, f"execution {execution_id!r}: {message}")


def same_json(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values are the same document. Python's `==` is not enough:
    `True == 1` and `{"n": true} == {"n": 1}` hold, but a resent event whose payload says
    `true` where the recorded one says `1` is another event. A number is the same number
    whatever its spelling (`1000`, `1000.0` and `1e3`), as in JSON: SQLite hands a stored
    `1e3` back as the integer 1000."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_json(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same_json, a, b))
    if isinstance(a, (int, float)):
        return isinstance(b, (int, float)) and a == b
    return type(a) is type(b) and a == b


class StoreBackend:
    """Serves the protocol from an AsyncStore opened on the data directory."""

    def __init__(self, astore: AsyncStore):
        self.astore = astore
        self.store = astore.store
        self.staging = self.store.staging  # numbering, closing and the batch's append
        self.loop = asyncio.get_running_loop()
        self.batch = StagedBatch()
        self.last: Optional[asyncio.Future] = None  # the last committed batch's future
        self._quick = self._open_quick_reader()
        # (lsn, monotonic time) samples, to tell the age of the oldest record not compacted.
        self._appended: deque = deque()
        self._sample_at = 0.0
        # execution id -> ({seq: (type, payload)}, last seq, status once closed else None):
        # recorded steps never change, and a closed execution gets no more.
        self._recorded_steps: OrderedDict = OrderedDict()
        # execution id -> future done once a start for it, checked off the loop, is settled
        # (staged or given up): a copy of that start resent meanwhile waits for it.
        self._starting: dict[str, asyncio.Future] = {}

    # -- staging -------------------------------------------------------------------------
    def stage_event(self, execution_id: str, type: str, payload: Any, seq: Optional[int]):
        """Stage one event (see Backend.stage_event); the fast path returns the seq itself."""
        try:
            return self.staging.stage_event(self.batch, execution_id, type, payload, seq)
        except StageMiss as miss:
            return self._missed(miss, execution_id, type, payload, seq)

    def stage_finish(self, execution_id: str, response: dict, seq: Optional[int]):
        """Stage the final response (see Backend.stage_finish)."""
        try:
            return self.staging.stage_finish(self.batch, execution_id, response, seq)
        except StageMiss as miss:
            return self._missed(miss, execution_id, FINAL_RESPONSE, response, seq)

    def _missed(self, miss: StageMiss, execution_id: str, type: str, payload: Any, seq: Optional[int]):
        if miss.next_seq is None:
            return Deferred(self._unknown(execution_id, type, payload, seq))
        if seq < miss.next_seq:
            return Deferred(self._resent(execution_id, seq, type, payload))
        raise seq_conflict(execution_id, f"expected seq {miss.next_seq}, got {seq}")

    def stage_invalidate(self, execution_id: str, reason: str):
        """Stage an invalidation; executions only the database knows are invalidated off the loop."""
        self._recorded_steps.pop(execution_id, None)  # its cached status would be stale
        before = len(self.batch.payloads)
        if self.staging.stage_invalidate(self.batch, execution_id, reason):
            if len(self.batch.payloads) > before:
                return Staged({}, IN_BATCH)
            return Staged({}, self.barrier())  # already invalidated: answer once that is durable
        return Deferred(self._invalidate_in_db(execution_id, reason))

    def stage_recording_failure(self, execution_id: str, detail: str):
        """Stage a recording_failure flag; executions only the database knows are flagged off the loop."""
        self._recorded_steps.pop(execution_id, None)
        before = len(self.batch.payloads)
        if self.staging.stage_status_change(self.batch, execution_id, OP_RECORDING_FAILURE, detail, held_only=True):
            return Staged({}, IN_BATCH if len(self.batch.payloads) > before else self.barrier())
        return Deferred(self._flag_in_db(execution_id, detail))

    async def _flag_in_db(self, execution_id: str, detail: str) -> Staged:
        await self.astore.mark_recording_failure(execution_id, detail)
        return Staged({})

    def stage_abandon(self, execution_id: str, reason: str):
        """Mark a running execution incomplete (its agent is gone); a repeat is answered alike."""
        before = len(self.batch.payloads)
        status = self.staging.stage_abandon(self.batch, execution_id, reason)
        if status is None:
            return Deferred(self._abandon_in_db(execution_id))
        if len(self.batch.payloads) > before:
            return Staged({"status": "incomplete"}, IN_BATCH)
        if status == "incomplete":
            return Staged({"status": "incomplete"}, self.barrier())
        raise ExecutionClosedError(execution_id, status)

    async def _abandon_in_db(self, execution_id: str) -> Staged:
        # Only the database knows it: it is closed (recovery closed every orphan at start-up).
        status = await self._run(self.staging.status_of, execution_id)
        if status is None:
            raise ExecutionNotFoundError(execution_id)
        if status == "incomplete":
            return Staged({"status": "incomplete"})
        raise ExecutionClosedError(execution_id, status)

    def stage_start(self, intent, envelope, execution_id, parent_execution_id, forked_at_seq):
        """Stage a start. A client-chosen id is looked up in the database first: on the loop when
        a direct SQLite read answers at once (microseconds), else off the loop."""
        staging = self.staging
        if parent_execution_id is not None:
            return Deferred(self._start(intent, envelope, execution_id, parent_execution_id, forked_at_seq))
        try:
            start = staging.reserve_start(intent, envelope, execution_id, None, forked_at_seq)
        except ExecutionExistsError:
            return Deferred(self._existing(
                execution_id, intent, envelope,
                again=lambda: self._start(intent, envelope, execution_id, None, forked_at_seq),
            ))
        if start.explicit and start.state is not None:
            known = self._db_status(start.execution_id)
            if known is not False:
                staging.cancel_start(start)
                if known is None:  # the quick read could not answer: ask off the loop
                    return Deferred(self._start(intent, envelope, execution_id, None, forked_at_seq))
                return Deferred(self._existing(execution_id, intent, envelope))
        return self._stage_start(start)

    def _stage_start(self, start) -> Staged:
        """Stage a start checked to be new; answered once its batch is durable."""
        self.staging.stage_start(self.batch, start)
        self._recorded_steps.pop(start.execution_id, None)  # an id pruned and used again
        return Staged(self._started(start.execution_id, start.envelope_hash), IN_BATCH)

    async def _after_start_of(self, execution_id: str) -> bool:
        """Wait until a start of `execution_id` being checked off the loop (a fork, or a start the
        quick read could not answer) is staged or given up; True if there was one."""
        starting = self._starting.get(execution_id)
        if starting is None:
            return False
        await asyncio.shield(starting)
        return True

    def _db_status(self, execution_id: str):
        """False if the SQLite projection has no such execution, True if it has, None if unsure."""
        con = self._quick
        if con is None:
            return None
        try:
            return sqlite_reads.exists(con, execution_id)
        except sqlite3.Error:
            return None

    @staticmethod
    def _started(execution_id: str, envelope_hash: str) -> dict:
        return {"execution_id": execution_id, "envelope_hash": envelope_hash, "created": True, "last_seq": 0}

    def commit(self) -> Optional[asyncio.Future]:
        """Append the current batch with one WAL call."""
        batch = self.batch
        if not batch.payloads:
            if not self.store.config.enabled:
                # Recording is off: nothing was written, and what was staged is answered at once.
                done = self.loop.create_future()
                done.set_result([])
                return done
            return None
        self.batch = StagedBatch()
        fut = self.staging.append_staged(batch, self.loop)
        self.last = fut
        now = time.monotonic()
        if now - self._sample_at >= 0.05:
            self._sample_at = now
            self._appended.append((self.store.durable_lsn, now))
            if len(self._appended) > 4096:
                self._appended.popleft()
        return fut

    def barrier(self) -> Optional[asyncio.Future]:
        """Everything committed so far is durable when this resolves."""
        if self.batch.payloads:
            return IN_BATCH
        last = self.last
        if last is not None and not last.done():
            return last
        return None

    def _open_quick_reader(self) -> Optional[sqlite3.Connection]:
        """A read-only SQLite connection for point lookups on the loop: a few to tens of µs, by
        how warm its cache is, instead of about 300 µs through the pooled engine and a thread
        hop. None for other databases."""
        path = self.store.config.sqlite_path
        if "://" in path or not os.path.exists(path):
            return None
        try:
            # A short busy timeout: if a checkpoint holds the lock, fall back to the slow path.
            return sqlite_reads.open_read(path, timeout_s=0.02)
        except sqlite3.Error:
            return None

    # -- slow paths ----------------------------------------------------------------------
    async def _run(self, fn, *args):
        return await self.loop.run_in_executor(None, fn, *args)

    async def _settled(self) -> None:
        b = self.barrier()
        if b is not None and b is not IN_BATCH:
            await b

    async def _recorded(self, execution_id: str):
        """The execution's record with everything durable so far (compacts first)."""
        await self._settled()
        return await self.astore.get(execution_id)

    async def _steps_up_to(self, execution_id: str, seq: int) -> tuple[dict, int, Optional[str]]:
        """({seq: (type, payload)}, last seq, status if closed) of the execution's durable
        steps, read again only when `seq` lies beyond what was read before and the execution may
        still grow. Raises ExecutionNotFoundError."""
        cache = self._recorded_steps
        got = cache.get(execution_id)
        if got is not None and (seq <= got[1] or got[2] is not None):
            cache.move_to_end(execution_id)
            return got
        rec = await self._recorded(execution_id)
        closed = rec.status if rec.status in TERMINAL_STATUSES and self.staging.next_seq(execution_id) is None else None
        got = ({e.seq: (e.type, e.payload) for e in rec.events}, rec.events[-1].seq if rec.events else 0, closed)
        cache[execution_id] = got
        cache.move_to_end(execution_id)
        while len(cache) > RESEND_CACHE_EXECUTIONS:
            cache.popitem(last=False)
        return got

    async def _resent(self, execution_id: str, seq: int, type: str, payload: Any) -> Staged:
        """A request whose seq was already taken: the original's seq if it is the same event."""
        steps, last, _closed = await self._steps_up_to(execution_id, seq)
        got = steps.get(seq)
        if got is not None:
            if got[0] == type and same_json(got[1], payload):
                return Staged({"seq": seq, "duplicate": True})
            if got[0] == type and self.store.redactor is not None and redacted_paths(got[1]):
                # The recorded payload is the redacted one: compare what the resend would record.
                intent = (await self._recorded(execution_id)).intent
                if same_json(got[1], self.staging.redact_for(intent, payload)):
                    return Staged({"seq": seq, "duplicate": True})
            raise seq_conflict(execution_id, f"seq {seq} holds another event ({got[0]})")
        raise seq_conflict(execution_id, f"seq {seq} is taken but not recorded; next is {last + 1}")

    async def _unknown(self, execution_id: str, type: str, payload: Any, seq: Optional[int]):
        """An event for an execution not held in memory: a resend, closed, unknown, or starting."""
        await self._after_start_of(execution_id)
        if seq is not None:
            try:
                _steps, last, closed = await self._steps_up_to(execution_id, seq)
            except ExecutionNotFoundError:
                last, closed = 0, None
            if seq <= last:
                return await self._resent(execution_id, seq, type, payload)
            if closed is not None:
                raise ExecutionClosedError(execution_id, closed)
        nxt = self.staging.next_seq(execution_id)
        if nxt is None:
            status = await self._run(self.staging.status_of, execution_id)
            nxt = self.staging.next_seq(execution_id)
            if nxt is None:
                if status is None:
                    raise ExecutionNotFoundError(execution_id)
                raise ExecutionClosedError(execution_id, status)
        if seq is not None and seq != nxt:
            raise seq_conflict(execution_id, f"expected seq {nxt}, got {seq}")
        try:
            return Staged({"seq": self.staging.stage_event(self.batch, execution_id, type, payload)}, IN_BATCH)
        except StageMiss:
            # Closed and forgotten by the compactor meanwhile.
            status = await self._run(self.staging.status_of, execution_id)
            raise ExecutionClosedError(execution_id, status or "closed") from None


    async def _invalidate_in_db(self, execution_id: str, reason: str) -> Staged:
        await self.astore.invalidate(execution_id, reason)
        return Staged({})

    async def _start(self, intent, envelope, execution_id, parent_execution_id, forked_at_seq) -> Staged:
        staging = self.staging
        try:
            start = staging.reserve_start(intent, envelope, execution_id, parent_execution_id, forked_at_seq)
        except ExecutionExistsError:
            return await self._existing(
                execution_id, intent, envelope,
                again=lambda: self._start(intent, envelope, execution_id, parent_execution_id, forked_at_seq),
            )
        settled = self._starting[start.execution_id] = self.loop.create_future()
        exists = False
        try:
            await self._run(staging.check_new_in_db, start)
        except ExecutionExistsError:
            staging.cancel_start(start)
            exists = True
        except BaseException:
            staging.cancel_start(start)
            raise
        finally:
            del self._starting[start.execution_id]
            settled.set_result(None)
        if exists:
            return await self._existing(execution_id, intent, envelope)
        return self._stage_start(start)

    async def _existing(self, execution_id: str, intent: str, envelope: dict, again=None) -> Staged:
        """A start for an id that exists: a resent start if intent and envelope match. `again`
        (a coroutine function) runs the start anew if the copy it waited for gave up."""
        envelope_hash = compute_envelope_hash(envelope)
        waited = await self._after_start_of(execution_id)  # its first copy, still being checked
        try:
            rec = await self._recorded(execution_id)
        except ExecutionNotFoundError:
            if waited and again is not None and self.staging.next_seq(execution_id) is None:
                return await again()  # the copy waited for gave up (its parent is missing, say)
            raise ExecutionExistsError(execution_id) from None  # another start still in flight
        if rec.header.envelopeHash != envelope_hash or rec.intent != intent:
            raise ExecutionExistsError(execution_id)
        nxt = self.staging.next_seq(execution_id)
        last_seq = nxt - 1 if nxt is not None else (rec.events[-1].seq if rec.events else 0)
        return Staged(
            {
                "execution_id": execution_id,
                "envelope_hash": envelope_hash,
                "created": False,
                "last_seq": last_seq,
                "status": rec.status,
            }
        )

    # -- reading, metrics, lifecycle -----------------------------------------------------
    async def get(self, execution_id: str) -> dict:
        """The execution's record (to_dict shape), everything durable included."""
        rec = await self.astore.get(execution_id)
        return rec.to_dict()

    def stats(self) -> BackendStats:
        """Numbers for /metrics and /health."""
        store = self.store
        w = store.wal
        durable = w.durable_lsn
        applied = store.applied_lsn
        lag = max(0, durable - applied)
        ws = w.stats()
        avg = ws.bytes_written / ws.appends if ws.appends else 0.0
        wal_bytes = 0
        try:
            for seg in wal.list_segments(w.directory):
                wal_bytes += os.path.getsize(seg.path)
        except OSError:
            pass
        lag_s = 0.0
        if lag:
            now = time.monotonic()
            for lsn, t in self._appended:
                if lsn > applied:
                    lag_s = now - t
                    break
        failed = w.failed
        bg = getattr(store, "background_error", None)
        return BackendStats(
            open_executions=self.staging.open_executions,
            durable_lsn=durable,
            applied_lsn=applied,
            wal_bytes=wal_bytes,
            uncompacted_bytes=int(lag * avg),
            compaction_lag_records=lag,
            compaction_lag_s=lag_s,
            failed=str(failed) if failed is not None else None,
            background_error=str(bg) if bg is not None else None,
        )

    def set_group_observer(self, observer) -> None:
        """Report each WAL group commit (records, bytes, write+fdatasync seconds) to `observer`."""
        w = self.store.wal
        prev = [w.durable_lsn]

        def on_group(nbytes: int, seconds: float) -> None:
            lsn = w.durable_lsn
            observer(lsn - prev[0], nbytes, seconds)
            prev[0] = lsn

        w.on_group = on_group

    async def close(self) -> None:
        """Close the store: running executions are marked incomplete, everything is compacted."""
        if self._quick is not None:
            self._quick.close()
            self._quick = None
        await self.astore.close()


async def open_backend(data_dir: str, *, config=None) -> StoreBackend:
    """Open the store on `data_dir` (recovery runs first) and wrap it for the server."""
    astore = await tracedb.open_async(data_dir, config=config)
    return StoreBackend(astore)
