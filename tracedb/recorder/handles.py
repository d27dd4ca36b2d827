"""Handles on one execution being recorded, over any recorder with the by-id API.

A recorder is the embedded store (`tracedb.open`, `tracedb.open_async`) or a client of the sidecar:
each has `event(id, type, payload)`, `finish(id, response)`, `invalidate(id, reason)`,
`abandon(id, reason)`, `mark_recording_failure(id, detail)` and `get(id)`. The handle binds the id.
"""

from __future__ import annotations

from typing import Any, Awaitable

from tracedb.records.record import ExecutionRecord


class Execution:
    """One execution being recorded: `event()`, then `finish()`."""

    def __init__(self, recorder, execution_id: str, envelope_hash: str):
        self.recorder = recorder
        self.execution_id = execution_id
        self.envelope_hash = envelope_hash

    def event(self, type: str, payload: Any = None) -> int:
        """Record an event; returns its seq once durable."""
        return self.recorder.event(self.execution_id, type, payload)

    def finish(self, response: dict) -> int:
        """Record the final response (FINAL_RESPONSE); returns its seq once durable."""
        return self.recorder.finish(self.execution_id, response)

    def invalidate(self, reason: str) -> None:
        """Mark this execution invalidated (manually_invalidated)."""
        self.recorder.invalidate(self.execution_id, reason)

    def abandon(self, reason: str) -> None:
        """Mark this execution incomplete now: its agent is gone and will record no more."""
        self.recorder.abandon(self.execution_id, reason)

    def mark_recording_failure(self, detail: str) -> None:
        """Flag this execution not replayable (recording_failure): records of it were lost."""
        self.recorder.mark_recording_failure(self.execution_id, detail)

    def get(self) -> ExecutionRecord:
        """This execution's record so far."""
        return self.recorder.get(self.execution_id)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.execution_id!r})"


class AsyncExecution:
    """The asyncio twin of `Execution`."""

    def __init__(self, recorder, execution_id: str, envelope_hash: str):
        self.recorder = recorder
        self.execution_id = execution_id
        self.envelope_hash = envelope_hash

    def event(self, type: str, payload: Any = None) -> Awaitable[int]:
        """Record an event; await the result for its seq, which comes once it is durable.
        (The recorder's own coroutine, returned as it is: one frame less per event.)"""
        return self.recorder.event(self.execution_id, type, payload)

    def finish(self, response: dict) -> Awaitable[int]:
        """Record the final response; await the result for its seq, which comes once durable."""
        return self.recorder.finish(self.execution_id, response)

    async def invalidate(self, reason: str) -> None:
        """Mark this execution invalidated (manually_invalidated)."""
        await self.recorder.invalidate(self.execution_id, reason)

    async def abandon(self, reason: str) -> None:
        """Mark this execution incomplete now: its agent is gone and will record no more."""
        await self.recorder.abandon(self.execution_id, reason)

    async def mark_recording_failure(self, detail: str) -> None:
        """Flag this execution not replayable (recording_failure): records of it were lost."""
        await self.recorder.mark_recording_failure(self.execution_id, detail)

    async def get(self) -> ExecutionRecord:
        """This execution's record so far."""
        return await self.recorder.get(self.execution_id)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.execution_id!r})"
