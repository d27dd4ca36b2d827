"""The projection's tables: `traces`, `trace_steps`, `compaction_checkpoint`.

Each table is declared once, as a SQLModel class (`Trace`, `TraceStep`, `CompactionCheckpoint`):
its fields name the columns with their Python types, and each field's SQLAlchemy column says
exactly what the database holds. The rest of tracedb writes and reads through the SQLAlchemy
Core tables these classes define (`traces = Trace.__table__`, ...): every write is a bulk
statement, with no ORM session or object per row. A read command on SQLite loads neither these
classes nor SQLAlchemy (`tracedb.reads.sqlite`); its typed rows are `tracedb.reads.rows`.

The schema is dialect-neutral on purpose: JSON through `sa.JSON`, times as BigInteger nanoseconds
since the epoch (UTC), no SQLite-only types, so that the same Alembic revisions serve SQLite and
PostgreSQL. Tables are created and changed only by migrations/ (see `tracedb.projection.db.migrate`); a test
checks that the migrated schema equals these tables.
"""

from __future__ import annotations

from typing import Any, Optional

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from tracedb.records.validation import ID_LENGTH, TYPE_LENGTH


def _col(*args, **kwargs) -> Any:
    """A field whose column is exactly `sa.Column(*args, **kwargs)`."""
    return Field(sa_column=sa.Column(*args, **kwargs))


class Trace(SQLModel, table=True):
    """One row per execution: its header, envelope, final response and lifecycle."""

    __tablename__ = "traces"
    __table_args__ = (
        # Pages of executions, newest first, continue after (created_at_ns, execution_id).
        sa.Index("ix_traces_created_id", "created_at_ns", "execution_id"),
        sa.Index("ix_traces_status_created_id", "status", "created_at_ns", "execution_id"),
        sa.Index("ix_traces_parent", "parent_execution_id"),
        # The listing's filters on what an execution came to (migration 0005, tracedb.records.outcomes).
        sa.Index("ix_traces_outcome_created_id", "outcome", "created_at_ns", "execution_id"),
        sa.Index("ix_traces_error_code", "error_code"),
        sa.Index("ix_traces_cost", "cost_usd"),
        # Durations of finished executions in order: percentiles over all time walk it, the
        # total's and each outcome's (tracedb.reads.stats; migrations 0005 and 0006).
        sa.Index(
            "ix_traces_duration", sa.text("(last_event_ns - created_at_ns)"), "created_at_ns", "last_event_ns",
            "outcome",
            sqlite_where=sa.text("outcome <> 'running' AND last_event_ns IS NOT NULL"),
            postgresql_where=sa.text("outcome <> 'running' AND last_event_ns IS NOT NULL"),
        ),
        # The same within each intent: `stats --by intent` over all time walks it (migration 0006).
        sa.Index(
            "ix_traces_intent_duration", "intent", sa.text("(last_event_ns - created_at_ns)"),
            sqlite_where=sa.text("outcome <> 'running' AND last_event_ns IS NOT NULL"),
            postgresql_where=sa.text("outcome <> 'running' AND last_event_ns IS NOT NULL"),
        ),
    )

    execution_id: str = _col("execution_id", sa.String(ID_LENGTH), primary_key=True)
    # Which recorder (WAL) wrote it: many recorders may compact into one PostgreSQL database.
    recorder_id: str = _col("recorder_id", sa.String(64), nullable=False)
    intent: Optional[str] = _col("intent", sa.Text, nullable=True)
    status: str = _col("status", sa.String(16), nullable=False)
    replayable: bool = _col("replayable", sa.Boolean, nullable=False)
    replayable_reason: Optional[str] = _col("replayable_reason", sa.String(32), nullable=True)
    # Free text from the operator (invalidate --reason) or the recorder (why it was marked).
    status_note: Optional[str] = _col("status_note", sa.Text, nullable=True)
    envelope: Any = _col("envelope", sa.JSON, nullable=False)
    envelope_hash: str = _col("envelope_hash", sa.String(80), nullable=False)
    router_decision: Any = _col("router_decision", sa.JSON(none_as_null=True))
    final_response: Any = _col("final_response", sa.JSON(none_as_null=True))
    last_seq: int = _col("last_seq", sa.Integer, nullable=False)
    created_at_ns: int = _col("created_at_ns", sa.BigInteger, nullable=False)
    updated_at_ns: int = _col("updated_at_ns", sa.BigInteger, nullable=False)
    parent_execution_id: Optional[str] = _col("parent_execution_id", sa.String(ID_LENGTH), nullable=True)
    forked_at_seq: Optional[int] = _col("forked_at_seq", sa.Integer, nullable=True)
    pinned: bool = _col("pinned", sa.Boolean, nullable=False)
    # What the record says about itself beyond IntentusNet's shape (migration 0003): the stored
    # envelope's hash when redaction rewrote it, an imported header as it was written.
    meta: Any = _col("meta", sa.JSON(none_as_null=True), nullable=True)
    # CRC32C of the stored text of router_decision, final_response and meta (migration 0004,
    # tracedb.projection.checksums): reads and verify refuse a value that no longer matches.
    router_decision_crc: Optional[int] = _col("router_decision_crc", sa.BigInteger, nullable=True)
    final_response_crc: Optional[int] = _col("final_response_crc", sa.BigInteger, nullable=True)
    meta_crc: Optional[int] = _col("meta_crc", sa.BigInteger, nullable=True)
    # What the execution came to and cost (migration 0005), folded from its events by the
    # compactor (tracedb.records.outcomes): succeeded, failed, incomplete or running; its first error;
    # the models it called, their tokens, and the cost in USD (NULL when a model's price is
    # unknown) with the version of the price table that gave it (NULL when no call was priced).
    outcome: Optional[str] = _col("outcome", sa.String(16), nullable=True)
    error_seq: Optional[int] = _col("error_seq", sa.Integer, nullable=True)
    error_type: Optional[str] = _col("error_type", sa.String(TYPE_LENGTH), nullable=True)
    error_code: Optional[str] = _col("error_code", sa.String(200), nullable=True)
    error_message: Optional[str] = _col("error_message", sa.Text, nullable=True)
    models: Any = _col("models", sa.JSON(none_as_null=True), nullable=True)
    input_tokens: Optional[int] = _col("input_tokens", sa.BigInteger, nullable=True)
    output_tokens: Optional[int] = _col("output_tokens", sa.BigInteger, nullable=True)
    cost_usd: Optional[float] = _col("cost_usd", sa.Float, nullable=True)
    prices_version: Optional[str] = _col("prices_version", sa.String(32), nullable=True)
    # The time of its last event so far: duration = last_event_ns - created_at_ns, in SQL.
    last_event_ns: Optional[int] = _col("last_event_ns", sa.BigInteger, nullable=True)


