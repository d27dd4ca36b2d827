"""The embedded trace store: record executions durably, read them back, keep the projection fresh.

Recording path: validate in memory (no database query), give the event its seq under the
execution's lock, append one orjson document to the WAL, return once it is fdatasynced. Holding
the execution's lock across the append makes seq order equal LSN order for each execution, while
appends of different executions share the WAL's group commit.

The store keeps a map of the executions it is recording (status, next seq). Closed executions stay
in it until the compactor has applied their last record, so a closed execution is refused without a
database query, and an explicit id is never started twice.

A background thread compacts the WAL into SQLite every `compact_interval_ms` (sooner when a batch
is waiting), notices traces invalidated from the CLI, and marks executions idle for
`idle_timeout_s` incomplete. Reads compact what is durable first, so a just-recorded event is seen.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable, Mapping, Optional

import orjson
import sqlalchemy as sa

import wal

from . import db, queries, recovery, retention
from .compactor import (
    OP_FINISH,
    OP_INCOMPLETE,
    OP_INVALIDATE,
    OP_RECORDING_FAILURE,
    OP_START,
    CompactResult,
    Compactor,
    encode_event,
)
from .config import Config, as_config
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
from .models import ID_LENGTH, TYPE_LENGTH, traces
from .record import (
    FINAL_RESPONSE,
    SEED_002_EVENT_TYPES,
    SEED_004_EVENT_TYPES,
    STATUS_COMPLETED,
    STATUS_INCOMPLETE,
    STATUS_INVALIDATED,
    STATUS_RUNNING,
    ExecutionRecord,
    TraceSummary,
    compute_envelope_hash,
)
from .recovery import RecoverResult
from .retention import PruneResult
from .verify import VerifyResult, verify as _verify

log = logging.getLogger(__name__)

RECORDER_ID_FILE = "RECORDER_ID"
_STARTING = "starting"
# In-process compaction keeps this many batches (compact_batch_records) of just-appended records
# in memory for the compactor (see Store._keep_records_in_memory).
RETAIN_BATCHES = 8
_PENDING_LSN = sys.maxsize  # a closing record enqueued, its LSN not yet durable
_NAMESPACED_TYPE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)+$")
_ID = re.compile(r"^[\x21-\x7e]+$")
_DUMP_OPTS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
# The envelope is hashed with json.dumps(default=str) (seed 000); store it the same way so that
# `verify` recomputes the same hash from the stored envelope.
_ENVELOPE_OPTS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_NON_STR_KEYS


class _State:
    """An execution this store is recording (or closed, until its last record is compacted)."""

    __slots__ = ("execution_id", "status", "next_seq", "last_activity_ns", "last_lsn", "lock", "start_fut")

    def __init__(self, execution_id: str, now_ns: int):
        self.execution_id = execution_id
        self.status = _STARTING
        self.next_seq = 1
        self.last_activity_ns = now_ns
        self.last_lsn = 0
        self.lock = threading.Lock()
        self.start_fut = None  # the queued start record of an asyncio start, until durable


async def _when_durable(fut: "asyncio.Future", on_lsn, on_failure=None) -> int:
    """Wait for a queued WAL record; `on_lsn(lsn)` runs when it is durable, even if the waiting
    task is cancelled meanwhile (the wait is shielded: cancelling the caller never cancels the
    record, which the WAL writes anyway). `on_failure()` runs if the WAL failed instead."""

    def done(f: "asyncio.Future") -> None:
        if not f.cancelled() and f.exception() is None:
            on_lsn(f.result()[0])
        elif on_failure is not None:
            on_failure()

    fut.add_done_callback(done)
    (lsn,) = await asyncio.shield(fut)
    return lsn


def _in_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def validate_event_type(type_: Any) -> str:
    """Seed 002's types, seed 004's, or any namespaced type ("myapp.cache.hit")."""
    if not isinstance(type_, str):
        raise InvalidInputError(f"event type must be a string, not {type(type_).__name__}")
    if type_ in SEED_002_EVENT_TYPES or type_ in SEED_004_EVENT_TYPES:
        return type_
    if len(type_) <= TYPE_LENGTH and _NAMESPACED_TYPE.match(type_):
        return type_
    raise InvalidInputError(
        f"unknown event type {type_!r}",
        hint="use one of " + ", ".join(sorted(SEED_002_EVENT_TYPES | SEED_004_EVENT_TYPES))
        + ", or a namespaced type such as 'myapp.cache.hit'",
    )


def _validate_id(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value or len(value) > ID_LENGTH or not _ID.match(value):
        raise InvalidInputError(
            f"{name} must be 1 to {ID_LENGTH} printable ASCII characters without spaces, got {value!r}"
        )
    return value


_I64 = 1 << 63


def _check_bare_int(payload: int, type_: str) -> None:
    """A payload that is a bare integer must fit in 64 signed bits: SQLite stores a JSON column's
    bare number as a number (NUMERIC affinity), and one above 2**63 - 1 as an inexact REAL."""
    if not -_I64 <= payload < _I64:
        raise InvalidInputError(
            f"payload of event {type_!r} is the bare integer {payload}, outside the 64-bit signed range",
            hint="wrap it in an object ({\"value\": ...}) or a string: inside an object it is kept exactly",
        )


def _dumps(doc: dict, what: str, opts: int = _DUMP_OPTS, default=None, *, caller_json: bool = False) -> bytes:
    """`doc` as JSON. `caller_json`: it holds a value the caller passed in (a payload, an
    envelope, a response), which is parsed back once: an `orjson.Fragment` is written as it is,
    and one that is not JSON would leave the execution's record unreadable for good."""
    try:
        out = orjson.dumps(doc, default=default, option=opts)
    except TypeError as e:
        raise InvalidInputError(
            f"{what} is not JSON-serialisable: {e}",
            hint="pass dicts, lists, strings, numbers, booleans and None only",
        ) from None
    if caller_json:
        try:
            orjson.loads(out)
        except orjson.JSONDecodeError as e:
            raise InvalidInputError(
                f"{what} does not serialise to valid JSON ({e})",
                hint="an orjson.Fragment must hold valid JSON; pass plain values instead",
            ) from None
    return out


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


