"""Numbering and closing executions: one implementation for every recording path.

Each call checks its input in memory (no database query, except where a docstring says
"blocking"), numbers the record under the execution's lock, and hands its WAL record to a *sink*
(`tracedb.recorder.state.RecordSink`): the sync API appends it at once (`Staging.appender`), the asyncio API
(`tracedb.recorder.store_async`) queues it on the WAL's group commit, the sidecar and the OTLP ingest frame
many into one `StagedBatch` and append it with one call (`Staging.append_staged`). Holding the
execution's lock across the hand-over makes seq order equal LSN order for each execution, while
appends of different executions share the WAL's group commit.

`Staging` holds what the store knows of each execution it records (`tracedb.recorder.state.ExecutionTable`),
applies the redaction rules before anything is encoded, and turns the WAL's refusals into the
store's errors. The store (`tracedb.recorder.store.Store`) builds one and offers it as `store.staging`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Optional

import wal

from tracedb.reads import reader as reads
from tracedb.records.codec import (
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
from tracedb.config import Config
from tracedb.errors import (
    ExecutionClosedError,
    ExecutionExistsError,
    ExecutionNotFoundError,
    InvalidInputError,
    RecordingFailedError,
    StoreClosedError,
)
from tracedb.records.ids import new_execution_id
from tracedb.records.outcomes import event_facts
from tracedb.records.record import (
    FINAL_RESPONSE,
    FLAGGABLE_STATUSES,
    STATUS_COMPLETED,
    STATUS_INCOMPLETE,
    STATUS_INVALIDATED,
    STATUS_RUNNING,
    compute_envelope_hash,
)
from tracedb.records.redaction import Rules, redact
from tracedb.recorder.state import PENDING_LSN, ExecutionState, ExecutionTable, StagedBatch, StagedStart, StageMiss
from tracedb.records.validation import (
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

_TOO_LARGE_HINT = "store large blobs elsewhere and record a reference"
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


class _AppendNow:
    """The sync API's sink: each record is appended and durable before `put` returns."""

    __slots__ = ("staging",)

    def __init__(self, staging: "Staging"):
        self.staging = staging

    def put(self, data: bytes, hint, state, closing: bool) -> int:
        return self.staging._append(data, hint)


