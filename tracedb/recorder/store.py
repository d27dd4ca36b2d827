"""The embedded store: record executions durably, read them back, keep the projection fresh.

`Store` is the front users call (`tracedb.open`); it owns the data directory, the WAL and the
database engines, and hands each job to the object that does it:

- numbering and closing executions, for every recording path: `store.staging`
  (`tracedb.recorder.staging.Staging`). The sync calls here append each record at once and return once it
  is fdatasynced; the asyncio API (`tracedb.recorder.store_async`), the sidecar and the OTLP ingest call the
  staging object themselves.
- compaction, in a background thread or a child process, and the idle sweep: `store.scheduler`
  (`tracedb.recorder.scheduler.CompactionScheduler`). Reads compact what is durable first, so a
  just-recorded event is seen.
- reads and maintenance: `tracedb.reads.reader`, `tracedb.maintenance.recovery`, `tracedb.maintenance.retention`,
  `tracedb.maintenance.verify`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
import stat
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Optional

import wal
from wal.futures import running_loop

from tracedb.projection import db
from tracedb.recorder import handles
from tracedb.reads import reader as reads
from tracedb.maintenance import retention
from tracedb.records.codec import OP_INVALIDATE, OP_RECORDING_FAILURE
from tracedb.projection.compactor import CompactResult, Compactor
from tracedb.config import Config, as_config
from tracedb.errors import ExecutionNotFoundError, IntegrityError, StoreClosedError, StoreInUseError, UsageError
from tracedb.records.record import ExecutionRecord
from tracedb.maintenance.recovery import RecoverResult
from tracedb.maintenance.retention import PruneResult
from tracedb.recorder.scheduler import CompactionScheduler
from tracedb.recorder.staging import Staging
from tracedb.recorder.state import StageMiss
from tracedb.maintenance.verify import VerifyResult, verify as _verify

if TYPE_CHECKING:
    from tracedb.reads.rows import TraceSummary

log = logging.getLogger(__name__)

RECORDER_ID_FILE = "RECORDER_ID"
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


class Execution(handles.Execution):
    """One execution being recorded in the embedded store: `event()`, then `finish()`."""

    @property
    def store(self) -> "Store":
        """The store it records into."""
        return self.recorder


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
        self._engine = self._read_engine = None
        self._records: Optional[reads.RecordReader] = None
        self.staging: Optional[Staging] = None  # numbering and closing executions
        self.scheduler: Optional[CompactionScheduler] = None  # compaction and the idle sweep
        redactor = config.redactor()
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
            applied = self._open_database()
            self.staging = Staging(config, self._wal, self.clock, self._read_engine, redactor)
            self.scheduler = CompactionScheduler(
                config, self._wal, self.staging,
                Compactor(
                    self._engine, config.wal_dir, self.recorder_id, applied,
                    batch_records=config.compact_batch_records, clock=self.clock,
                    source=self._wal.take_retained,
                ),
                engine=self._engine, read_engine=self._read_engine, recorder_id=self.recorder_id, clock=self.clock,
            )
            self.staging.note_append = self.scheduler.note_append
            recovered = self.scheduler.recover("recovery", recovery_progress)
            self.last_recovery: RecoverResult = dataclasses.replace(
                recovered, wal_truncated_bytes=self._wal.open_result.truncated_bytes
            )
        except BaseException:
            self._shutdown_resources()
            raise
        self.scheduler.start()

    def _open_database(self) -> int:
        """Open the engines, migrate, and check the database against the WAL; returns the
        applied LSN of the checkpoint."""
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
        return applied

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
        return self.scheduler.applied_lsn if self.scheduler else 0

    @property
    def durable_lsn(self) -> int:
        """The last WAL LSN acknowledged as durable."""
        return self._wal.durable_lsn

    @property
    def redactor(self):
        """The `tracedb.records.redaction.Redactor` every record passes through, or None (off)."""
        return self.staging.redactor

    def redact_for(self, intent: Optional[str], value: Any) -> Any:
        """`value` as the store would record it for an execution of `intent` (redacted); for
        comparing a value sent again with the recorded one."""
        return self.staging.redact_for(intent, value)

    @property
    def wal(self) -> "wal.Wal":
        """The write-ahead log this store appends to (for its stats and its event-loop flush)."""
        return self._wal

    @property
    def background_error(self) -> Optional[BaseException]:
        """The background compaction's last failure; None once a round succeeds."""
        return self.scheduler.background_error if self.scheduler else None

    def close(self) -> None:
        """Mark executions still running incomplete, compact everything, release the data dir.

        Safe to call twice. After close the store refuses every call.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = self.staging.closed = True
        scheduler = self.scheduler
        scheduler.stop()
        try:
            with scheduler.lock:
                scheduler.stop_worker()  # the last compaction below runs here, alone
            if self._wal.failed is None:
                # Nobody can record into them once this process lets go of the WAL.
                self.staging.mark_incomplete(self.staging.open_states(), "recorder_closed")
                with scheduler.lock:
                    scheduler.compact_locked()
        finally:
            self._shutdown_resources(checkpoint=True)

    def _shutdown_resources(self, *, checkpoint: bool = False) -> None:
        self._closed = True
        if self.staging is not None:
            self.staging.closed = True
        if self.scheduler is not None:
            self.scheduler.close()
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

    def _check_sync(self, what: str) -> None:
        self.staging.check_recording(what)
        if running_loop() is not None:
            raise UsageError(
                f"Store.{what}() waits for an fsync and was called inside a running event loop",
                hint=f"use `astore = await tracedb.open_async(...)` and `await astore.{what}(...)`",
            )

    # -- recording (sync): each record appended and fdatasynced before the call returns -----
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
        staging = self.staging
        start = staging.reserve_start(
            intent, envelope, execution_id, parent_execution_id, forked_at_seq, created_at_ns, meta=meta
        )
        try:
            staging.check_new_in_db(start)
            staging.stage_start(staging.appender, start)
        finally:
            staging.cancel_start(start)
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
        start = self.staging.record_whole(
            intent, envelope, execution_id, events=events, response=response, closing=closing,
            created_at_ns=created_at_ns, meta=meta, recorded_at_ns=recorded_at_ns,
        )
        return Execution(self, start.execution_id, start.envelope_hash)

    def event(self, execution_id: str, type: str, payload: Any = None) -> int:
        """Record one event; returns its seq once it is durable in the WAL.

        A FINAL_RESPONSE event is the same as `finish(execution_id, payload)`.
        """
        self._check_sync("event")
        return self._record_now(self.staging.stage_event, execution_id, type, payload)

    def finish(self, execution_id: str, response: dict) -> int:
        """Record FINAL_RESPONSE with `response` and close the execution as completed; returns its seq."""
        self._check_sync("finish")
        return self._record_now(self.staging.stage_finish, execution_id, response)

    def _record_now(self, stage: Callable[..., int], execution_id: str, *args) -> int:
        try:
            return stage(self.staging.appender, execution_id, *args)
        except StageMiss:
            raise self.staging.not_held_error(execution_id) from None

    def invalidate(self, execution_id: str, reason: str) -> None:
        """Mark an execution invalidated, not replayable (manually_invalidated); durable in the WAL.

        Works on running and closed executions; invalidating twice is a no-op.
        """
        self._check_sync("invalidate")
        self.staging.stage_status_change(self.staging.appender, execution_id, OP_INVALIDATE, reason)

    def mark_recording_failure(self, execution_id: str, detail: str) -> None:
        """Flag an execution not replayable because its recording is known to be incomplete
        (recording_failure). Its status does not change."""
        self._check_sync("mark_recording_failure")
        self.staging.stage_status_change(self.staging.appender, execution_id, OP_RECORDING_FAILURE, detail)

    def abandon(self, execution_id: str, why: str) -> str:
        """Mark a running execution incomplete now because its agent died; returns the status it
        had (ExecutionNotFoundError if unknown). Durable when it returns."""
        self._check_sync("abandon")
        status = self.staging.stage_abandon(self.staging.appender, execution_id, why)
        if status is None:
            status = reads.trace_status(self._read_engine, execution_id)
            if status is None:
                raise ExecutionNotFoundError(execution_id)
        return status

    def sweep_idle(self, now_ns: Optional[int] = None) -> int:
        """Mark executions with no event for `idle_timeout_s` incomplete; returns how many.

        The background thread calls it; tests call it with a fake clock.
        """
        return self.staging.sweep_idle(now_ns)

    # -- compaction, reading and maintenance ---------------------------------------------
    def compact(self, *, progress: Optional[Callable[[int, int], None]] = None) -> CompactResult:
        """Apply every durable WAL record to the database now; delete WAL segments it no longer needs."""
        return self.scheduler.compact(progress)

    def get(self, execution_id: str) -> ExecutionRecord:
        """The execution's whole record, including events not yet compacted."""
        self.scheduler.refresh()
        return self._records.read(execution_id)

    def list(
        self,
        status: Optional[str] = None,
        since=None,
        until=None,
        limit: Optional[int] = None,
    ) -> list[TraceSummary]:
        """Executions by creation time; `since`/`until` are aware datetimes or epoch seconds."""
        self.scheduler.refresh()
        return reads.list_traces(self._read_engine, status=status, since=since, until=until, limit=limit)

    def recover(self, *, progress: Optional[Callable[[int, int], None]] = None) -> RecoverResult:
        """Compact, then mark incomplete every running execution that this store is not recording."""
        if self._closed:
            raise StoreClosedError()
        return self.scheduler.recover("recover", progress)

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
        self.scheduler.refresh()
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
        self.scheduler.refresh()
        retention.set_pinned(self._engine, execution_id, True)

    def unpin(self, execution_id: str) -> None:
        """Let prune delete the trace again once it is old enough."""
        self.scheduler.refresh()
        retention.set_pinned(self._engine, execution_id, False)

    def verify(self, execution_id: Optional[str] = None) -> VerifyResult:
        """Check envelope hashes, event order and the database's integrity."""
        self.scheduler.refresh()
        return _verify(self._read_engine, execution_id)


def open_store(data_dir=None, *, config=None, clock: Optional[Callable[[], int]] = None) -> Store:
    """Open (creating if needed) the data directory for recording; runs recovery first."""
    return Store(as_config(config, data_dir), clock=clock)