class Store:
    """A data directory opened for recording. Use `tracedb.open(data_dir)`; a context manager."""

    def __init__(
        self,
        config: Config,
        *,
        clock: Optional[Callable[[], int]] = None,
        recovery_progress: Optional[Callable[[int, int], None]] = None,
    ):
        self.config = config
        self.clock = clock or time.time_ns
        self.data_dir = config.data_dir
        self._closed = False
        self._lock = threading.Lock()  # guards self._states
        self._states: dict[str, _State] = {}
        self._compact_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._engine = self._read_engine = None
        self._compactor: Optional[Compactor] = None
        self._worker = None  # a CompactorWorker when compact_worker is set
        self._hinting = False  # see _keep_records_in_memory
        self.background_error: Optional[BaseException] = None
        self._disabled_seqs: dict[str, int] = {}
        os.makedirs(self.data_dir, exist_ok=True)
        try:
            self._wal = wal.open_wal(
                config.wal_dir,
                segment_size_bytes=config.wal_segment_size_bytes,
                preallocate=config.wal_preallocate,
            )
        except wal.WalLockedError as e:
            raise StoreInUseError(
                f"data directory {self.data_dir} is in use by a running recorder ({e.holder})",
                hint="the running recorder compacts and recovers in the background; read commands "
                "(inspect, trace get, verify, prune, pin, invalidate) work next to it",
            ) from None
        try:
            self._open_database()
            self.last_recovery: RecoverResult = recovery.recover(
                self, at_open=True, progress=recovery_progress
            )
        except BaseException:
            self._shutdown_resources()
            raise
        background = config.compact_interval_ms > 0 or config.idle_timeout_s > 0
        if config.compact_worker and not background:
            self._start_worker()
        if background:
            self._thread = threading.Thread(target=self._background, name="tracedb-compactor", daemon=True)
            self._thread.start()

    def _start_worker(self) -> None:
        from .compactor_worker import CompactorWorker

        cfg = self.config
        # Under the compaction lock: the child starts from the checkpoint as it is now, and
        # nothing compacts in-process meanwhile.
        with self._compact_lock:
            if self._closed:
                return
            try:
                self._worker = CompactorWorker(
                    database=cfg.database, wal_dir=cfg.wal_dir, recorder_id=self.recorder_id,
                    batch_records=cfg.compact_batch_records, busy_timeout_ms=cfg.busy_timeout_ms,
                )
            except Exception as e:  # noqa: BLE001 - compaction goes on in-process
                log.error("tracedb: the compactor process did not start (%s); compacting in-process", e)
                self._worker = None
                self._keep_records_in_memory(True)

    def _open_database(self) -> None:
        cfg = self.config
        self._engine = db.create_engine(cfg.sqlite_path, busy_timeout_ms=cfg.busy_timeout_ms, write=True)
        self._read_engine = db.create_engine(cfg.sqlite_path, busy_timeout_ms=cfg.busy_timeout_ms)
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
        self._keep_records_in_memory(not cfg.compact_worker)

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
    def applied_lsn(self) -> int:
        """The last WAL LSN applied to the database."""
        return self._compactor.applied_lsn if self._compactor else 0

    @property
    def durable_lsn(self) -> int:
        """The last WAL LSN acknowledged as durable."""
        return self._wal.durable_lsn

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
            self._shutdown_resources()

    def _shutdown_resources(self) -> None:
        self._closed = True
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        if self._compactor is not None:
            self._compactor.close()
        for eng in (self._engine, self._read_engine):
            if eng is not None:
                eng.dispose()
        self._wal.close()

    def _check_recording(self, what: str) -> None:
        if self._closed:
            raise StoreClosedError()
        failed = self._wal.failed
        if failed is not None:
            raise RecordingFailedError(str(failed.message), hint=failed.hint)

    def _check_sync(self, what: str) -> None:
        self._check_recording(what)
        if _in_running_loop():
            raise UsageError(
                f"Store.{what}() waits for an fsync and was called inside a running event loop",
                hint=f"use `astore = await tracedb.open_async(...)` and `await astore.{what}(...)`",
            )

    # -- the WAL -------------------------------------------------------------------------
    def _append(self, data: bytes, hint=None) -> int:
        try:
            lsn = self._wal.append(data, hint)
        except wal.PayloadTooLargeError as e:
            raise InvalidInputError(str(e), hint="store large blobs elsewhere and record a reference") from None
        except wal.WalFailedError as e:
            raise RecordingFailedError(e.message, hint=e.hint) from None
        except wal.WalClosedError:
            raise StoreClosedError() from None
        self._note_append()
        return lsn

    def _enqueue(self, payloads: list[bytes], loop, hints=None) -> asyncio.Future:
        try:
            return self._wal.append_future(payloads, loop, hints)
        except wal.PayloadTooLargeError as e:
            raise InvalidInputError(str(e), hint="store large blobs elsewhere and record a reference") from None
        except wal.WalFailedError as e:
            raise RecordingFailedError(e.message, hint=e.hint) from None
        except wal.WalClosedError:
            raise StoreClosedError() from None

    def _note_append(self) -> None:
        if self._wal.durable_lsn - self.applied_lsn >= self.config.compact_batch_records:
            self._wake.set()

    # -- validation, shared by the sync and async paths ---------------------------------
    def _prepare_start(self, intent, envelope, execution_id, parent_execution_id, forked_at_seq, created_at_ns=None):
        if not isinstance(intent, str) or not intent:
            raise InvalidInputError(f"intent must be a non-empty string, got {intent!r}")
        if not isinstance(envelope, Mapping):
            raise InvalidInputError(f"envelope must be a dict, not {type(envelope).__name__}")
        envelope = dict(envelope)
        if execution_id is None:
            execution_id = f"exec-{uuid.uuid4().hex}"
            explicit = False
        else:
            _validate_id(execution_id, "execution_id")
            explicit = True
        if parent_execution_id is not None:
            _validate_id(parent_execution_id, "parent_execution_id")
        if forked_at_seq is not None:
            if parent_execution_id is None:
                raise InvalidInputError("forked_at_seq needs a parent_execution_id")
            if not isinstance(forked_at_seq, int) or isinstance(forked_at_seq, bool) or forked_at_seq < 0:
                raise InvalidInputError(f"forked_at_seq must be an int >= 0, got {forked_at_seq!r}")
        try:
            envelope_hash = compute_envelope_hash(envelope)
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"envelope cannot be hashed: {e}") from None
        now = self.clock()
        if created_at_ns is not None and (
            not isinstance(created_at_ns, int) or isinstance(created_at_ns, bool) or created_at_ns <= 0
        ):
            raise InvalidInputError(f"created_at_ns must be a positive int, got {created_at_ns!r}")
        doc = {
            "op": OP_START, "id": execution_id, "intent": intent, "envelope": envelope,
            # An imported execution keeps its original creation time (retention counts from it).
            "hash": envelope_hash, "t": now if created_at_ns is None else created_at_ns,
        }
        if parent_execution_id is not None:
            doc["parent"] = parent_execution_id
            doc["fork_seq"] = forked_at_seq
        data = _dumps(doc, "envelope", _ENVELOPE_OPTS, default=str, caller_json=True)
        return execution_id, explicit, envelope_hash, data, now

    def _reserve(self, execution_id: str, now: int) -> _State:
        with self._lock:
            if execution_id in self._states:
                raise ExecutionExistsError(execution_id)
            state = self._states[execution_id] = _State(execution_id, now)
            return state

    def _unreserve(self, state: _State) -> None:
        with self._lock:
            if self._states.get(state.execution_id) is state and state.status == _STARTING:
                del self._states[state.execution_id]

    def _check_new_in_db(self, execution_id: str, explicit: bool, parent: Optional[str]) -> None:
        if explicit and queries.trace_status(self._read_engine, execution_id) is not None:
            raise ExecutionExistsError(execution_id)
        if parent is not None and parent not in self._states:
            if queries.trace_status(self._read_engine, parent) is None:
                raise ExecutionNotFoundError(parent, hint="fork from an execution that exists")

    def _state_for(self, execution_id: Any) -> _State:
        """The live state of an execution, or the right error without touching the WAL."""
        if not isinstance(execution_id, str):
            raise InvalidInputError(f"execution_id must be a string, not {type(execution_id).__name__}")
        state = self._states.get(execution_id)
        if state is not None and state.status != _STARTING:
            return state
        status = queries.trace_status(self._read_engine, execution_id)
        if status is None:
            raise ExecutionNotFoundError(execution_id)
        raise ExecutionClosedError(execution_id, status)

    @staticmethod
    def _check_open(state: _State) -> None:
        if state.status != STATUS_RUNNING:
            raise ExecutionClosedError(state.execution_id, state.status)

    def _event_doc(self, state: _State, type_: str, payload: Any, now: int) -> tuple[bytes, Optional[tuple]]:
        """The event's WAL record, and its compaction hint when the in-process compactor takes
        records from memory (see Compactor's `source`): what decoding the record would give."""
        if type(payload) is int:
            _check_bare_int(payload, type_)
        payload_json = _dumps(payload, f"payload of event {type_!r}", caller_json=True)
        data = encode_event(state.execution_id, state.next_seq, type_, payload_json, now)
        if not self._hinting:
            return data, None
        return data, (state.execution_id, state.next_seq, type_, len(data) - len(payload_json), now)

    def _finish_doc(self, state: _State, response: Any, now: int) -> bytes:
        return _dumps(
            {"op": OP_FINISH, "id": state.execution_id, "seq": state.next_seq,
             "response": response, "t": now},
            "final response", caller_json=True,
        )

    @staticmethod
    def _check_response(response: Any) -> dict:
        if not isinstance(response, Mapping):
            raise InvalidInputError(
                f"the final response must be a dict, not {type(response).__name__}",
                hint='seed 000: for example {"status": "success", "payload": {...}}',
            )
        return dict(response)

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
    ) -> "Execution":
        """Start an execution; returns once its start record is durable in the WAL.

        `created_at_ns` (ns since the epoch) is for importing executions recorded elsewhere:
        their original creation time; None is now.
        """
        self._check_sync("start")
        eid, explicit, ehash, data, now = self._prepare_start(
            intent, envelope, execution_id, parent_execution_id, forked_at_seq, created_at_ns
        )
        if not self.config.enabled:
            self._disabled_seqs[eid] = 1
            return Execution(self, eid, ehash)
        state = self._reserve(eid, now)
        try:
            self._check_new_in_db(eid, explicit, parent_execution_id)
            with state.lock:
                state.last_lsn = self._append(data)
                state.status = STATUS_RUNNING
        finally:
            self._unreserve(state)
        return Execution(self, eid, ehash)

    def event(self, execution_id: str, type: str, payload: Any = None) -> int:
        """Record one event; returns its seq once it is durable in the WAL.

        A FINAL_RESPONSE event is the same as `finish(execution_id, payload)`.
        """
        self._check_sync("event")
        validate_event_type(type)
        if type == FINAL_RESPONSE:
            return self.finish(execution_id, payload)
        if not self.config.enabled:
            return self._disabled_seq(execution_id)
        state = self._state_for(execution_id)
        with state.lock:
            self._check_open(state)
            now = self.clock()
            data, hint = self._event_doc(state, type, payload, now)
            lsn = self._append(data, hint)
            seq = state.next_seq
            state.next_seq = seq + 1
            state.last_lsn = lsn
            state.last_activity_ns = now
        return seq

    def finish(self, execution_id: str, response: dict) -> int:
        """Record FINAL_RESPONSE with `response` and close the execution as completed; returns its seq."""
        self._check_sync("finish")
        response = self._check_response(response)
        if not self.config.enabled:
            return self._disabled_seq(execution_id)
        state = self._state_for(execution_id)
        with state.lock:
            self._check_open(state)
            now = self.clock()
            data = self._finish_doc(state, response, now)
            lsn = self._append(data)
            seq = state.next_seq
            state.next_seq = seq + 1
            state.last_lsn = lsn
            state.last_activity_ns = now
            state.status = STATUS_COMPLETED
        return seq

    def invalidate(self, execution_id: str, reason: str) -> None:
        """Mark an execution invalidated, not replayable (manually_invalidated); durable in the WAL.

        Works on running and closed executions; invalidating twice is a no-op.
        """
        self._check_sync("invalidate")
        self._status_change(execution_id, OP_INVALIDATE, reason, "reason")

    def mark_recording_failure(self, execution_id: str, detail: str) -> None:
        """Flag an execution not replayable because its recording is known to be incomplete
        (seed 000 state 3, recording_failure). Its status does not change."""
        self._check_sync("mark_recording_failure")
        self._status_change(execution_id, OP_RECORDING_FAILURE, detail, "detail")

    def _status_change(self, execution_id: str, op: str, text: Any, key: str, *, _enqueue_loop=None):
        if not isinstance(text, str) or not text:
            raise InvalidInputError(f"{key} must be a non-empty string, got {text!r}")
        if not self.config.enabled:
            return None
        if not isinstance(execution_id, str):
            raise InvalidInputError(f"execution_id must be a string, not {type(execution_id).__name__}")
        state = self._states.get(execution_id)
        if state is None or state.status == _STARTING:
            status = queries.trace_status(self._read_engine, execution_id)
            if status is None:
                raise ExecutionNotFoundError(execution_id)
            if not self._allowed(op, status):
                return self._refuse(op, execution_id, status)
            data = _dumps({"op": op, "id": execution_id, key: text, "t": self.clock()}, key)
            if _enqueue_loop is not None:
                return self._enqueue([data], _enqueue_loop)
            self._append(data)
            return None
        with state.lock:
            if not self._allowed(op, state.status):
                return self._refuse(op, execution_id, state.status)
            now = self.clock()
            data = _dumps({"op": op, "id": execution_id, key: text, "t": now}, key)
            if _enqueue_loop is not None:
                fut = self._enqueue([data], _enqueue_loop)
                state.last_lsn = _PENDING_LSN
            else:
                state.last_lsn = self._append(data)
                fut = None
            if op == OP_INVALIDATE:
                state.status = STATUS_INVALIDATED
            state.last_activity_ns = now
            return fut

    @staticmethod
    def _allowed(op: str, status: str) -> bool:
        if op == OP_INVALIDATE:
            return status != STATUS_INVALIDATED
        return status in (STATUS_RUNNING, STATUS_COMPLETED)

    @staticmethod
    def _refuse(op: str, execution_id: str, status: str):
        if op == OP_INVALIDATE:
            return None  # already invalidated: nothing to do
        raise ExecutionClosedError(execution_id, status)

    def _disabled_seq(self, execution_id: str) -> int:
        seq = self._disabled_seqs.get(execution_id)
        if seq is None:
            raise ExecutionNotFoundError(execution_id, hint="tracing is disabled (enabled = false)")
        self._disabled_seqs[execution_id] = seq + 1
        return seq

    def _open_states(self) -> list[_State]:
        with self._lock:
            return [s for s in self._states.values() if s.status == STATUS_RUNNING]

    def _mark_incomplete(self, states: list[_State], why: str, idle_since_ns: Optional[int] = None) -> int:
        marked = 0
        for state in states:
            with state.lock:
                if state.status != STATUS_RUNNING:
                    continue
                if idle_since_ns is not None and state.last_activity_ns > idle_since_ns:
                    # An event was numbered (maybe staged, not yet queued) since the sweep looked:
                    # marking now could put the incomplete record before that event in the log.
                    continue
                now = self.clock()
                data = _dumps({"op": OP_INCOMPLETE, "id": state.execution_id, "why": why, "t": now}, "why")
                state.last_lsn = self._append(data)
                state.status = STATUS_INCOMPLETE
                marked += 1
        return marked

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
                deleted = self._compactor._maybe_mark_applied(self._wal.mark_applied)
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
        with self._lock:
            done = [
                eid for eid, s in self._states.items()
                if s.status not in (STATUS_RUNNING, _STARTING) and s.last_lsn <= applied_lsn
            ]
            for eid in done:
                del self._states[eid]

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
                    state = self._states.get(eid)
                    if state is None:
                        continue
                    with state.lock:
                        if state.status == STATUS_RUNNING:
                            state.status = STATUS_INVALIDATED
                            closed += 1
        return closed

    def _background(self) -> None:
        if self.config.compact_worker and self._worker is None:
            # From this thread, which lives as long as the store: on Linux the child is tied to
            # the thread that started it (PR_SET_PDEATHSIG).
            self._start_worker()
        interval = self.config.compact_interval_ms / 1000.0 if self.config.compact_interval_ms > 0 else None
        idle_s = self.config.idle_timeout_s
        sweep_every_s = min(60.0, idle_s / 10) if idle_s > 0 else None
        next_sweep = time.monotonic() + (sweep_every_s or 0)
        failures = 0
        while not self._stop.is_set():
            wait = interval if interval is not None else sweep_every_s
            if failures:
                wait = min(5.0, (wait or 1.0) * (2 ** min(failures, 5)))
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if interval is not None:
                    self._refresh()
                    self._sync_external()
                if sweep_every_s is not None and time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + sweep_every_s
                    self.sweep_idle()
                failures = 0
                self.background_error = None
            except StoreClosedError:
                return
            except Exception as e:  # noqa: BLE001 - keep recording; report, back off, retry
                failures += 1
                self.background_error = e
                log.error("tracedb background compaction failed (attempt %d): %s", failures, e)

    # -- reading -------------------------------------------------------------------------
    def get(self, execution_id: str) -> ExecutionRecord:
        """The execution's whole record (seed 000's shape), including events not yet compacted."""
        self._refresh()
        return queries.read_record(self._read_engine, execution_id)

    def list(
        self,
        status: Optional[str] = None,
        since=None,
        until=None,
        limit: Optional[int] = None,
    ) -> list[TraceSummary]:
        """Executions by creation time; `since`/`until` are aware datetimes or epoch seconds."""
        self._refresh()
        return queries.list_traces(self._read_engine, status=status, since=since, until=until, limit=limit)

    def recover(self, *, progress: Optional[Callable[[int, int], None]] = None) -> RecoverResult:
        """Compact, then mark incomplete every running execution that this store is not recording."""
        if self._closed:
            raise StoreClosedError()
        return recovery.recover(self, progress=progress)

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


    # -- staged recording: the sidecar's batched path ---------------------------------------
    # `tracedb serve` (tracedb/sidecar/store_backend.py) stages every request of one socket read
    # on its event loop, then appends them with one WAL call and one future: a future and a
    # coroutine per event would cost more CPU than the rest of the event's path. Staging checks
    # and numbers exactly as `event` does, under the execution's lock; one thread (the server's
    # loop) stages and appends, batch after batch, so each execution's seq order is its LSN order.

    def next_seq(self, execution_id: str) -> Optional[int]:
        """The seq the next event of an execution held in memory gets; None if only the database
        knows the execution (closed and compacted, or never seen)."""
        state = self._states.get(execution_id)
        if state is None or state.status == _STARTING:
            return None
        return state.next_seq

    def _staged_state(self, execution_id: str, expected_seq: Optional[int]) -> _State:
        state = self._states.get(execution_id)
        if state is None or state.status == _STARTING:
            raise StageMiss(execution_id, None)
        if expected_seq is not None and expected_seq != state.next_seq:
            raise StageMiss(execution_id, state.next_seq)
        return state

    @staticmethod
    def _check_size(data: bytes) -> bytes:
        if len(data) > wal.MAX_PAYLOAD_BYTES:
            raise InvalidInputError(
                f"record of {len(data)} bytes exceeds the WAL's limit of {wal.MAX_PAYLOAD_BYTES}",
                hint="store large blobs elsewhere and record a reference",
            )
        return data

    def stage_event(
        self, batch: "StagedBatch", execution_id: str, type_: str, payload: Any,
        expected_seq: Optional[int] = None,
    ) -> int:
        """Check and number one event as `event` does, framing its WAL record into `batch`.

        Raises StageMiss when the execution is not held in memory, or when `expected_seq` (the
        seq the caller expects the event to get) is not the execution's next seq: the caller
        resolves those off the hot path (a resend, a closed execution, an unknown id).
        """
        if self._closed or self._wal.failed is not None:
            self._check_recording("event")
        if type_ == FINAL_RESPONSE:
            return self.stage_finish(batch, execution_id, payload, expected_seq)
        if type_ not in SEED_004_EVENT_TYPES and type_ not in SEED_002_EVENT_TYPES:
            validate_event_type(type_)
        if not self.config.enabled:
            return self._disabled_seq(execution_id)
        state = self._staged_state(execution_id, expected_seq)
        with state.lock:
            if state.status != STATUS_RUNNING:
                raise ExecutionClosedError(execution_id, state.status)
            seq = state.next_seq
            now = self.clock()
            if type(payload) is int:
                _check_bare_int(payload, type_)
            try:
                payload_json = orjson.dumps(payload, option=_DUMP_OPTS)
            except TypeError as e:
                raise InvalidInputError(
                    f"payload of event {type_!r} is not JSON-serialisable: {e}",
                    hint="pass dicts, lists, strings, numbers, booleans and None only",
                ) from None
            data = encode_event(execution_id, seq, type_, payload_json, now)
            if len(data) > wal.MAX_PAYLOAD_BYTES:
                self._check_size(data)
            if self._hinting:
                batch.hints[len(batch.payloads)] = (execution_id, seq, type_, len(data) - len(payload_json), now)
            batch.payloads.append(data)
            state.next_seq = seq + 1
            state.last_activity_ns = now
        return seq

    def stage_finish(
        self, batch: "StagedBatch", execution_id: str, response: dict, expected_seq: Optional[int] = None
    ) -> int:
        """Check and number the final response as `finish` does, framing it into `batch`
        (StageMiss as for `stage_event`)."""
        self._check_recording("finish")
        response = self._check_response(response)
        if not self.config.enabled:
            return self._disabled_seq(execution_id)
        state = self._staged_state(execution_id, expected_seq)
        with state.lock:
            self._check_open(state)
            now = self.clock()
            data = self._check_size(self._finish_doc(state, response, now))
            batch.closing.append((len(batch.payloads), state))
            batch.payloads.append(data)
            seq = state.next_seq
            state.next_seq = seq + 1
            state.last_activity_ns = now
            state.status = STATUS_COMPLETED
            state.last_lsn = _PENDING_LSN  # not forgotten before its record is applied
        return seq

    def stage_invalidate(self, batch: "StagedBatch", execution_id: str, reason: str) -> bool:
        """Frame an invalidation of an execution held in memory into `batch` (a no-op if it is
        invalidated already). False if only the database knows it: call `invalidate` off the loop."""
        if not isinstance(reason, str) or not reason:
            raise InvalidInputError(f"reason must be a non-empty string, got {reason!r}")
        self._check_recording("invalidate")
        if not self.config.enabled:
            return True
        state = self._states.get(execution_id)
        if state is None or state.status == _STARTING:
            return False
        with state.lock:
            if self._allowed(OP_INVALIDATE, state.status):
                now = self.clock()
                doc = {"op": OP_INVALIDATE, "id": execution_id, "reason": reason, "t": now}
                batch.closing.append((len(batch.payloads), state))
                batch.payloads.append(self._check_size(_dumps(doc, "reason")))
                state.status = STATUS_INVALIDATED
                state.last_lsn = _PENDING_LSN
                state.last_activity_ns = now
        return True

    def stage_abandon(self, batch: "StagedBatch", execution_id: str, why: str) -> Optional[str]:
        """Mark a running execution held in memory incomplete now (its agent died), framing the
        record into `batch`: what recovery does after a crash, without waiting for the sweeper.

        Returns the status the execution had (incomplete already: nothing staged), or None if
        only the database knows it.
        """
        if not isinstance(why, str) or not why:
            raise InvalidInputError(f"reason must be a non-empty string, got {why!r}")
        self._check_recording("abandon")
        state = self._states.get(execution_id)
        if state is None or state.status == _STARTING:
            return None
        with state.lock:
            status = state.status
            if status == STATUS_RUNNING:
                now = self.clock()
                doc = {"op": OP_INCOMPLETE, "id": execution_id, "why": why, "t": now}
                batch.closing.append((len(batch.payloads), state))
                batch.payloads.append(self._check_size(_dumps(doc, "reason")))
                state.status = STATUS_INCOMPLETE
                state.last_lsn = _PENDING_LSN
                state.last_activity_ns = now
        return status

    def abandon(self, execution_id: str, why: str) -> str:
        """Sync twin of `stage_abandon` for in-process recording; returns the previous status
        (ExecutionNotFoundError if unknown). Durable when it returns."""
        self._check_sync("abandon")
        batch = StagedBatch()
        status = self.stage_abandon(batch, execution_id, why)
        if status is None:
            status = queries.trace_status(self._read_engine, execution_id)
            if status is None:
                raise ExecutionNotFoundError(execution_id)
            return status
        if batch.payloads:
            for i, state in batch.closing:
                state.last_lsn = self._append(batch.payloads[i])
        return status

    def reserve_start(
        self, intent, envelope, execution_id=None, parent_execution_id=None, forked_at_seq=None
    ) -> "StagedStart":
        """Validate a start and reserve its id (ExecutionExistsError if it is held in memory).

        Then, off the event loop, `check_new_in_db` (it queries the database); then `stage_start`,
        or `cancel_start` if anything failed.
        """
        self._check_recording("start")
        eid, explicit, ehash, data, now = self._prepare_start(
            intent, envelope, execution_id, parent_execution_id, forked_at_seq
        )
        if not self.config.enabled:
            self._disabled_seqs[eid] = 1
            return StagedStart(eid, ehash, None, None, explicit, parent_execution_id)
        state = self._reserve(eid, now)
        return StagedStart(eid, ehash, self._check_size(data), state, explicit, parent_execution_id)

    def check_new_in_db(self, start: "StagedStart") -> None:
        """Blocking: refuse an explicit id the database already holds, or a missing parent."""
        if start.state is not None:
            self._check_new_in_db(start.execution_id, start.explicit, start.parent_execution_id)

    def stage_start(self, batch: "StagedBatch", start: "StagedStart") -> None:
        """Frame a reserved start into `batch`; events may be staged behind it at once."""
        if start.state is None:
            return
        with start.state.lock:
            batch.payloads.append(start.data)
            start.state.status = STATUS_RUNNING

    def cancel_start(self, start: "StagedStart") -> None:
        """Release a reservation that will not be staged."""
        if start.state is not None:
            self._unreserve(start.state)

    def append_staged(self, batch: "StagedBatch", loop) -> Optional[asyncio.Future]:
        """Append a batch's records with one WAL call; the future (of `loop`) resolves to their
        LSNs once they are durable. None for an empty batch."""
        if not batch.payloads:
            return None
        fut = self._enqueue(batch.payloads, loop, batch.hints or None)
        closing = batch.closing
        if closing:

            def _set_lsns(f: asyncio.Future) -> None:
                if f.cancelled() or f.exception() is not None:
                    return
                lsns = f.result()
                for i, state in closing:
                    if state.last_lsn == _PENDING_LSN:
                        state.last_lsn = lsns[i]

            fut.add_done_callback(_set_lsns)
        if not self._wake.is_set():  # Event.set() takes a lock even when already set
            self._note_append()
        return fut

    def status_of(self, execution_id: str) -> Optional[str]:
        """An execution's status, from memory or else the database (blocking); None if unknown."""
        state = self._states.get(execution_id)
        if state is not None and state.status != _STARTING:
            return state.status
        return queries.trace_status(self._read_engine, execution_id)

    @property
    def open_executions(self) -> int:
        """How many executions are recording (status running)."""
        return sum(1 for s in list(self._states.values()) if s.status == STATUS_RUNNING)


