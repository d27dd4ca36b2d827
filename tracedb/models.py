"""The projection's tables: `traces`, `trace_steps`, `compaction_checkpoint`.

The schema is dialect-neutral on purpose: JSON through `sa.JSON`, times as BigInteger nanoseconds
since the epoch (UTC), no SQLite-only types, so that the same Alembic revisions serve SQLite and
PostgreSQL. Tables are created and changed only by migrations/ (see `tracedb.db.migrate`); a test
checks that the migrated schema equals these models.
"""

from __future__ import annotations

from typing import Any, Optional

import sqlalchemy as sa
from pydantic import ConfigDict
from sqlmodel import Field, SQLModel

from .paging import encode_cursor
from .record import STATUS_RUNNING, utc_iso
from .validation import ID_LENGTH, TYPE_LENGTH


class Trace(SQLModel, table=True):
    """One row per execution: its header, envelope, final response and lifecycle."""

    __tablename__ = "traces"
    __table_args__ = (
        # Pages of executions, newest first, continue after (created_at_ns, execution_id).
        sa.Index("ix_traces_created_id", "created_at_ns", "execution_id"),
        sa.Index("ix_traces_status_created_id", "status", "created_at_ns", "execution_id"),
        sa.Index("ix_traces_parent", "parent_execution_id"),
    )

    execution_id: str = Field(sa_column=sa.Column(sa.String(ID_LENGTH), primary_key=True))
    # Which recorder (WAL) wrote it: many recorders may compact into one PostgreSQL database.
    recorder_id: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    intent: Optional[str] = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    status: str = Field(sa_column=sa.Column(sa.String(16), nullable=False))
    replayable: bool = Field(sa_column=sa.Column(sa.Boolean, nullable=False))
    replayable_reason: Optional[str] = Field(
        default=None, sa_column=sa.Column(sa.String(32), nullable=True)
    )
    # Free text from the operator (invalidate --reason) or the recorder (why it was marked).
    status_note: Optional[str] = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    envelope: Any = Field(sa_column=sa.Column(sa.JSON, nullable=False))
    envelope_hash: str = Field(sa_column=sa.Column(sa.String(80), nullable=False))
    router_decision: Any = Field(default=None, sa_column=sa.Column(sa.JSON(none_as_null=True)))
    final_response: Any = Field(default=None, sa_column=sa.Column(sa.JSON(none_as_null=True)))
    last_seq: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    created_at_ns: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    updated_at_ns: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    parent_execution_id: Optional[str] = Field(
        default=None, sa_column=sa.Column(sa.String(ID_LENGTH), nullable=True)
    )
    forked_at_seq: Optional[int] = Field(default=None, sa_column=sa.Column(sa.Integer, nullable=True))
    pinned: bool = Field(default=False, sa_column=sa.Column(sa.Boolean, nullable=False))


class TraceStep(SQLModel, table=True):
    """One recorded event of an execution. The primary key (execution_id, seq) is also the index
    every read uses: the steps of one execution in seq order."""

    __tablename__ = "trace_steps"

    execution_id: str = Field(
        sa_column=sa.Column(
            sa.String(ID_LENGTH),
            sa.ForeignKey("traces.execution_id", ondelete="CASCADE", name="fk_trace_steps_trace"),
            primary_key=True,
        )
    )
    seq: int = Field(sa_column=sa.Column(sa.Integer, primary_key=True, autoincrement=False))
    type: str = Field(sa_column=sa.Column(sa.String(TYPE_LENGTH), nullable=False))
    payload: Any = Field(default=None, sa_column=sa.Column(sa.JSON, nullable=True))
    recorded_at_ns: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    # The WAL record this step came from: ties the projection back to the log for debugging.
    lsn: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))


class CompactionCheckpoint(SQLModel, table=True):
    """The last WAL LSN applied, per recorder; committed in the same transaction as the rows."""

    __tablename__ = "compaction_checkpoint"

    recorder_id: str = Field(sa_column=sa.Column(sa.String(64), primary_key=True))
    applied_lsn: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    updated_at_ns: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))


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


metadata = SQLModel.metadata
traces = Trace.__table__
trace_steps = TraceStep.__table__
compaction_checkpoint = CompactionCheckpoint.__table__

TERMINAL_STATUSES = ("completed", "incomplete", "invalidated")
