"""The embedded store: record executions durably, read them back, keep the projection fresh.

Recording path: validate in memory (no database query), give the event its seq under the
execution's lock, append one record to the WAL, return once it is fdatasynced. Holding the
execution's lock across the hand-over makes seq order equal LSN order for each execution, while
appends of different executions share the WAL's group commit. One implementation numbers and
closes executions for every path (`stage_*`): the sync API appends each record at once, the
asyncio API (`tracedb.store_async`) queues it, the sidecar frames many into one `StagedBatch`.

A background thread compacts the WAL into SQLite every `compact_interval_ms` (sooner when a batch
is waiting), notices traces invalidated from the CLI, and marks executions idle for
`idle_timeout_s` incomplete. Reads compact what is durable first, so a just-recorded event is seen.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import re
import socket
import stat
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

import sqlalchemy as sa

import wal
from wal.futures import running_loop

from . import db, handles, reads, recovery, retention
from .backoff import Backoff
from .codec import (
    OP_INCOMPLETE,
    OP_INVALIDATE,
    OP_RECORDING_FAILURE,
    STATUS_TEXT_KEY,
    EventFrame,
    encode_event,
    encode_finish,
    encode_start,
    encode_status,
    event_payload_offset,
)
from .compactor import CompactResult, Compactor
from .config import AUTO_WORKER_RATE, Config, as_config
from .errors import (
    ExecutionClosedError,
    ExecutionExistsError,
    ExecutionNotFoundError,
    IntegrityError,
    InvalidInputError,
    RecordingFailedError,
    StoreClosedError,
    StoreInUseError,
    UsageError,
)
from .ids import new_execution_id
from .models import traces
from .outcomes import event_facts
from .record import (
    FINAL_RESPONSE,
    FLAGGABLE_STATUSES,
    STATUS_COMPLETED,
    STATUS_INCOMPLETE,
    STATUS_INVALIDATED,
    STATUS_RUNNING,
    ExecutionRecord,
    compute_envelope_hash,
)
from .recovery import RecoverResult
from .redaction import Rules, redact
from .retention import PruneResult
from .state import PENDING_LSN, ExecutionState, ExecutionTable, StagedBatch, StagedStart, StageMiss
from .validation import (
    check_event_type,
    payload_json,
    payload_parsed,
    validate_event_type,
    validate_id,
    validate_id_ref,
    validate_intent,
    validate_meta,
    validate_response,
    validate_text,
)
from .verify import VerifyResult, verify as _verify

if TYPE_CHECKING:
    from .rows import TraceSummary

log = logging.getLogger(__name__)

RECORDER_ID_FILE = "RECORDER_ID"
# In-process compaction keeps this many batches (compact_batch_records) of just-appended records
# in memory for the compactor (see Store._keep_records_in_memory).
RETAIN_BATCHES = 8
_TOO_LARGE_HINT = "store large blobs elsewhere and record a reference"
_WARNED_OPEN: set = set()  # data directories this process warned about (once each)


def _make_data_dir(path: str, warn: bool) -> None:
    """Make the data directory private (0700), each new level fsynced into its parent. One that
    exists keeps its mode (it is its owner's choice); when other local users may enter it
    (group or other bits), `warn` says so once per process: they may read what is recorded."""
    if wal.fs.make_dirs(wal.OsFileSystem(), path) or not warn:
        return
    mode = stat.S_IMODE(os.stat(path).st_mode)
    real = os.path.realpath(path)
    if mode & 0o077 and real not in _WARNED_OPEN:
        _WARNED_OPEN.add(real)
        log.warning(
            "the data directory %s is open to other local users (mode %04o): they may read what is "
            "recorded in it; `chmod 700` it to keep them out (a directory tracedb makes is 0700)",
            real, mode,
        )


def _resolve_recorder_id(cfg: Config) -> str:
    if cfg.recorder_id:
        return cfg.recorder_id
    path = os.path.join(cfg.data_dir, RECORDER_ID_FILE)
    try:
        with open(path, encoding="ascii") as f:
            rid = f.read().strip()
        if rid:
            return rid
    except FileNotFoundError:
        pass
    # Generated once per data directory and kept, because the checkpoint row is keyed by it.
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:40] or "host"
    rid = f"{host}-{uuid.uuid4().hex[:12]}"
    wal.fs.write_file_atomic(wal.OsFileSystem(), cfg.data_dir, RECORDER_ID_FILE, (rid + "\n").encode())
    return rid


_WAL_REFUSALS = (wal.PayloadTooLargeError, wal.WalFailedError, wal.WalClosedError)


def _refusal(e: Exception) -> Exception:
    """The store's error for a WAL that refused an append."""
    if isinstance(e, wal.PayloadTooLargeError):
        return InvalidInputError(str(e), hint=_TOO_LARGE_HINT)
    if isinstance(e, wal.WalFailedError):
        return RecordingFailedError(e.message, hint=e.hint)
    return StoreClosedError()


def check_record_size(data: bytes) -> bytes:
    """Refuse a record the WAL would refuse, before anything is numbered or written."""
    if len(data) > wal.MAX_PAYLOAD_BYTES:
        raise InvalidInputError(
            f"record of {len(data)} bytes exceeds the WAL's limit of {wal.MAX_PAYLOAD_BYTES}",
            hint=_TOO_LARGE_HINT,
        )
    return data


class Execution(handles.Execution):
    """One execution being recorded in the embedded store: `event()`, then `finish()`."""

    @property
    def store(self) -> "Store":
        """The store it records into."""
        return self.recorder


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


class _AppendNow:
    """The sync API's sink: each record is appended and durable before `put` returns."""

    __slots__ = ("store",)

    def __init__(self, store: "Store"):
        self.store = store

    def put(self, data: bytes, hint, state, closing: bool) -> int:
        return self.store._append(data, hint)


class Store:
    """A data directory opened for recording. Use `tracedb.open(data_dir)`; a context manager."""

    def __init__(
        self,
        config: Config,
        *,
        clock: Optional[Callable[[], int]] = None,
        recovery_progress: Optional[Callable[[int, int], None]] = None,
        # False for one-shot maintenance (the CLI's commands, which cron or a loop may run): the
        # recorder (`tracedb serve`, the library) warns about a data directory open to others.
        warn_if_shared: bool = True,
    ):
        self.config = config
        self.clock = clock or time.time_ns
        self.data_dir = config.data_dir
        self._closed = False
        self._lock = threading.Lock()  # guards closing
        self._executions = ExecutionTable()
        self._appender = _AppendNow(self)
        self._compact_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._engine = self._read_engine = None
        self._records: Optional[reads.RecordReader] = None
        self._compactor: Optional[Compactor] = None
        self._worker = None  # a CompactorWorker while compaction runs in a child process
        self._hinting = False  # see _keep_records_in_memory
        self.background_error: Optional[BaseException] = None
        self._disabled_seqs: dict[str, int] = {}
        self._redactor = config.redactor()
        _make_data_dir(self.data_dir, warn_if_shared)
        try:
            self._wal = wal.open_wal(
                config.wal_dir,
                segment_size_bytes=config.wal_segment_size_bytes,
                preallocate=config.wal_preallocate,
            )
        except wal.WalLockedError as e:
            raise StoreInUseError(
                f"data directory {self.data_dir} is in use by a running recorder ({e.holder})",
                hint="record through it: `from tracedb.client import connect` (it finds the recorder's "
                "socket); it compacts and recovers by itself, and read commands work next to it",
            ) from None
        try:
            self._open_database()
            self.last_recovery: RecoverResult = self._recover(at_open=True, progress=recovery_progress)
        except BaseException:
            self._shutdown_resources()
            raise
        background = config.compact_interval_ms > 0 or config.idle_timeout_s > 0
        if config.worker_mode == "process" and not background:
            self._start_worker()
        if background:
            self._thread = threading.Thread(target=self._background, name="tracedb-compactor", daemon=True)
            self._thread.start()

    def _start_worker(self) -> None:
        from .compactor_worker import CompactorWorker

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
            with self._compact_lock:
                self._keep_records_in_memory(True)
            return
        with self._compact_lock:
            if self._closed:
                worker.close()
                return
            self._worker = worker
            self._keep_records_in_memory(False)  # the child reads the segments

    def _open_database(self) -> None:
        cfg = self.config
        self._engine = db.create_engine(cfg.sqlite_path, busy_timeout_ms=cfg.busy_timeout_ms, write=True)
        self._read_engine = db.create_engine(cfg.sqlite_path, busy_timeout_ms=cfg.busy_timeout_ms)
        self._records = reads.RecordReader(self._read_engine, busy_timeout_ms=cfg.busy_timeout_ms)
        db.migrate(self._engine)
        self.recorder_id = _resolve_recorder_id(cfg)
        applied = db.ensure_checkpoint(self._engine, self.recorder_id, self.clock())
        wal_applied = self._wal.applied_lsn  # everything below it may be deleted from the WAL
        if applied + 1 < wal_applied:
            raise IntegrityError(
                f"{db.describe(cfg.sqlite_path)} has applied the WAL up to LSN {applied}, but the WAL already "
                f"dropped records below {wal_applied}: this database is not the one that WAL was "
                "compacted into",
                hint="restore the matching traces.db, or move the data directory aside and start anew",
            )
        if applied > self._wal.durable_lsn:
            raise IntegrityError(
                f"{db.describe(cfg.sqlite_path)} has applied LSN {applied}, beyond the end of the WAL "
                f"({self._wal.durable_lsn}): the WAL directory was replaced",
                hint="restore the matching wal/ directory, or give this WAL a new recorder_id",
            )
        self._compactor = Compactor(
            self._engine, cfg.wal_dir, self.recorder_id, applied,
            batch_records=cfg.compact_batch_records, clock=self.clock,
            source=self._wal.take_retained,
        )
        self._keep_records_in_memory(cfg.worker_mode != "process")

    def _keep_records_in_memory(self, on: bool) -> None:
        """While compaction runs in this process it takes what was just appended from memory
        (decoded events included) instead of reading it back from the WAL segments; a bounded
        window: a compactor that falls behind reads the segments."""
        self._hinting = on
        self._wal.retain(RETAIN_BATCHES * self.config.compact_batch_records if on else 0)

    # -- context manager / lifecycle ----------------------------------------------------
    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if not getattr(self, "_closed", True):
            import warnings

            warnings.warn(f"tracedb Store {self.data_dir} was never closed", ResourceWarning, stacklevel=1)

    @property
    def engine(self):
        """The SQLAlchemy engine of the projection (writes begin IMMEDIATE on SQLite)."""
        return self._engine

    @property
    def read_engine(self):
        """An engine for reads of the projection (never takes SQLite's write lock)."""
        return self._read_engine

    @property
    def applied_lsn(self) -> int:
        """The last WAL LSN applied to the database."""
        return self._compactor.applied_lsn if self._compactor else 0

    @property
    def durable_lsn(self) -> int:
        """The last WAL LSN acknowledged as durable."""
        return self._wal.durable_lsn

    @property
    def redactor(self):
        """The `tracedb.redaction.Redactor` every record passes through, or None (off)."""
        return self._redactor

    @property
    def wal(self) -> "wal.Wal":
        """The write-ahead log this store appends to (for its stats and its event-loop flush)."""
        return self._wal

    def close(self) -> None:
        """Mark executions still running incomplete, compact everything, release the data dir.

        Safe to call twice. After close the store refuses every call.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        try:
            with self._compact_lock:
                self._stop_worker()  # the last compaction below runs here, alone
            if self._wal.failed is None:
                # Nobody can record into them once this process lets go of the WAL.
                self._mark_incomplete(self._open_states(), "recorder_closed")
                with self._compact_lock:
                    self._compact_locked()
        finally:
            self._shutdown_resources(checkpoint=True)

    def _shutdown_resources(self, *, checkpoint: bool = False) -> None:
        self._closed = True
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        if self._compactor is not None:
            self._compactor.close()
        if self._records is not None:
            self._records.close()
        if self._read_engine is not None:
            self._read_engine.dispose()
        if checkpoint and self._engine is not None:
            self._checkpoint_database()
        if self._engine is not None:
            self._engine.dispose()
        self._wal.close()

    def _checkpoint_database(self) -> None:
        # Once this process's readers and the compactor process have let go: SQLite's own
        # checkpoint at the last connection's close does not happen while another process
        # (`tracedb ui`, a reader next to it) still has the file open, and a copy of traces.db
        # would then lack what its -wal holds.
        try:
            busy, frames, copied = db.checkpoint_sqlite(self._engine) or (0, 0, 0)
        except Exception as e:  # noqa: BLE001 - closing goes on; the next open checkpoints
            log.warning("tracedb: the database could not be checkpointed at close: %s", e)
            return
        if busy:
            log.warning(
                "tracedb: a reader held the database at close: %d of %d WAL frames of %s are in the "
                "file itself; the rest stay in its -wal until the next checkpoint", copied, frames,
                self.config.sqlite_path,
            )

    def _check_recording(self, what: str) -> None:
        if self._closed:
            raise StoreClosedError()
        failed = self._wal.failed
        if failed is not None:
            raise RecordingFailedError(str(failed.message), hint=failed.hint)

    def _check_sync(self, what: str) -> None:
        self._check_recording(what)
        if running_loop() is not None:
            raise UsageError(
                f"Store.{what}() waits for an fsync and was called inside a running event loop",
                hint=f"use `astore = await tracedb.open_async(...)` and `await astore.{what}(...)`",
            )

    # -- the WAL -------------------------------------------------------------------------
    def _append(self, data: bytes, hint=None) -> int:
        try:
            lsn = self._wal.append(data, hint)
        except _WAL_REFUSALS as e:
            raise _refusal(e) from None
        self.note_append()
        return lsn

    def append_future(self, payloads: list[bytes], loop, hints=None) -> asyncio.Future:
        """Queue records on the WAL's group commit; the future (of `loop`) resolves to their LSNs
        once they are durable."""
        try:
            return self._wal.append_future(payloads, loop, hints)
        except _WAL_REFUSALS as e:
            raise _refusal(e) from None

    def append_one_future(self, data: bytes, loop, hint=None) -> asyncio.Future:
        """Queue one record on the group commit; the future (of `loop`) resolves to its LSN once
        it is durable. The WAL writes the record even if the future is cancelled."""
        try:
            return self._wal.append_one_future(data, loop, hint)
        except _WAL_REFUSALS as e:
            raise _refusal(e) from None

    def append_staged(self, batch: StagedBatch, loop) -> Optional[asyncio.Future]:
        """Append a batch's records with one WAL call; the future (of `loop`) resolves to their
        LSNs once they are durable. None for an empty batch."""
        if not batch.payloads:
            return None
        fut = self.append_future(batch.payloads, loop, batch.hints or None)
        if batch.closing:

            def settle(f: asyncio.Future) -> None:
                if not f.cancelled() and f.exception() is None:
                    batch.settle(f.result())

            fut.add_done_callback(settle)
        if not self._wake.is_set():  # Event.set() takes a lock even when already set
            self.note_append()
        return fut

    def note_append(self) -> None:
        """Wake the compactor when a batch's worth of records waits."""
        if self._wal.durable_lsn - self.applied_lsn >= self.config.compact_batch_records:
            self._wake.set()

    # -- numbering and closing executions: one implementation for every path -----------------
    def _held(self, execution_id: Any, expected_seq: Optional[int] = None) -> ExecutionState:
        """The state of an execution held in memory, or StageMiss."""
        if not isinstance(execution_id, str):
            raise InvalidInputError(f"execution_id must be a string, not {type(execution_id).__name__}")
        state = self._executions.get(execution_id)
        if state is None:
            raise StageMiss(execution_id, None)
        if expected_seq is not None and expected_seq != state.next_seq:
            raise StageMiss(execution_id, state.next_seq)
        return state

    def not_held_error(self, execution_id: str) -> Exception:
        """Blocking: the error for an execution not held in memory (closed, or unknown)."""
        status = reads.trace_status(self._read_engine, execution_id)
        if status is None:
            return ExecutionNotFoundError(execution_id)
        return ExecutionClosedError(execution_id, status)

    @staticmethod
    def _check_open(state: ExecutionState) -> None:
        if state.status != STATUS_RUNNING:
            raise ExecutionClosedError(state.execution_id, state.status)

    @staticmethod
    def _close(sink, state: ExecutionState, data: bytes, status: Optional[str], now: int) -> None:
        """Hand over a closing record of `state` (its lock held); the state stays in memory until
        that record is applied to the database."""
        state.last_lsn = PENDING_LSN
        lsn = sink.put(data, None, state, True)
        if lsn is not None:
            state.last_lsn = lsn
        if status is not None:
            state.status = status
        state.last_activity_ns = now

    def reserve_start(
        self, intent, envelope, execution_id=None, parent_execution_id=None, forked_at_seq=None,
        created_at_ns=None, *, meta: Optional[dict] = None,
    ) -> StagedStart:
        """Validate a start and reserve its id (ExecutionExistsError if it is held in memory).

        Then, off the event loop, `check_new_in_db` (it queries the database); then `stage_start`,
        or `cancel_start` if anything failed. `created_at_ns` (ns since the epoch) is for importing
        executions recorded elsewhere: their original creation time; None is now. `meta` (a JSON
        object) goes into the trace's `meta` column beside what redaction puts there.

        The envelope hash is taken before redaction: replay with the original envelope verifies.
        """
        self._check_recording("start")
        validate_intent(intent)
        if type(envelope) is not dict and not isinstance(envelope, Mapping):
            raise InvalidInputError(f"envelope must be a dict, not {type(envelope).__name__}")
        envelope = dict(envelope)
        explicit = execution_id is not None
        if explicit:
            validate_id(execution_id, "execution_id")
        else:
            execution_id = new_execution_id()
        if parent_execution_id is not None:
            # The parent may be an execution recorded under the looser id rule of earlier versions.
            validate_id_ref(parent_execution_id, "parent_execution_id")
        validate_meta(meta)
        if forked_at_seq is not None:
            if parent_execution_id is None:
                raise InvalidInputError("forked_at_seq needs a parent_execution_id")
            if not isinstance(forked_at_seq, int) or isinstance(forked_at_seq, bool) or forked_at_seq < 0:
                raise InvalidInputError(f"forked_at_seq must be an int >= 0, got {forked_at_seq!r}")
        if created_at_ns is not None and (
            not isinstance(created_at_ns, int) or isinstance(created_at_ns, bool)
            or not 0 < created_at_ns < 1 << 63
        ):
            raise InvalidInputError(
                f"created_at_ns must be a positive int below 2**63 (ns since the epoch), got {created_at_ns!r}"
            )
        try:
            envelope_hash = compute_envelope_hash(envelope)
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"envelope cannot be hashed: {e}") from None
        rules = self._redactor.for_intent(intent) if self._redactor is not None else None
        if rules is not None and rules.might_match(envelope):
            stored, changed = redact(envelope, rules)
            if changed:
                # verify checks the stored envelope against this hash; the caller's stays the
                # execution's envelope hash.
                meta = dict(meta or {})
                meta["redaction"] = {"envelopeHash": compute_envelope_hash(stored)}
                envelope = stored
        now = self.clock()
        # An imported execution keeps its original creation time (retention counts from it).
        data = check_record_size(encode_start(
            execution_id, intent, envelope, envelope_hash, now if created_at_ns is None else created_at_ns,
            parent_execution_id, forked_at_seq, meta,
        ))
        if not self.config.enabled:
            self._disabled_seqs[execution_id] = 1
            return StagedStart(execution_id, envelope_hash, None, None, explicit, parent_execution_id, forked_at_seq)
        state = self._executions.reserve(execution_id, now)
        if state is None:
            raise ExecutionExistsError(execution_id)
        state.rules = rules
        return StagedStart(execution_id, envelope_hash, data, state, explicit, parent_execution_id, forked_at_seq)

    def check_new_in_db(self, start: StagedStart) -> None:
        """Blocking: refuse an explicit id the database already holds, a missing parent, or a fork
        point past the parent's events."""
        if start.state is None:
            return
        if start.explicit and reads.trace_status(self._read_engine, start.execution_id) is not None:
            raise ExecutionExistsError(start.execution_id)
        parent = start.parent_execution_id
        if parent is None:
            return
        held = self._executions.get(parent)
        if held is not None:
            status, last_seq = held.status, held.next_seq - 1
        else:
            found = reads.trace_status_and_last_seq(self._read_engine, parent)
            if found is None:
                raise ExecutionNotFoundError(parent, hint="fork from an execution that exists")
            status, last_seq = found
        at = start.forked_at_seq
        # A fork point is one of the parent's events (`tracedb fork` checks more: not at or
        # after a final response, and an event that exists).
        if at is not None and at > last_seq:
            raise InvalidInputError(
                f"cannot fork {parent!r} at seq {at}: its last event is seq {last_seq} ({status})",
                hint="fork at the seq of one of its events (`tracedb trace get ID` lists them)",
            )

    def stage_start(self, sink, start: StagedStart) -> None:
        """Hand a reserved start to `sink`; events may be staged behind it at once."""
        state = start.state
        if state is None:
            return
        with state.lock:
            lsn = sink.put(start.data, None, state, False)
            if lsn is not None:
                state.last_lsn = lsn
            state.status = STATUS_RUNNING

    def cancel_start(self, start: StagedStart) -> None:
        """Release a reservation that was not staged (no-op once it was)."""
        if start.state is not None:
            self._executions.unreserve(start.state)

    def stage_event(self, sink, execution_id: str, type_: str, payload: Any, expected_seq: Optional[int] = None) -> int:
        """Check and number one event, handing its WAL record to `sink`; returns its seq.

        Raises StageMiss when the execution is not held in memory, or when `expected_seq` (the
        seq the caller expects the event to get) is not the execution's next seq: the caller
        resolves those off the hot path (a resend, a closed execution, an unknown id).
        """
        if self._closed or self._wal.failed is not None:
            self._check_recording("event")
        if type_ == FINAL_RESPONSE:
            return self.stage_finish(sink, execution_id, payload, expected_seq)
        check_event_type(type_)
        if not self.config.enabled:
            return self._disabled_seq(execution_id)
        state = self._held(execution_id, expected_seq)
        with state.lock:
            self._check_open(state)
            seq = state.next_seq
            now = self.clock()
            data, hint = self._event_record(execution_id, seq, type_, payload, state.rules, now)
            sink.put(data, hint, state, False)
            state.next_seq = seq + 1
            state.last_activity_ns = now
        return seq

    def stage_finish(self, sink, execution_id: str, response: dict, expected_seq: Optional[int] = None) -> int:
        """Check and number the final response, handing it to `sink`, and close the execution as
        completed; returns its seq (StageMiss as for `stage_event`)."""
        self._check_recording("finish")
        response = validate_response(response)
        if not self.config.enabled:
            return self._disabled_seq(execution_id)
        state = self._held(execution_id, expected_seq)
        with state.lock:
            self._check_open(state)
            seq = state.next_seq
            now = self.clock()
            data = self._finish_record(execution_id, seq, response, state.rules, now)
            self._close(sink, state, data, STATUS_COMPLETED, now)
            state.next_seq = seq + 1
        return seq

    def _event_record(self, execution_id: str, seq: int, type_: str, payload: Any, rules: Optional[Rules], now: int):
        """An event's WAL record and compaction hint: payload checked, then redacted. The rules
        look at the payload as parsed back from its JSON: what is stored, the contents of any
        orjson.Fragment inside it included."""
        pj, parsed = payload_parsed(payload, type_)
        if rules is not None and rules.might_match(parsed):
            value, changed = redact(parsed, rules)
            if changed:
                pj = payload_json(value, type_)
                parsed = value
        data = encode_event(execution_id, seq, type_, pj, now)
        if len(data) > wal.MAX_PAYLOAD_BYTES:
            check_record_size(data)
        hint = EventFrame(execution_id, seq, type_, event_payload_offset(data, pj), now,
                          event_facts(type_, pj, parsed)) if self._hinting else None
        return data, hint

    @staticmethod
    def _finish_record(execution_id: str, seq: int, response: dict, rules: Optional[Rules], now: int) -> bytes:
        """The final response's WAL record: checked, then redacted."""
        data = check_record_size(encode_finish(execution_id, seq, response, now))
        if rules is not None and rules.might_match(response):
            response, changed = redact(response, rules)
            if changed:
                data = check_record_size(encode_finish(execution_id, seq, response, now))
        return data

    def redact_for(self, intent: Optional[str], value: Any) -> Any:
        """`value` as the store would record it for an execution of `intent` (redacted); for
        comparing a value sent again with the recorded one."""
        rules = self._redactor.for_intent(intent) if self._redactor is not None else None
        return value if rules is None else redact(value, rules)[0]

    def stage_status_change(self, sink, execution_id: str, op: str, text: str, *, held_only: bool = False) -> bool:
        """Hand an invalidation (OP_INVALIDATE) or a recording_failure flag to `sink`. Invalidating
        an invalidated execution is a no-op. An execution only the database knows is looked up
        there (blocking); with `held_only`, False is returned for it instead."""
        validate_text(text, STATUS_TEXT_KEY[op])
        self._check_recording(op)
        if not self.config.enabled:
            return True
        if not isinstance(execution_id, str):
            raise InvalidInputError(f"execution_id must be a string, not {type(execution_id).__name__}")
        state = self._executions.get(execution_id)
        if state is None:
            if held_only:
                return False
            status = reads.trace_status(self._read_engine, execution_id)
            if status is None:
                raise ExecutionNotFoundError(execution_id)
            if self._changes(op, execution_id, status):
                sink.put(check_record_size(encode_status(op, execution_id, text, self.clock())), None, None, False)
            return True
        with state.lock:
            if self._changes(op, execution_id, state.status):
                now = self.clock()
                data = check_record_size(encode_status(op, execution_id, text, now))
                self._close(sink, state, data, STATUS_INVALIDATED if op == OP_INVALIDATE else None, now)
        return True

    def stage_invalidate(self, sink, execution_id: str, reason: str) -> bool:
        """Hand an invalidation of an execution held in memory to `sink` (a no-op if it is
        invalidated already). False if only the database knows it: call `invalidate` off the loop."""
        return self.stage_status_change(sink, execution_id, OP_INVALIDATE, reason, held_only=True)

    @staticmethod
    def _changes(op: str, execution_id: str, status: str) -> bool:
        """Whether a status change applies: invalidating twice does nothing, and a recording
        failure is flagged on running, completed and incomplete executions (`FLAGGABLE_STATUSES`),
        never on an invalidated one."""
        if op == OP_INVALIDATE:
            return status != STATUS_INVALIDATED
        if status not in FLAGGABLE_STATUSES:
            raise ExecutionClosedError(execution_id, status)
        return True

    def stage_abandon(self, sink, execution_id: str, why: str) -> Optional[str]:
        """Mark a running execution held in memory incomplete now (its agent died), handing the
        record to `sink`: what recovery does after a crash, without waiting for the sweeper.

        Returns the status the execution had (incomplete already: nothing staged), or None if
        only the database knows it.
        """
        validate_text(why, "reason")
        self._check_recording("abandon")
        state = self._executions.get(execution_id)
        if state is None:
            return None
        status = state.status
        self._stage_incomplete(sink, state, why)
        return status

    def _stage_incomplete(self, sink, state: ExecutionState, why: str, idle_since_ns: Optional[int] = None) -> bool:
        with state.lock:
            if state.status != STATUS_RUNNING:
                return False
            if idle_since_ns is not None and state.last_activity_ns > idle_since_ns:
                # An event was numbered (maybe staged, not yet queued) since the sweep looked:
                # marking now could put the incomplete record before that event in the log.
                return False
            now = self.clock()
            data = encode_status(OP_INCOMPLETE, state.execution_id, why, now)
            self._close(sink, state, data, STATUS_INCOMPLETE, now)
            return True

    def _disabled_seq(self, execution_id: str) -> int:
        seq = self._disabled_seqs.get(execution_id)
        if seq is None:
            raise ExecutionNotFoundError(execution_id, hint="tracing is disabled (enabled = false)")
        self._disabled_seqs[execution_id] = seq + 1
        return seq

    # -- recording (sync) ----------------------------------------------------------------
    def start(
        self,
        intent: str,
        envelope: dict,
        execution_id: Optional[str] = None,
        *,
        parent_execution_id: Optional[str] = None,
        forked_at_seq: Optional[int] = None,
        created_at_ns: Optional[int] = None,
        meta: Optional[dict] = None,
    ) -> Execution:
        """Start an execution; returns once its start record is durable in the WAL.

        `created_at_ns` (ns since the epoch) is for importing executions recorded elsewhere:
        their original creation time; None is now. `meta`: a JSON object kept in the trace's
        `meta` column (an importer's notes on the original record).
        """
        self._check_sync("start")
        start = self.reserve_start(
            intent, envelope, execution_id, parent_execution_id, forked_at_seq, created_at_ns, meta=meta
        )
        try:
            self.check_new_in_db(start)
            self.stage_start(self._appender, start)
        finally:
            self.cancel_start(start)
        return Execution(self, start.execution_id, start.envelope_hash)

    def record_execution(
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
    ) -> Execution:
        """Record a whole execution at once (an import): every record is checked, redacted and
        encoded before the first is appended, so a refusal writes nothing and the same call can
        be made again once the input is fixed; then all of them go to the WAL in one append.

        `events`: (type, payload) pairs, numbered 1, 2, ...; `response`: the final response, or
        None to leave the execution running (or to close it with `closing`); `closing`: (op,
        text) status changes after the events and the response, op one of "invalidate",
        "incomplete", "recording_failure" (as `invalidate`, `abandon`, `mark_recording_failure`).
        `recorded_at_ns`: the time (ns since the epoch) each event, then the final response, was
        recorded elsewhere, kept as their recorded times; None is now.
        """
        self._check_sync("record_execution")
        events = tuple(events)
        times = _given_times(recorded_at_ns, len(events) + (response is not None))
        start = self.reserve_start(
            intent, envelope, execution_id, None, None, created_at_ns, meta=meta,
        )
        try:
            self.check_new_in_db(start)
            state = start.state
            if state is None:  # recording disabled
                return Execution(self, start.execution_id, start.envelope_hash)
            eid = start.execution_id
            now = self.clock()
            payloads = [start.data]
            hints: dict = {}
            status = STATUS_RUNNING
            seq = 0
            for seq, item in enumerate(events, start=1):
                type_, payload = item
                if type_ == FINAL_RESPONSE:
                    raise InvalidInputError(
                        f"event {seq} is FINAL_RESPONSE", hint="pass the final response as `response`"
                    )
                validate_event_type(type_)
                data, hint = self._event_record(eid, seq, type_, payload, state.rules, times[seq - 1] if times else now)
                if hint is not None:
                    hints[len(payloads)] = hint
                payloads.append(data)
            if response is not None:
                seq += 1
                response = validate_response(response)
                payloads.append(self._finish_record(eid, seq, response, state.rules, times[-1] if times else now))
                status = STATUS_COMPLETED
            for op, text in closing:
                if op not in STATUS_TEXT_KEY:
                    raise InvalidInputError(f"unknown status change {op!r}")
                validate_text(text, STATUS_TEXT_KEY[op])
                if op == OP_INCOMPLETE and status != STATUS_RUNNING:
                    raise InvalidInputError("only a running execution can be marked incomplete")
                if op == OP_RECORDING_FAILURE:
                    self._changes(op, eid, status)
                payloads.append(check_record_size(encode_status(op, eid, text, now)))
                if op == OP_INVALIDATE:
                    status = STATUS_INVALIDATED
                elif op == OP_INCOMPLETE:
                    status = STATUS_INCOMPLETE
            with state.lock:
                try:
                    lsns = self._wal.append_many(payloads, hints or None)
                except _WAL_REFUSALS as e:
                    raise _refusal(e) from None
                state.next_seq = seq + 1
                state.last_activity_ns = now
                state.last_lsn = lsns[-1]
                state.status = status
            self.note_append()
        finally:
            self.cancel_start(start)
        return Execution(self, eid, start.envelope_hash)

    def event(self, execution_id: str, type: str, payload: Any = None) -> int:
        """Record one event; returns its seq once it is durable in the WAL.

        A FINAL_RESPONSE event is the same as `finish(execution_id, payload)`.
        """
        self._check_sync("event")
        return self._record_now(self.stage_event, execution_id, type, payload)

    def finish(self, execution_id: str, response: dict) -> int:
        """Record FINAL_RESPONSE with `response` and close the execution as completed; returns its seq."""
        self._check_sync("finish")
        return self._record_now(self.stage_finish, execution_id, response)

    def _record_now(self, stage: Callable[..., int], execution_id: str, *args) -> int:
        try:
            return stage(self._appender, execution_id, *args)
        except StageMiss:
            raise self.not_held_error(execution_id) from None

    def invalidate(self, execution_id: str, reason: str) -> None:
        """Mark an execution invalidated, not replayable (manually_invalidated); durable in the WAL.

        Works on running and closed executions; invalidating twice is a no-op.
        """
        self._check_sync("invalidate")
        self.stage_status_change(self._appender, execution_id, OP_INVALIDATE, reason)

    def mark_recording_failure(self, execution_id: str, detail: str) -> None:
        """Flag an execution not replayable because its recording is known to be incomplete
        (recording_failure). Its status does not change."""
        self._check_sync("mark_recording_failure")
        self.stage_status_change(self._appender, execution_id, OP_RECORDING_FAILURE, detail)

    def abandon(self, execution_id: str, why: str) -> str:
        """Mark a running execution incomplete now because its agent died; returns the status it
        had (ExecutionNotFoundError if unknown). Durable when it returns."""
        self._check_sync("abandon")
        status = self.stage_abandon(self._appender, execution_id, why)
        if status is None:
            status = reads.trace_status(self._read_engine, execution_id)
            if status is None:
                raise ExecutionNotFoundError(execution_id)
        return status

    def _open_states(self) -> list[ExecutionState]:
        return self._executions.with_status(STATUS_RUNNING)

    def _mark_incomplete(self, states: list[ExecutionState], why: str, idle_since_ns: Optional[int] = None) -> int:
        return sum(self._stage_incomplete(self._appender, s, why, idle_since_ns) for s in states)

    def sweep_idle(self, now_ns: Optional[int] = None) -> int:
        """Mark executions with no event for `idle_timeout_s` incomplete; returns how many.

        The background thread calls it; tests call it with a fake clock.
        """
        idle_s = self.config.idle_timeout_s
        if idle_s <= 0 or self._closed:
            return 0
        now = self.clock() if now_ns is None else now_ns
        limit = now - int(idle_s * 1e9)
        idle = [s for s in self._open_states() if s.last_activity_ns <= limit]
        if not idle:
            return 0
        return self._mark_incomplete(idle, "idle", idle_since_ns=limit)

    # -- compaction ----------------------------------------------------------------------
    def _compact_locked(self, progress=None) -> CompactResult:
        if self._worker is not None:
            from .compactor_worker import WorkerGoneError

            try:
                result = self._worker.compact(self._wal.durable_lsn)
            except WorkerGoneError as e:
                log.error("tracedb: %s; compacting in-process from now on", e)
                self._stop_worker()
            else:
                self._compactor.adopt(result.applied_lsn)
                self._forget_applied(result.applied_lsn)
                deleted = self._compactor.release_wal(self._wal.mark_applied)
                return dataclasses.replace(result, segments_deleted=result.segments_deleted + deleted)
        result = self._compactor.compact(
            self._wal.durable_lsn,
            mark_applied=self._wal.mark_applied,
            progress=progress,
            on_batch=self._forget_applied,
        )
        return result

    def _stop_worker(self) -> None:
        worker, self._worker = self._worker, None
        self._keep_records_in_memory(True)
        if worker is not None:
            worker.close()
            # It may have applied a batch it could not report: read the checkpoint back.
            self._compactor.adopt(db.ensure_checkpoint(self._engine, self.recorder_id, self.clock()))

    def _forget_applied(self, applied_lsn: int) -> None:
        self._executions.forget_applied(applied_lsn)

    def compact(self, *, progress: Optional[Callable[[int, int], None]] = None) -> CompactResult:
        """Apply every durable WAL record to the database now; delete WAL segments it no longer needs."""
        if self._closed:
            raise StoreClosedError()
        with self._compact_lock:
            if self._closed:  # close() compacted last and is releasing everything
                raise StoreClosedError()
            return self._compact_locked(progress)

    def _refresh(self) -> None:
        if not self._closed and self._wal.durable_lsn > self.applied_lsn:
            self.compact()

    def _sync_external(self) -> int:
        """Close in memory the executions an operator invalidated directly in the database."""
        open_ids = [s.execution_id for s in self._open_states()]
        if not open_ids:
            return 0
        with self._compact_lock:
            if not self._compactor.external_change():
                return 0
        closed = 0
        with self._read_engine.connect() as conn:
            for i in range(0, len(open_ids), 500):
                chunk = open_ids[i : i + 500]
                ids = conn.execute(
                    sa.select(traces.c.execution_id)
                    .where(traces.c.execution_id.in_(chunk))
                    .where(traces.c.status == STATUS_INVALIDATED)
                ).scalars().all()
                for eid in ids:
                    state = self._executions.get(eid)
                    if state is None:
                        continue
                    with state.lock:
                        if state.status == STATUS_RUNNING:
                            state.status = STATUS_INVALIDATED
                            closed += 1
        return closed

    def _background(self) -> None:
        try:
            self._background_loop()
        finally:
            # A child started from this thread dies with it (PR_SET_PDEATHSIG): end it first,
            # between two compactions, rather than have it killed.
            if self._worker is not None:
                with self._compact_lock:
                    self._stop_worker()

    def _background_loop(self) -> None:
        mode = self.config.worker_mode
        if mode == "process" and self._worker is None:
            # From this thread, which lives as long as the store: on Linux the child is tied to
            # the thread that started it (PR_SET_PDEATHSIG).
            self._start_worker()
        interval = self.config.compact_interval_ms / 1000.0 if self.config.compact_interval_ms > 0 else None
        rate = None
        if mode == "auto" and interval is not None and _cores() >= 2:
            from .compactor_worker import interpreter_runs_python

            rate = _RateWatch() if interpreter_runs_python() else None
        idle_s = self.config.idle_timeout_s
        sweep_every_s = min(60.0, idle_s / 10) if idle_s > 0 else None
        next_sweep = time.monotonic() + (sweep_every_s or 0)
        period = interval if interval is not None else sweep_every_s
        retry = Backoff(first_s=2 * (period or 1.0), max_s=5.0)
        failures = 0
        while not self._stop.is_set():
            wait = retry.next_delay() if failures else period
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if interval is not None:
                    if rate is not None and rate.reached(self._wal.durable_lsn):
                        rate = None
                        self._start_worker()  # compacts in-process again if it cannot start
                    self._refresh()
                    self._sync_external()
                if sweep_every_s is not None and time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + sweep_every_s
                    self.sweep_idle()
                failures = 0
                retry.reset()
                self.background_error = None
            except StoreClosedError:
                return
            except Exception as e:  # noqa: BLE001 - keep recording; report, back off, retry
                failures += 1
                self.background_error = e
                log.error("tracedb background compaction failed (attempt %d): %s", failures, e)

    # -- reading -------------------------------------------------------------------------
    def get(self, execution_id: str) -> ExecutionRecord:
        """The execution's whole record, including events not yet compacted."""
        self._refresh()
        return self._records.read(execution_id)

    def list(
        self,
        status: Optional[str] = None,
        since=None,
        until=None,
        limit: Optional[int] = None,
    ) -> list[TraceSummary]:
        """Executions by creation time; `since`/`until` are aware datetimes or epoch seconds."""
        self._refresh()
        return reads.list_traces(self._read_engine, status=status, since=since, until=until, limit=limit)

    def recover(self, *, progress: Optional[Callable[[int, int], None]] = None) -> RecoverResult:
        """Compact, then mark incomplete every running execution that this store is not recording."""
        if self._closed:
            raise StoreClosedError()
        return self._recover(progress=progress)

    def _recover(self, *, at_open: bool = False, progress=None) -> RecoverResult:
        with self._compact_lock:
            kept = recovery.keep_damaged_segments(self.config.wal_dir, self.applied_lsn)
            result = recovery.recover(
                compact=self._compact_locked,
                engine=self._read_engine,
                recorder_id=self.recorder_id,
                recording={s.execution_id for s in self._open_states()},
                append_many=self._wal.append_many,
                now_ns=self.clock(),
                why="recovery" if at_open else "recover",
                progress=progress,
            )
        if kept:
            result = dataclasses.replace(result, kept_copies=kept)
        if at_open:
            result = dataclasses.replace(result, wal_truncated_bytes=self._wal.open_result.truncated_bytes)
        return result

    def prune(
        self,
        older_than_s: Optional[float] = None,
        dry_run: bool = False,
        *,
        progress: Optional[Callable[[int, int], None]] = None,
    ) -> PruneResult:
        """Delete terminal traces created more than `older_than_s` ago (default: retention_days)."""
        if self._closed:
            raise StoreClosedError()
        self._refresh()
        if older_than_s is None:
            older_than_s = self.config.retention_days * 86400.0
        return retention.prune(
            self._engine, older_than_s, now_ns=self.clock(), dry_run=dry_run,
            batch_traces=self.config.prune_batch_traces, progress=progress,
            # Forks started from now on (other threads) are in the WAL before the database.
            outside_parents=retention.UncompactedForks(self.config.wal_dir, self.applied_lsn),
        )

    def pin(self, execution_id: str) -> None:
        """Keep a trace forever: prune skips pinned traces."""
        self._refresh()
        retention.set_pinned(self._engine, execution_id, True)

    def unpin(self, execution_id: str) -> None:
        """Let prune delete the trace again once it is old enough."""
        self._refresh()
        retention.set_pinned(self._engine, execution_id, False)

    def verify(self, execution_id: Optional[str] = None) -> VerifyResult:
        """Check envelope hashes, event order and the database's integrity."""
        self._refresh()
        return _verify(self._read_engine, execution_id)



    # -- what the sidecar asks on its hot path ----------------------------------------------
    def next_seq(self, execution_id: str) -> Optional[int]:
        """The seq the next event of an execution held in memory gets; None if only the database
        knows the execution (closed and compacted, or never seen)."""
        state = self._executions.get(execution_id)
        return None if state is None else state.next_seq

    def status_of(self, execution_id: str) -> Optional[str]:
        """An execution's status, from memory or else the database (blocking); None if unknown."""
        state = self._executions.get(execution_id)
        if state is not None:
            return state.status
        return reads.trace_status(self._read_engine, execution_id)

    @property
    def open_executions(self) -> int:
        """How many executions are recording (status running)."""
        return self._executions.count(STATUS_RUNNING)


def open_store(data_dir=None, *, config=None, clock: Optional[Callable[[], int]] = None) -> Store:
    """Open (creating if needed) the data directory for recording; runs recovery first."""
    return Store(as_config(config, data_dir), clock=clock)


def _given_times(times, n: int) -> Optional[tuple]:
    """`record_execution`'s `recorded_at_ns`, checked: one time per record it names, or None."""
    if times is None:
        return None
    times = tuple(times)
    if len(times) != n:
        raise InvalidInputError(f"recorded_at_ns has {len(times)} times for {n} events and final response")
    for t in times:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 < t < 1 << 63:
            raise InvalidInputError(f"recorded_at_ns: a time must be a positive int below 2**63 (ns since the epoch), got {t!r}")
    return times