class StageMiss(Exception):
    """`Store.stage_event` cannot decide on the hot path: the execution is not held in memory
    (`next_seq` None), or the caller's expected seq is not `next_seq`."""

    def __init__(self, execution_id: str, next_seq: Optional[int]):
        super().__init__(execution_id, next_seq)
        self.execution_id = execution_id
        self.next_seq = next_seq


class StagedBatch:
    """WAL records staged for one append (see `Store.stage_event`)."""

    __slots__ = ("payloads", "closing", "hints")

    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self.hints: dict[int, tuple] = {}  # index in payloads -> the event's compaction hint
        self.closing: list[tuple[int, _State]] = []  # (index in payloads, state) of closing records


class StagedStart:
    """A start validated and reserved by `Store.reserve_start`, not yet staged."""

    __slots__ = ("execution_id", "envelope_hash", "data", "state", "explicit", "parent_execution_id")

    def __init__(self, execution_id, envelope_hash, data, state, explicit, parent_execution_id):
        self.execution_id = execution_id
        self.envelope_hash = envelope_hash
        self.data = data
        self.state = state
        self.explicit = explicit
        self.parent_execution_id = parent_execution_id


class Execution:
    """One execution being recorded: `event()`, then `finish()`."""

    def __init__(self, store: Store, execution_id: str, envelope_hash: str):
        self.store = store
        self.execution_id = execution_id
        self.envelope_hash = envelope_hash

    def event(self, type: str, payload: Any = None) -> int:
        """Record an event; returns its seq once durable."""
        return self.store.event(self.execution_id, type, payload)

    def finish(self, response: dict) -> int:
        """Record the final response (FINAL_RESPONSE); returns its seq once durable."""
        return self.store.finish(self.execution_id, response)

    def invalidate(self, reason: str) -> None:
        """Mark this execution invalidated (manually_invalidated)."""
        self.store.invalidate(self.execution_id, reason)

    def mark_recording_failure(self, detail: str) -> None:
        """Flag this execution not replayable (recording_failure)."""
        self.store.mark_recording_failure(self.execution_id, detail)

    def get(self) -> ExecutionRecord:
        """This execution's record so far."""
        return self.store.get(self.execution_id)

    def __repr__(self) -> str:
        return f"Execution({self.execution_id!r})"


