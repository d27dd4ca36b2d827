"""traces, trace_steps, compaction_checkpoint

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "traces",
        sa.Column("execution_id", sa.String(128), primary_key=True),
        sa.Column("recorder_id", sa.String(64), nullable=False),
        sa.Column("intent", sa.Text, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("replayable", sa.Boolean, nullable=False),
        sa.Column("replayable_reason", sa.String(32), nullable=True),
        sa.Column("status_note", sa.Text, nullable=True),
        sa.Column("envelope", sa.JSON, nullable=False),
        sa.Column("envelope_hash", sa.String(80), nullable=False),
        sa.Column("router_decision", sa.JSON, nullable=True),
        sa.Column("final_response", sa.JSON, nullable=True),
        sa.Column("last_seq", sa.Integer, nullable=False),
        sa.Column("created_at_ns", sa.BigInteger, nullable=False),
        sa.Column("updated_at_ns", sa.BigInteger, nullable=False),
        sa.Column("parent_execution_id", sa.String(128), nullable=True),
        sa.Column("forked_at_seq", sa.Integer, nullable=True),
        sa.Column("pinned", sa.Boolean, nullable=False),
    )
    op.create_index("ix_traces_status_created", "traces", ["status", "created_at_ns"])
    op.create_index("ix_traces_created", "traces", ["created_at_ns"])
    op.create_index("ix_traces_parent", "traces", ["parent_execution_id"])
    op.create_table(
        "trace_steps",
        sa.Column("execution_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False, autoincrement=False),
        sa.Column("type", sa.String(128), nullable=False),
        sa.Column("payload", sa.JSON, nullable=True),
        sa.Column("recorded_at_ns", sa.BigInteger, nullable=False),
        sa.Column("lsn", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("execution_id", "seq"),
        sa.ForeignKeyConstraint(
            ["execution_id"],
            ["traces.execution_id"],
            name="fk_trace_steps_trace",
            ondelete="CASCADE",
        ),
    )
    op.create_table(
        "compaction_checkpoint",
        sa.Column("recorder_id", sa.String(64), primary_key=True),
        sa.Column("applied_lsn", sa.BigInteger, nullable=False),
        sa.Column("updated_at_ns", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("compaction_checkpoint")
    op.drop_table("trace_steps")
    op.drop_index("ix_traces_parent", table_name="traces")
    op.drop_index("ix_traces_created", table_name="traces")
    op.drop_index("ix_traces_status_created", table_name="traces")
    op.drop_table("traces")