class Staging:
    """Numbers and closes the executions of one store, handing each record to a sink.

    `closed` is set by the store when it closes (every call is refused from then on);
    `note_append` is the compaction scheduler's (`tracedb.recorder.scheduler.CompactionScheduler.note_append`):
    call it once records are durable, it wakes the compactor when a batch's worth waits.
    `hinting`: whether event records carry a compaction hint (the scheduler sets it while the
    compactor runs in this process).
    """

    def __init__(self, config: Config, wal_: "wal.Wal", clock: Callable[[], int], read_engine, redactor):
        self.config = config
        self.wal = wal_
        self.clock = clock
        self.read_engine = read_engine  # for the blocking look-ups of executions only the database knows
        self.redactor = redactor  # a tracedb.records.redaction.Redactor, or None (off)
        self.executions = ExecutionTable()
        self.appender = _AppendNow(self)  # the sync API's sink
        self.closed = False
        self.hinting = False
        self.note_append: Callable[[], None] = _nothing
        self._disabled_seqs: dict[str, int] = {}

    def check_recording(self, what: str) -> None:
        """StoreClosedError once the store closed; RecordingFailedError once the WAL failed."""
        if self.closed:
            raise StoreClosedError()
        failed = self.wal.failed
        if failed is not None:
            raise RecordingFailedError(str(failed.message), hint=failed.hint)

    # -- the WAL -------------------------------------------------------------------------
    def _append(self, data: bytes, hint=None) -> int:
        try:
            lsn = self.wal.append(data, hint)
        except _WAL_REFUSALS as e:
            raise _refusal(e) from None
        self.note_append()
        return lsn

    def append_future(self, payloads: list[bytes], loop, hints=None) -> asyncio.Future:
        """Queue records on the WAL's group commit; the future (of `loop`) resolves to their LSNs
        once they are durable."""
        try:
            return self.wal.append_future(payloads, loop, hints)
        except _WAL_REFUSALS as e:
            raise _refusal(e) from None

    def append_one_future(self, data: bytes, loop, hint=None) -> asyncio.Future:
        """Queue one record on the group commit; the future (of `loop`) resolves to its LSN once
        it is durable. The WAL writes the record even if the future is cancelled."""
        try:
            return self.wal.append_one_future(data, loop, hint)
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
        self.note_append()
        return fut

    # -- numbering and closing executions: one implementation for every path -----------------
    def _held(self, execution_id: Any, expected_seq: Optional[int] = None) -> ExecutionState:
        """The state of an execution held in memory, or StageMiss."""
        if not isinstance(execution_id, str):
            raise InvalidInputError(f"execution_id must be a string, not {type(execution_id).__name__}")
        state = self.executions.get(execution_id)
        if state is None:
            raise StageMiss(execution_id, None)
        if expected_seq is not None and expected_seq != state.next_seq:
            raise StageMiss(execution_id, state.next_seq)
        return state

    def not_held_error(self, execution_id: str) -> Exception:
        """Blocking: the error for an execution not held in memory (closed, or unknown)."""
        status = reads.trace_status(self.read_engine, execution_id)
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
        self.check_recording("start")
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
        rules = self.redactor.for_intent(intent) if self.redactor is not None else None
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
        state = self.executions.reserve(execution_id, now)
        if state is None:
            raise ExecutionExistsError(execution_id)
        state.rules = rules
        return StagedStart(execution_id, envelope_hash, data, state, explicit, parent_execution_id, forked_at_seq)

    def check_new_in_db(self, start: StagedStart) -> None:
        """Blocking: refuse an explicit id the database already holds, a missing parent, or a fork
        point past the parent's events."""
        if start.state is None:
            return
        if start.explicit and reads.trace_status(self.read_engine, start.execution_id) is not None:
            raise ExecutionExistsError(start.execution_id)
        parent = start.parent_execution_id
        if parent is None:
            return
        held = self.executions.get(parent)
        if held is not None:
            status, last_seq = held.status, held.next_seq - 1
        else:
            found = reads.trace_status_and_last_seq(self.read_engine, parent)
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
            self.executions.unreserve(start.state)

    def stage_event(self, sink, execution_id: str, type_: str, payload: Any, expected_seq: Optional[int] = None) -> int:
        """Check and number one event, handing its WAL record to `sink`; returns its seq.

        Raises StageMiss when the execution is not held in memory, or when `expected_seq` (the
        seq the caller expects the event to get) is not the execution's next seq: the caller
        resolves those off the hot path (a resend, a closed execution, an unknown id).
        """
        if self.closed or self.wal.failed is not None:
            self.check_recording("event")
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
        self.check_recording("finish")
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
        if rules is not None and rules.might_match(parsed, pj):
            value, changed = redact(parsed, rules)
            if changed:
                pj = payload_json(value, type_)
                parsed = value
        facts = event_facts(type_, pj, parsed)
        data = encode_event(execution_id, seq, type_, pj, now, facts)
        if len(data) > wal.MAX_PAYLOAD_BYTES:
            check_record_size(data)
        hint = EventFrame(execution_id, seq, type_, event_payload_offset(data, pj), now, facts) if self.hinting else None
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
        rules = self.redactor.for_intent(intent) if self.redactor is not None else None
        return value if rules is None else redact(value, rules)[0]

    def stage_status_change(self, sink, execution_id: str, op: str, text: str, *, held_only: bool = False) -> bool:
        """Hand an invalidation (OP_INVALIDATE) or a recording_failure flag to `sink`. Invalidating
        an invalidated execution is a no-op. An execution only the database knows is looked up
        there (blocking); with `held_only`, False is returned for it instead."""
        validate_text(text, STATUS_TEXT_KEY[op])
        self.check_recording(op)
        if not self.config.enabled:
            return True
        if not isinstance(execution_id, str):
            raise InvalidInputError(f"execution_id must be a string, not {type(execution_id).__name__}")
        state = self.executions.get(execution_id)
        if state is None:
            if held_only:
                return False
            status = reads.trace_status(self.read_engine, execution_id)
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
        self.check_recording("abandon")
        state = self.executions.get(execution_id)
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

    def record_whole(
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
    ) -> StagedStart:
        """The body of `Store.record_execution` (its docstring has the parameters): every record
        checked, redacted and encoded before the first is appended, then all of them in one WAL
        append. Blocking (it appends and waits for the fdatasync); returns the start, staged."""
        events = tuple(events)
        times = _given_times(recorded_at_ns, len(events) + (response is not None))
        start = self.reserve_start(
            intent, envelope, execution_id, None, None, created_at_ns, meta=meta,
        )
        try:
            self.check_new_in_db(start)
            state = start.state
            if state is None:  # recording disabled
                return start
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
                    lsns = self.wal.append_many(payloads, hints or None)
                except _WAL_REFUSALS as e:
                    raise _refusal(e) from None
                state.next_seq = seq + 1
                state.last_activity_ns = now
                state.last_lsn = lsns[-1]
                state.status = status
            self.note_append()
        finally:
            self.cancel_start(start)
        return start

    def open_states(self) -> list[ExecutionState]:
        """A snapshot of the executions recording (status running)."""
        return self.executions.with_status(STATUS_RUNNING)

    def mark_incomplete(self, states: list[ExecutionState], why: str, idle_since_ns: Optional[int] = None) -> int:
        """Mark `states` incomplete now, each record appended at once; returns how many changed
        (with `idle_since_ns`, one with activity since then is left running)."""
        return sum(self._stage_incomplete(self.appender, s, why, idle_since_ns) for s in states)

    def sweep_idle(self, now_ns: Optional[int] = None) -> int:
        """Mark executions with no event for `idle_timeout_s` incomplete; returns how many.

        The compaction scheduler's thread calls it; tests call it with a fake clock.
        """
        idle_s = self.config.idle_timeout_s
        if idle_s <= 0 or self.closed:
            return 0
        now = self.clock() if now_ns is None else now_ns
        limit = now - int(idle_s * 1e9)
        idle = [s for s in self.open_states() if s.last_activity_ns <= limit]
        if not idle:
            return 0
        return self.mark_incomplete(idle, "idle", idle_since_ns=limit)

    # -- what the sidecar and the OTLP ingest ask on their hot path --------------------------
    def next_seq(self, execution_id: str) -> Optional[int]:
        """The seq the next event of an execution held in memory gets; None if only the database
        knows the execution (closed and compacted, or never seen)."""
        state = self.executions.get(execution_id)
        return None if state is None else state.next_seq

    def status_of(self, execution_id: str) -> Optional[str]:
        """An execution's status, from memory or else the database (blocking); None if unknown."""
        state = self.executions.get(execution_id)
        if state is not None:
            return state.status
        return reads.trace_status(self.read_engine, execution_id)

    @property
    def open_executions(self) -> int:
        """How many executions are recording (status running)."""
        return self.executions.count(STATUS_RUNNING)


def _nothing() -> None:
    """`Staging.note_append` until the store hands it the scheduler's."""


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