class AsyncStore:
    """The asyncio twin of `Store`: the same names, awaited; never blocks the event loop.

    Appends are enqueued on the WAL's group commit and awaited through a future; database work runs
    in the default executor.
    """

    def __init__(self, store: Store):
        self.store = store

    @property
    def config(self) -> Config:
        return self.store.config

    async def __aenter__(self) -> "AsyncStore":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _run(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: fn(*args, **kwargs))

    async def start(
        self,
        intent: str,
        envelope: dict,
        execution_id: Optional[str] = None,
        *,
        parent_execution_id: Optional[str] = None,
        forked_at_seq: Optional[int] = None,
    ) -> "AsyncExecution":
        """Start an execution; returns once its start record is durable."""
        s = self.store
        s._check_recording("start")
        eid, explicit, ehash, data, now = s._prepare_start(
            intent, envelope, execution_id, parent_execution_id, forked_at_seq
        )
        if not s.config.enabled:
            s._disabled_seqs[eid] = 1
            return AsyncExecution(self, eid, ehash)
        state = s._reserve(eid, now)
        try:
            if explicit or parent_execution_id is not None:
                await self._run(s._check_new_in_db, eid, explicit, parent_execution_id)
            with state.lock:
                fut = s._enqueue([data], asyncio.get_running_loop())
        except BaseException:
            s._unreserve(state)
            raise

        def started(lsn: int) -> None:
            state.last_lsn = lsn
            state.status = STATUS_RUNNING

        # Once queued, the start is the WAL's: a cancelled caller must not drop the reservation
        # of an execution whose start record is about to be durable.
        state.start_fut = fut
        await _when_durable(fut, started, lambda: s._unreserve(state))
        s._note_append()
        return AsyncExecution(self, eid, ehash)

    async def _state(self, execution_id) -> _State:
        s = self.store
        state = s._states.get(execution_id) if isinstance(execution_id, str) else None
        if state is not None and state.status == _STARTING and state.start_fut is not None:
            # Its start was queued by a caller that did not wait for it: wait here instead.
            try:
                await asyncio.shield(state.start_fut)
            except Exception:  # noqa: BLE001 - the WAL failed; the lookup below says so
                pass
        if state is not None and state.status != _STARTING:
            return state
        return await self._run(s._state_for, execution_id)

    async def event(self, execution_id: str, type: str, payload: Any = None) -> int:
        """Record one event; returns its seq once durable."""
        s = self.store
        s._check_recording("event")
        validate_event_type(type)
        if type == FINAL_RESPONSE:
            return await self.finish(execution_id, payload)
        if not s.config.enabled:
            return s._disabled_seq(execution_id)
        state = await self._state(execution_id)
        # The lock is held only to number and enqueue (no I/O), so the loop is never blocked on
        # an fsync; the seq is taken at once, LSN order follows enqueue order.
        with state.lock:
            s._check_open(state)
            now = s.clock()
            data, hint = s._event_doc(state, type, payload, now)
            fut = s._enqueue([data], asyncio.get_running_loop(), None if hint is None else {0: hint})
            seq = state.next_seq
            state.next_seq = seq + 1
            state.last_activity_ns = now

        def applied(lsn: int) -> None:
            state.last_lsn = max(state.last_lsn, lsn)

        await _when_durable(fut, applied)
        s._note_append()
        return seq

    async def finish(self, execution_id: str, response: dict) -> int:
        """Record the final response and close the execution; returns its seq once durable."""
        s = self.store
        s._check_recording("finish")
        response = s._check_response(response)
        if not s.config.enabled:
            return s._disabled_seq(execution_id)
        state = await self._state(execution_id)
        with state.lock:
            s._check_open(state)
            now = s.clock()
            data = s._finish_doc(state, response, now)
            fut = s._enqueue([data], asyncio.get_running_loop())
            seq = state.next_seq
            state.next_seq = seq + 1
            state.last_activity_ns = now
            state.status = STATUS_COMPLETED
            # Not forgotten before its finish record is applied (see _forget_applied).
            state.last_lsn = _PENDING_LSN

        def finished(lsn: int) -> None:
            state.last_lsn = lsn

        await _when_durable(fut, finished)
        s._note_append()
        return seq

    async def invalidate(self, execution_id: str, reason: str) -> None:
        """Mark an execution invalidated (manually_invalidated); durable when this returns."""
        await self._status_change(execution_id, OP_INVALIDATE, reason, "reason")

    async def mark_recording_failure(self, execution_id: str, detail: str) -> None:
        """Flag an execution not replayable (recording_failure)."""
        await self._status_change(execution_id, OP_RECORDING_FAILURE, detail, "detail")

    async def _status_change(self, execution_id, op, text, key) -> None:
        s = self.store
        s._check_recording(op)
        loop = asyncio.get_running_loop()
        state = s._states.get(execution_id) if isinstance(execution_id, str) else None
        if state is None or state.status == _STARTING:
            # Needs a database lookup: do it off the loop, and append from there too.
            fut = await self._run(s._status_change, execution_id, op, text, key, _enqueue_loop=loop)
        else:
            fut = s._status_change(execution_id, op, text, key, _enqueue_loop=loop)
        if fut is not None:

            def changed(lsn: int) -> None:
                if state is not None and state.last_lsn == _PENDING_LSN:
                    state.last_lsn = lsn

            await _when_durable(fut, changed)

    async def get(self, execution_id: str) -> ExecutionRecord:
        """The execution's whole record."""
        return await self._run(self.store.get, execution_id)

    async def list(self, status=None, since=None, until=None, limit=None) -> list[TraceSummary]:
        """Executions by creation time, filtered."""
        return await self._run(self.store.list, status, since, until, limit)

    async def compact(self, **kw) -> CompactResult:
        """Apply every durable WAL record to the database now."""
        return await self._run(self.store.compact, **kw)

    async def recover(self, **kw) -> RecoverResult:
        """Compact and mark orphaned running executions incomplete."""
        return await self._run(self.store.recover, **kw)

    async def prune(self, older_than_s=None, dry_run=False, **kw) -> PruneResult:
        """Delete old terminal traces."""
        return await self._run(self.store.prune, older_than_s, dry_run, **kw)

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
        self.store._wal.detach_loop()  # waits for the fdatasync (or rotation) under way
        await self._run(self.store.close)