class TraceStep(SQLModel, table=True):
    """One recorded event of an execution. The primary key (execution_id, seq) is also the index
    every read uses: the steps of one execution in seq order."""

    __tablename__ = "trace_steps"

    execution_id: str = _col(
        "execution_id",
        sa.String(ID_LENGTH),
        sa.ForeignKey("traces.execution_id", ondelete="CASCADE", name="fk_trace_steps_trace"),
        primary_key=True,
    )
    seq: int = _col("seq", sa.Integer, primary_key=True, autoincrement=False)
    type: str = _col("type", sa.String(TYPE_LENGTH), nullable=False)
    payload: Any = _col("payload", sa.JSON, nullable=True)
    recorded_at_ns: int = _col("recorded_at_ns", sa.BigInteger, nullable=False)
    # The WAL record this step came from: ties the projection back to the log for debugging.
    lsn: int = _col("lsn", sa.BigInteger, nullable=False)
    # CRC32C of the payload's stored text (migration 0004, tracedb.projection.checksums).
    payload_crc: Optional[int] = _col("payload_crc", sa.BigInteger, nullable=True)


class CompactionCheckpoint(SQLModel, table=True):
    """The last WAL LSN applied, per recorder; committed in the same transaction as the rows."""

    __tablename__ = "compaction_checkpoint"

    recorder_id: str = _col("recorder_id", sa.String(64), primary_key=True)
    applied_lsn: int = _col("applied_lsn", sa.BigInteger, nullable=False)
    updated_at_ns: int = _col("updated_at_ns", sa.BigInteger, nullable=False)


metadata: sa.MetaData = SQLModel.metadata
traces: sa.Table = Trace.__table__
trace_steps: sa.Table = TraceStep.__table__
compaction_checkpoint: sa.Table = CompactionCheckpoint.__table__

TERMINAL_STATUSES = ("completed", "incomplete", "invalidated")

# SQLite's (migration 0007): the aggregates of `tracedb stats` by grouping key and duration
# bucket of the executions no longer running, kept by compaction a batch at a time
# (tracedb.projection.rollup) and by triggers on `traces` for every other write (their SQL is the
# migrations'). Declared on a MetaData of its own, because PostgreSQL's differs (below);
# tracedb.reads.stats reads it.
sqlite_metadata: sa.MetaData = sa.MetaData()


def _rollup_columns() -> list:
    """The columns both databases' stats_rollup share, PostgreSQL's shard aside."""
    return [
        # 'intent', 'outcome', 'model', 'day' or 'hour' (the total, '*' until migration 0008, is
        # summed from 'outcome').
        sa.Column("dim", sa.String(8), nullable=False),
        # The group's key: char(0) for a NULL intent or model ('' on PostgreSQL), the UTC start of
        # the bucket in ns for day and hour.
        sa.Column("key", sa.Text, nullable=False),
        # The duration's bucket, 16 an octave (migration 0007); -1 below 1 ns; -2 no last event.
        sa.Column("bucket", sa.Integer, nullable=False),
        *(sa.Column(c, sa.BigInteger, nullable=False) for c in (
            "executions", "succeeded", "failed", "incomplete", "input_tokens", "output_tokens", "cost_nano_usd",
            "cost_unknown")),
    ]


stats_rollup: sa.Table = sa.Table(
    "stats_rollup", sqlite_metadata, *_rollup_columns(),
    sa.PrimaryKeyConstraint("dim", "key", "bucket", name="pk_stats_rollup"),
    # Stored in key order: a grouping's rows are one range of the table.
    sqlite_with_rowid=False,
)

# PostgreSQL's (migration 0009): the same, one shard a recorder (`recorder_id`, the executions'
# own), so that recorders compacting at once never update each other's rows; `stats` sums the
# shards. The NULL key is '' there (PostgreSQL's text holds no char(0)).
postgresql_metadata: sa.MetaData = sa.MetaData()
stats_rollup_shards: sa.Table = sa.Table(
    "stats_rollup", postgresql_metadata, *_rollup_columns(),
    sa.Column("recorder_id", sa.String(64), nullable=False),
    sa.PrimaryKeyConstraint("dim", "key", "bucket", "recorder_id", name="pk_stats_rollup"),
)

# SQLite only (migration 0008): a row here, only ever inside compaction's own transaction, says
# that this transaction keeps stats_rollup itself (tracedb.projection.rollup), and the triggers
# do nothing.
stats_rollup_deferred: sa.Table = sa.Table(
    "stats_rollup_deferred", sqlite_metadata,
    sa.Column("one", sa.Integer, nullable=False),
    sa.PrimaryKeyConstraint("one", name="pk_stats_rollup_deferred"),
)
