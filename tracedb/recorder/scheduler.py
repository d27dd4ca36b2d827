"""When and where the embedded store compacts: the background thread, and the compactor process.

A background thread compacts the WAL into the database every `compact_interval_ms` (sooner when a
batch is waiting: `note_append`), notices traces invalidated from the CLI, and marks executions
idle for `idle_timeout_s` incomplete. Every compaction runs under one lock (`lock`), the
thread's, a read's (`refresh`) and `Store.compact`'s alike.

Where the compactor runs: in this process, taking the records it applies from memory (the WAL
keeps the last ones appended, `keep_records_in_memory`), or in a child process
(`tracedb.projection.compactor_worker`) that reads the segments: from the start with `[compaction]
worker_process = true`, or with "auto" once the store records AUTO_WORKER_RATE records/s or more.
The child is started from the background thread (on Linux it dies with the thread that started
it) outside the lock, handed over under it, and ended between two compactions; if it goes away,
compaction goes on in-process.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
import time
from typing import Callable, Optional

import sqlalchemy as sa

import wal

from tracedb.projection import db
from tracedb.maintenance import recovery
from tracedb.backoff import Backoff
from tracedb.projection.compactor import CompactResult, Compactor
from tracedb.config import AUTO_WORKER_RATE, Config
from tracedb.errors import StoreClosedError
from tracedb.projection.models import traces
from tracedb.records.record import STATUS_INVALIDATED, STATUS_RUNNING
from tracedb.maintenance.recovery import RecoverResult
from tracedb.recorder.staging import Staging

log = logging.getLogger(__name__)

# In-process compaction keeps this many batches (compact_batch_records) of just-appended records
# in memory for the compactor (see CompactionScheduler.keep_records_in_memory).
RETAIN_BATCHES = 8


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _RateWatch:
    """`[compaction] worker_process = "auto"`: says once when the WAL grew by AUTO_WORKER_RATE
    records/s or more over the last two seconds."""

    WINDOW_S = 2.0

    def __init__(self):
        self._marks: collections.deque = collections.deque()

    def reached(self, lsn: int) -> bool:
        now = time.monotonic()
        marks = self._marks
        marks.append((now, lsn))
        while now - marks[0][0] > self.WINDOW_S:
            marks.popleft()
        first_t, first_lsn = marks[0]
        # Half a second of history at least, so one burst right after opening does not decide it.
        return now - first_t >= self.WINDOW_S / 4 and lsn - first_lsn >= AUTO_WORKER_RATE * (now - first_t)


def invalidated_among(engine, execution_ids: list[str]) -> list[str]:
    """Which of `execution_ids` the database holds as invalidated (an operator's CLI call)."""
    found: list[str] = []
    with engine.connect() as conn:
        for i in range(0, len(execution_ids), 500):
            chunk = execution_ids[i : i + 500]
            found += conn.execute(
                sa.select(traces.c.execution_id)
                .where(traces.c.execution_id.in_(chunk))
                .where(traces.c.status == STATUS_INVALIDATED)
            ).scalars().all()
    return found


class CompactionScheduler:
    """Runs one store's compactions: on demand (`compact`, `refresh`), in the background thread,
    in this process or in the compactor process. `background_error` is the background thread's
    last failure (None once a round succeeds)."""

    def __init__(
        self, config: Config, wal_: "wal.Wal", staging: Staging, compactor: Compactor, *,
        engine, read_engine, recorder_id: str, clock: Callable[[], int],
    ):
        self.config = config
        self.wal = wal_
        self.staging = staging
        self.compactor = compactor
        self.engine = engine
        self.read_engine = read_engine
        self.recorder_id = recorder_id
        self.clock = clock
        self.lock = threading.Lock()  # one compaction at a time
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.worker = None  # a CompactorWorker while compaction runs in a child process
        self.background_error: Optional[BaseException] = None
        self.keep_records_in_memory(config.worker_mode != "process")

    @property
    def applied_lsn(self) -> int:
        """The last WAL LSN applied to the database."""
        return self.compactor.applied_lsn

    def start(self) -> None:
        """Start the background thread (if compaction or the idle sweep is on) and, with
        `worker_process = true`, the compactor process."""
        cfg = self.config
        background = cfg.compact_interval_ms > 0 or cfg.idle_timeout_s > 0
        if cfg.worker_mode == "process" and not background:
            self.start_worker()
        if background:
            self.thread = threading.Thread(target=self._background, name="tracedb-compactor", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        """Stop the background thread and wait for it (it ends the compactor process first)."""
        self.stopping.set()
        self.wake.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()

    def note_append(self) -> None:
        """Records were appended: wake the compactor when a batch's worth waits."""
        # Event.set() takes a lock even when already set.
        if self.wake.is_set():
            return
        if self.wal.durable_lsn - self.compactor.applied_lsn >= self.config.compact_batch_records:
            self.wake.set()

    # -- where the compactor runs ------------------------------------------------------
    def keep_records_in_memory(self, on: bool) -> None:
        """While compaction runs in this process it takes what was just appended from memory
        (decoded events included) instead of reading it back from the WAL segments; a bounded
        window: a compactor that falls behind reads the segments."""
        self.staging.hinting = on
        self.wal.retain(RETAIN_BATCHES * self.config.compact_batch_records if on else 0)

    def start_worker(self) -> None:
        """Start the compactor process and hand compaction over to it (in-process if it fails)."""
        from tracedb.projection.compactor_worker import CompactorWorker

        cfg = self.config
        # The child starts (a Python process importing SQLAlchemy: most of a second) outside the
        # compaction lock: reads and compactions go on in-process meanwhile. It reads the
        # checkpoint again at its first request, which comes under the lock, after the handover.
        try:
            worker = CompactorWorker(
                database=cfg.database, wal_dir=cfg.wal_dir, recorder_id=self.recorder_id,
                batch_records=cfg.compact_batch_records, busy_timeout_ms=cfg.busy_timeout_ms,
            )
        except Exception as e:  # noqa: BLE001 - compaction goes on in-process
            log.error("tracedb: the compactor process did not start (%s); compacting in-process", e)
            with self.lock:
                self.keep_records_in_memory(True)
            return
        with self.lock:
            if self.staging.closed:
                worker.close()
                return
            self.worker = worker
            self.keep_records_in_memory(False)  # the child reads the segments

    def stop_worker(self) -> None:
        """End the compactor process (the lock held); compaction goes on in-process."""
        worker, self.worker = self.worker, None
        self.keep_records_in_memory(True)
        if worker is not None:
            worker.close()
            # It may have applied a batch it could not report: read the checkpoint back.
            self.compactor.adopt(db.ensure_checkpoint(self.engine, self.recorder_id, self.clock()))

    def close(self) -> None:
        """Release the compactor process and the compactor (the store is shutting down)."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        self.compactor.close()

    # -- compacting ----------------------------------------------------------------------
    def compact(self, progress=None) -> CompactResult:
        """Apply every durable WAL record to the database now (StoreClosedError once closed)."""
        if self.staging.closed:
            raise StoreClosedError()
        with self.lock:
            if self.staging.closed:  # close() compacted last and is releasing everything
                raise StoreClosedError()
            return self.compact_locked(progress)

    def refresh(self) -> None:
        """Compact if the WAL holds durable records the database lacks (before a read)."""
        if not self.staging.closed and self.wal.durable_lsn > self.compactor.applied_lsn:
            self.compact()

    def compact_locked(self, progress=None) -> CompactResult:
        """One compaction, the lock held: by the compactor process if there is one, else here."""
        if self.worker is not None:
            from tracedb.projection.compactor_worker import WorkerGoneError

            try:
                result = self.worker.compact(self.wal.durable_lsn)
            except WorkerGoneError as e:
                log.error("tracedb: %s; compacting in-process from now on", e)
                self.stop_worker()
            else:
                self.compactor.adopt(result.applied_lsn)
                self.forget_applied(result.applied_lsn)
                deleted = self.compactor.release_wal(self.wal.mark_applied)
                return dataclasses.replace(result, segments_deleted=result.segments_deleted + deleted)
        result = self.compactor.compact(
            self.wal.durable_lsn,
            mark_applied=self.wal.mark_applied,
            progress=progress,
            on_batch=self.forget_applied,
        )
        return result

    def forget_applied(self, applied_lsn: int) -> None:
        """Closed executions whose last record is applied leave memory."""
        self.staging.executions.forget_applied(applied_lsn)

    def sync_external(self) -> int:
        """Close in memory the executions an operator invalidated directly in the database."""
        open_ids = [s.execution_id for s in self.staging.open_states()]
        if not open_ids:
            return 0
        with self.lock:
            if not self.compactor.external_change():
                return 0
        closed = 0
        for eid in invalidated_among(self.read_engine, open_ids):
            state = self.staging.executions.get(eid)
            if state is None:
                continue
            with state.lock:
                if state.status == STATUS_RUNNING:
                    state.status = STATUS_INVALIDATED
                    closed += 1
        return closed

    def recover(self, why: str, progress=None) -> RecoverResult:
        """Compact, then mark incomplete every running execution that this store is not
        recording (`tracedb.maintenance.recovery.recover`); `why`: the reason the records give."""
        with self.lock:
            kept = recovery.keep_damaged_segments(self.config.wal_dir, self.compactor.applied_lsn)
            result = recovery.recover(
                compact=self.compact_locked,
                engine=self.read_engine,
                recorder_id=self.recorder_id,
                recording={s.execution_id for s in self.staging.open_states()},
                append_many=self.wal.append_many,
                now_ns=self.clock(),
                why=why,
                progress=progress,
            )
        if kept:
            result = dataclasses.replace(result, kept_copies=kept)
        return result

    # -- the background thread -----------------------------------------------------------
    def _background(self) -> None:
        try:
            self._background_loop()
        finally:
            # A child started from this thread dies with it (PR_SET_PDEATHSIG): end it first,
            # between two compactions, rather than have it killed.
            if self.worker is not None:
                with self.lock:
                    self.stop_worker()

    def _background_loop(self) -> None:
        mode = self.config.worker_mode
        if mode == "process" and self.worker is None:
            # From this thread, which lives as long as the store: on Linux the child is tied to
            # the thread that started it (PR_SET_PDEATHSIG).
            self.start_worker()
        interval = self.config.compact_interval_ms / 1000.0 if self.config.compact_interval_ms > 0 else None
        rate = None
        if mode == "auto" and interval is not None and _cores() >= 2:
            from tracedb.projection.compactor_worker import interpreter_runs_python

            rate = _RateWatch() if interpreter_runs_python() else None
        idle_s = self.config.idle_timeout_s
        sweep_every_s = min(60.0, idle_s / 10) if idle_s > 0 else None
        next_sweep = time.monotonic() + (sweep_every_s or 0)
        period = interval if interval is not None else sweep_every_s
        retry = Backoff(first_s=2 * (period or 1.0), max_s=5.0)
        failures = 0
        while not self.stopping.is_set():
            wait = retry.next_delay() if failures else period
            self.wake.wait(wait)
            self.wake.clear()
            if self.stopping.is_set():
                return
            try:
                if interval is not None:
                    if rate is not None and rate.reached(self.wal.durable_lsn):
                        rate = None
                        self.start_worker()  # compacts in-process again if it cannot start
                    self.refresh()
                    self.sync_external()
                if sweep_every_s is not None and time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + sweep_every_s
                    self.staging.sweep_idle()
                failures = 0
                retry.reset()
                self.background_error = None
            except StoreClosedError:
                return
            except Exception as e:  # noqa: BLE001 - keep recording; report, back off, retry
                failures += 1
                self.background_error = e
                log.error("tracedb background compaction failed (attempt %d): %s", failures, e)