class AsyncExecution:
    """The asyncio twin of `Execution`."""

    def __init__(self, astore: AsyncStore, execution_id: str, envelope_hash: str):
        self.astore = astore
        self.execution_id = execution_id
        self.envelope_hash = envelope_hash

    async def event(self, type: str, payload: Any = None) -> int:
        """Record an event; returns its seq once durable."""
        return await self.astore.event(self.execution_id, type, payload)

    async def finish(self, response: dict) -> int:
        """Record the final response; returns its seq once durable."""
        return await self.astore.finish(self.execution_id, response)

    async def invalidate(self, reason: str) -> None:
        """Mark this execution invalidated."""
        await self.astore.invalidate(self.execution_id, reason)

    async def mark_recording_failure(self, detail: str) -> None:
        """Flag this execution not replayable (recording_failure)."""
        await self.astore.mark_recording_failure(self.execution_id, detail)

    async def get(self) -> ExecutionRecord:
        """This execution's record so far."""
        return await self.astore.get(self.execution_id)

    def __repr__(self) -> str:
        return f"AsyncExecution({self.execution_id!r})"


def open_store(data_dir=None, *, config=None, clock: Optional[Callable[[], int]] = None) -> Store:
    """Open (creating if needed) the data directory for recording; runs recovery first."""
    return Store(as_config(config, data_dir), clock=clock)


async def open_store_async(data_dir=None, *, config=None, clock=None) -> AsyncStore:
    """Open the data directory for asyncio callers; recovery runs in a worker thread."""
    loop = asyncio.get_running_loop()
    cfg = as_config(config, data_dir)
    store = await loop.run_in_executor(None, lambda: Store(cfg, clock=clock))
    if cfg.wal_aio:
        try:
            store._wal.attach_loop()  # this loop flushes its own appends (wal.Wal.attach_loop)
        except BaseException:
            await loop.run_in_executor(None, store.close)
            raise
    return AsyncStore(store)
