"""The projection's tables: `traces`, `trace_steps`, `compaction_checkpoint`.

The schema is dialect-neutral on purpose: JSON through `sa.JSON`, times as BigInteger nanoseconds
since the epoch (UTC), no SQLite-only types, so that the same Alembic revisions serve SQLite and
PostgreSQL. Tables are created and changed only by migrations/ (see `tracedb.db.migrate`); a test
checks that the migrated schema equals these tables. They are SQLAlchemy Core tables: every
write is a bulk statement, and a read command that loads them pays no model layer at start-up.
The read API's typed rows are `tracedb.rows`.
"""

from __future__ import annotations

import sqlalchemy as sa

from .validation import ID_LENGTH, TYPE_LENGTH

metadata = sa.MetaData()

# One row per execution: its header, envelope, final response and lifecycle.
traces = sa.Table(
    "traces",
    metadata,
    sa.Column("execution_id", sa.String(ID_LENGTH), primary_key=True),
    # Which recorder (WAL) wrote it: many recorders may compact into one PostgreSQL database.
    sa.Column("recorder_id", sa.String(64), nullable=False),
    sa.Column("intent", sa.Text, nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("replayable", sa.Boolean, nullable=False),
    sa.Column("replayable_reason", sa.String(32), nullable=True),
    # Free text from the operator (invalidate --reason) or the recorder (why it was marked).
    sa.Column("status_note", sa.Text, nullable=True),
    sa.Column("envelope", sa.JSON, nullable=False),
    sa.Column("envelope_hash", sa.String(80), nullable=False),
    sa.Column("router_decision", sa.JSON(none_as_null=True)),
    sa.Column("final_response", sa.JSON(none_as_null=True)),
    sa.Column("last_seq", sa.Integer, nullable=False),
    sa.Column("created_at_ns", sa.BigInteger, nullable=False),
    sa.Column("updated_at_ns", sa.BigInteger, nullable=False),
    sa.Column("parent_execution_id", sa.String(ID_LENGTH), nullable=True),
    sa.Column("forked_at_seq", sa.Integer, nullable=True),
    sa.Column("pinned", sa.Boolean, nullable=False),
    # What the record says about itself beyond IntentusNet's shape (migration 0003): the stored
    # envelope's hash when redaction rewrote it, an imported header as it was written.
    sa.Column("meta", sa.JSON(none_as_null=True), nullable=True),
    # CRC32C of the stored text of router_decision, final_response and meta (migration 0004,
    # tracedb.checksums): reads and verify refuse a value that no longer matches.
    sa.Column("router_decision_crc", sa.BigInteger, nullable=True),
    sa.Column("final_response_crc", sa.BigInteger, nullable=True),
    sa.Column("meta_crc", sa.BigInteger, nullable=True),
    # Pages of executions, newest first, continue after (created_at_ns, execution_id).
    sa.Index("ix_traces_created_id", "created_at_ns", "execution_id"),
    sa.Index("ix_traces_status_created_id", "status", "created_at_ns", "execution_id"),
    sa.Index("ix_traces_parent", "parent_execution_id"),
)

# One recorded event of an execution. The primary key (execution_id, seq) is also the index every
# read uses: the steps of one execution in seq order.
trace_steps = sa.Table(
    "trace_steps",
    metadata,
    sa.Column(
        "execution_id",
        sa.String(ID_LENGTH),
        sa.ForeignKey("traces.execution_id", ondelete="CASCADE", name="fk_trace_steps_trace"),
        primary_key=True,
    ),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("type", sa.String(TYPE_LENGTH), nullable=False),
    sa.Column("payload", sa.JSON, nullable=True),
    sa.Column("recorded_at_ns", sa.BigInteger, nullable=False),
    # The WAL record this step came from: ties the projection back to the log for debugging.
    sa.Column("lsn", sa.BigInteger, nullable=False),
    # CRC32C of the payload's stored text (migration 0004, tracedb.checksums).
    sa.Column("payload_crc", sa.BigInteger, nullable=True),
)

# The last WAL LSN applied, per recorder; committed in the same transaction as the rows.
compaction_checkpoint = sa.Table(
    "compaction_checkpoint",
    metadata,
    sa.Column("recorder_id", sa.String(64), primary_key=True),
    sa.Column("applied_lsn", sa.BigInteger, nullable=False),
    sa.Column("updated_at_ns", sa.BigInteger, nullable=False),
)

TERMINAL_STATUSES = ("completed", "incomplete", "invalidated")
