"""The read API's typed rows: a listed execution as a SQLModel, validated from its `traces` row.

Imported when a listing is read, not by every command: pydantic's import is the largest part of
a command's start-up.
"""

from __future__ import annotations

from typing import Optional

from pydantic import ConfigDict
from sqlmodel import SQLModel

from .paging import encode_cursor
from .record import STATUS_RUNNING, utc_iso


class TraceSummary(SQLModel):
    """One execution without its events, as the read API lists it: a `traces` row validated into
    typed fields (SQLite's 0/1 become booleans), with the time of its last event."""

    model_config = ConfigDict(frozen=True)

    execution_id: str
    created_at_ns: int
    updated_at_ns: int
    intent: Optional[str] = None
    status: str
    replayable: bool
    replayable_reason: Optional[str] = None
    last_seq: int
    pinned: bool
    parent_execution_id: Optional[str] = None
    last_event_at_ns: Optional[int] = None

    @property
    def created_utc_iso(self) -> str:
        """The creation time, ISO 8601 UTC."""
        return utc_iso(self.created_at_ns)

    @property
    def duration_ns(self) -> Optional[int]:
        """Creation to last event, for an execution that is no longer running.

        The last event, not updated_at_ns: an invalidation or recovery much later moves
        updated_at_ns, and would count the operator's delay as the execution's run time.
        """
        if self.status == STATUS_RUNNING or self.last_event_at_ns is None:
            return None
        return max(0, self.last_event_at_ns - self.created_at_ns)

    @property
    def cursor(self) -> str:
        """The cursor that continues a newest-first listing after this execution."""
        return encode_cursor(self.created_at_ns, self.execution_id)

    def to_dict(self) -> dict:
        """The JSON of `inspect --list --json`."""
        d = self.duration_ns
        return {
            "execution_id": self.execution_id,
            "created_utc_iso": self.created_utc_iso,
            "intent": self.intent,
            "status": self.status,
            "replayable": self.replayable,
            "replayable_reason": self.replayable_reason,
            "last_seq": self.last_seq,
            "pinned": self.pinned,
            "parent_execution_id": self.parent_execution_id,
            "duration_ms": None if d is None else round(d / 1e6, 3),
            "cursor": self.cursor,
        }
