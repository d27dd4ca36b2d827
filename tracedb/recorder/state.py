"""What a store knows of each execution it records, and the batches that carry its records.

The store keeps one `ExecutionState` per execution it is recording (status, next seq). Closed
executions stay until the compactor has applied their last record, so a closed execution is refused
without a database query and an explicit id is never started twice.

Numbering an event and closing an execution happen in one place (`Staging.stage_*`), under the
execution's lock, and hand the numbered WAL record to a *sink*: appended at once (the sync API),
queued on the WAL's group commit (the asyncio API), or framed into a `StagedBatch` that one WAL
call appends later (the sidecar).
"""

from __future__ import annotations

import sys
import threading
from typing import Optional, Protocol

from tracedb.records.record import STATUS_RUNNING

STARTING = "starting"  # reserved by a start whose record is not staged yet
PENDING_LSN = sys.maxsize  # a closing record is handed over, its LSN not yet durable


class ExecutionState:
    """An execution this store is recording (or closed, until its last record is compacted)."""

    __slots__ = ("execution_id", "status", "next_seq", "last_activity_ns", "last_lsn", "lock", "rules")

    def __init__(self, execution_id: str, now_ns: int):
        self.execution_id = execution_id
        self.status = STARTING
        self.next_seq = 1
        self.last_activity_ns = now_ns
        self.last_lsn = 0
        self.lock = threading.Lock()
        self.rules = None  # the redaction rules of its intent (tracedb.records.redaction.Rules), if any

    def settle(self, lsn: int) -> None:
        """The closing record handed over is durable at `lsn`."""
        if self.last_lsn == PENDING_LSN:
            self.last_lsn = lsn


class RecordSink(Protocol):
    """Where a numbered record goes; `put` is called under the execution's lock, in seq order."""

    def put(self, data: bytes, hint: Optional[tuple], state: Optional[ExecutionState], closing: bool) -> Optional[int]:
        """Take one record; return its LSN if it is durable already, None if it will be later
        (then, if `closing`, call `state.settle(lsn)` once it is)."""


class StageMiss(Exception):
    """A record cannot be staged on the hot path: the execution is not held in memory
    (`next_seq` None), or the caller's expected seq is not `next_seq`."""

    def __init__(self, execution_id: str, next_seq: Optional[int]):
        super().__init__(execution_id, next_seq)
        self.execution_id = execution_id
        self.next_seq = next_seq


class StagedStart:
    """A start validated and reserved by `Staging.reserve_start`, not yet staged.

    `state` is None when recording is disabled; `data` is the start's WAL record."""

    __slots__ = ("execution_id", "envelope_hash", "data", "state", "explicit", "parent_execution_id", "forked_at_seq")

    def __init__(self, execution_id, envelope_hash, data, state, explicit, parent_execution_id, forked_at_seq=None):
        self.execution_id = execution_id
        self.envelope_hash = envelope_hash
        self.data = data
        self.state = state
        self.explicit = explicit
        self.parent_execution_id = parent_execution_id
        self.forked_at_seq = forked_at_seq


class StagedBatch:
    """Records staged for one WAL append (`Staging.append_staged`); a `RecordSink`."""

    __slots__ = ("payloads", "closing", "hints")

    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self.hints: dict[int, tuple] = {}  # index in payloads -> the event's compaction hint
        self.closing: list[tuple[int, ExecutionState]] = []  # (index in payloads, state) of closing records

    def put(self, data: bytes, hint: Optional[tuple], state: Optional[ExecutionState], closing: bool) -> None:
        """Frame one record into the batch."""
        if hint is not None:
            self.hints[len(self.payloads)] = hint
        if closing and state is not None:
            self.closing.append((len(self.payloads), state))
        self.payloads.append(data)

    def settle(self, lsns: list[int]) -> None:
        """The batch is durable: the closing records' states learn their LSNs."""
        for i, state in self.closing:
            state.settle(lsns[i])


class ExecutionTable:
    """The executions a store holds in memory, by id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.states: dict[str, ExecutionState] = {}

    def get(self, execution_id: str) -> Optional[ExecutionState]:
        """The state of an execution whose start is staged, else None."""
        state = self.states.get(execution_id)
        if state is None or state.status == STARTING:
            return None
        return state

    def reserve(self, execution_id: str, now_ns: int) -> Optional[ExecutionState]:
        """A new STARTING state for `execution_id`; None if the id is held already."""
        with self.lock:
            if execution_id in self.states:
                return None
            state = self.states[execution_id] = ExecutionState(execution_id, now_ns)
            return state

    def unreserve(self, state: ExecutionState) -> None:
        """Drop a reservation whose start was never staged (no-op once it was)."""
        with self.lock:
            if self.states.get(state.execution_id) is state and state.status == STARTING:
                del self.states[state.execution_id]

    def with_status(self, status: str) -> list[ExecutionState]:
        """A snapshot of the states that have `status`."""
        with self.lock:
            return [s for s in self.states.values() if s.status == status]

    def count(self, status: str) -> int:
        """How many held executions have `status` (no lock: a gauge)."""
        return sum(1 for s in list(self.states.values()) if s.status == status)

    def forget_applied(self, applied_lsn: int) -> None:
        """Forget closed executions whose last record the database holds."""
        with self.lock:
            done = [
                eid for eid, s in self.states.items()
                if s.status not in (STATUS_RUNNING, STARTING) and s.last_lsn <= applied_lsn
            ]
            for eid in done:
                del self.states[eid]
