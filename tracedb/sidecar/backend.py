"""What the sidecar server needs from a recorder, as one small interface.

The server's hot path must not pay a coroutine, a task or a future per event. So a write is
*staged* synchronously, in the order requests arrive (validated, seq assigned, its WAL record
framed into the backend's current batch), and after one socket read's worth of requests the
server calls `commit()`, which appends the whole batch to the WAL and returns one future that
resolves once all of it is durable. Futures of one backend resolve in commit order (the WAL
acknowledges groups in LSN order), which lets the server wait on the last future of a batch.

Some requests need awaited work before they can be staged or answered (a database lookup for an
execution no longer held in memory, comparing a resent event with the recorded one): the stage
method then returns a `Deferred`, and the server runs it while holding back that connection's
later requests, so each connection's requests still take effect in the order they were sent.

`tracedb.sidecar.store_backend.StoreBackend` adapts the embedded store; tests use small fakes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Optional, Protocol

# `Staged.durable` for a write framed into the current batch: it is durable when the future that
# the next `commit()` returns resolves.
IN_BATCH = "in-batch"


class Staged:
    """A staged (or answered) request: its response fields, and what to wait for.

    `durable` is None (answer at once: nothing new to wait for), IN_BATCH, or a future that
    resolves once everything the answer depends on is durable (e.g. a barrier for a repeat).
    """

    __slots__ = ("fields", "durable")

    def __init__(self, fields: dict, durable: Any = None):
        self.fields = fields
        self.durable = durable


class Deferred:
    """A request that needs awaited work first; `awaitable` returns its `Staged`."""

    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Staged]):
        self.awaitable = awaitable


@dataclass
class BackendStats:
    """Numbers the server's /metrics and /health report about the recorder underneath."""

    open_executions: int = 0
    durable_lsn: int = 0
    applied_lsn: int = 0
    wal_bytes: int = 0
    uncompacted_bytes: int = 0
    compaction_lag_records: int = 0
    compaction_lag_s: float = 0.0
    failed: Optional[str] = None
    background_error: Optional[str] = None
    extra: dict = field(default_factory=dict)


class Backend(Protocol):
    """The recorder as the server sees it. Stage methods raise TraceDBError (or
    protocol.ProtocolError) for refused requests, and return Staged or Deferred."""

    def stage_start(
        self,
        intent: str,
        envelope: dict,
        execution_id: Optional[str],
        parent_execution_id: Optional[str],
        forked_at_seq: Optional[int],
    ):
        """Stage a new execution, or recognise a resent start (fields: execution_id,
        envelope_hash, created, last_seq)."""

    def stage_event(self, execution_id: str, type: str, payload: Any, seq: Optional[int]):
        """Stage one event; `seq` is the seq the client expects it to get (None: the next one).
        A `seq` the execution already recorded is answered with the original (duplicate: true).
        The fast path may return the event's seq (an int) instead of a Staged: it is IN_BATCH."""

    def stage_finish(self, execution_id: str, response: dict, seq: Optional[int]):
        """Stage the final response (FINAL_RESPONSE); the execution becomes completed."""

    def stage_invalidate(self, execution_id: str, reason: str):
        """Stage a manual invalidation (replayable_reason manually_invalidated)."""

    def stage_recording_failure(self, execution_id: str, detail: str):
        """Flag an execution not replayable because records of it were lost (replayable_reason
        recording_failure); its status does not change. A client that failed open during an
        outage sends it once the recorder is back."""

    def stage_abandon(self, execution_id: str, reason: str):
        """Mark a running execution incomplete now (its agent died): status incomplete,
        replayable_reason execution_incomplete, events kept. A repeat succeeds."""

    def commit(self) -> Optional[asyncio.Future]:
        """Append the current batch as one WAL group call; its future resolves once durable."""

    def barrier(self) -> Optional[asyncio.Future]:
        """A future resolving once everything committed so far is durable (None: it already is)."""

    async def get(self, execution_id: str) -> dict:
        """The execution's record, `ExecutionRecord.to_dict()` shape."""

    def stats(self) -> BackendStats:
        """Current numbers for metrics (cheap: called on every scrape)."""

    def set_group_observer(self, observer) -> None:
        """Call `observer(records, bytes, fsync_seconds)` after each WAL group commit."""

    async def close(self) -> None:
        """Flush, stop background work, release the data directory."""
