"""The read API's typed rows: a listed execution as a frozen dataclass, made from its `traces` row.

Plain Python on purpose: a listing builds its rows without importing pydantic or SQLAlchemy,
whose imports cost a read command more than the rest of its work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import orjson

from tracedb.reads.paging import encode_cursor
from tracedb.records.record import STATUS_RUNNING, utc_iso


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
    # What it came to and cost (tracedb.records.outcomes): outcome, first error as an object
    # {seq, type, code, message} or None, models, tokens, cost in USD (None: unknown).
    outcome: Optional[str] = None
    error: Optional[dict] = None
    models: tuple = ()
    input_tokens: Optional[int] = None
    output_tokens: Optional[int] = None
    cost_usd: Optional[float] = None

    @classmethod
    def from_row(cls, row: Mapping) -> "TraceSummary":
        """The summary of a `traces` row (a mapping of its columns; others are ignored)."""
        return cls(
            row["execution_id"], row["created_at_ns"], row["updated_at_ns"], row["intent"], row["status"],
            bool(row["replayable"]), row["replayable_reason"], row["last_seq"], bool(row["pinned"]),
            row["parent_execution_id"], row.get("last_event_at_ns"), row.get("outcome"), error_of(row),
            tuple(models_of(row.get("models"))), row.get("input_tokens"), row.get("output_tokens"), row.get("cost_usd"),
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
            "outcome": self.outcome,
            "error": self.error,
            "models": list(self.models),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": usd(self.cost_usd),
            "cursor": self.cursor,
        }


def usd(cost: Optional[float]) -> Optional[float]:
    """A cost in USD as shown: the float sum of many prices rounded to 1e-10 USD (0.00036, not
    0.00035999999999999997); None (unknown) stays None."""
    return None if cost is None else round(float(cost), 10)


def models_of(value) -> list:
    """The `models` column as a list (SQLite hands its JSON back as text)."""
    if isinstance(value, str):
        value = orjson.loads(value)
    return list(value) if isinstance(value, list) else []


def outcome_view(row: Mapping) -> dict:
    """What an execution came to and cost, from its `traces` row: outcome, error (None or
    {seq, type, code, message}), models, input_tokens, output_tokens, cost_usd (None: unknown)."""
    return {
        "outcome": row.get("outcome"), "error": error_of(row), "models": models_of(row.get("models")),
        "input_tokens": row.get("input_tokens"), "output_tokens": row.get("output_tokens"),
        "cost_usd": usd(row.get("cost_usd")),
    }


def event_dicts(events) -> list:
    """Events as the read API gives them: {seq, type, payload, error} (error: None or {code,
    message}, what a failed call recorded)."""
    return [{"seq": e.seq, "type": e.type, "payload": e.payload, "error": e.error} for e in events]


def errored_events(events) -> list:
    """{seq, type, code, message} of each event that records an error."""
    return [{"seq": e.seq, "type": e.type, **err} for e in events if (err := e.error) is not None]


def error_of(row: Mapping) -> Optional[dict]:
    """An execution's first error, {seq, type, code, message}, or None (a `traces` row's columns)."""
    if row.get("error_seq") is None:
        return None
    return {"seq": row["error_seq"], "type": row.get("error_type"), "code": row.get("error_code"),
            "message": row.get("error_message")}
