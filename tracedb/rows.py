"""The read API's typed rows: a listed execution as a frozen dataclass, made from its `traces` row.

Plain Python on purpose: a listing builds its rows without importing pydantic or SQLAlchemy,
whose imports cost a read command more than the rest of its work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from .paging import encode_cursor
from .record import STATUS_RUNNING, utc_iso


@dataclass(frozen=True)
class TraceSummary:
    """One execution without its events, as the read API lists it: a `traces` row with typed
    fields (SQLite's 0/1 become booleans), with the time of its last event."""

    execution_id: str
    created_at_ns: int
    updated_at_ns: int
    intent: Optional[str]
    status: str
    replayable: bool
    replayable_reason: Optional[str]
    last_seq: int
    pinned: bool
    parent_execution_id: Optional[str] = None
    last_event_at_ns: Optional[int] = None

    @classmethod
    def from_row(cls, row: Mapping) -> "TraceSummary":
        """The summary of a `traces` row (a mapping of its columns; others are ignored)."""
        return cls(
            row["execution_id"], row["created_at_ns"], row["updated_at_ns"], row["intent"], row["status"],
            bool(row["replayable"]), row["replayable_reason"], row["last_seq"], bool(row["pinned"]),
            row["parent_execution_id"], row.get("last_event_at_ns"),
        )

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
