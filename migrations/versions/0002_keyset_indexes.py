"""Indexes for listing executions newest first a page at a time (keyset pagination)

A page continues after (created_at_ns, execution_id), so both indexes end with the execution id:
(created_at_ns, execution_id) for the plain listing, (status, created_at_ns, execution_id) for a
listing by status. They serve every query the indexes they replace served (same leading columns),
so those two go: each index costs the compactor a write per row.

Revision ID: 0002
Revises: 0001
Create Date: 2025-02-01
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_traces_created_id", "traces", ["created_at_ns", "execution_id"])
    op.create_index("ix_traces_status_created_id", "traces", ["status", "created_at_ns", "execution_id"])
    op.drop_index("ix_traces_created", table_name="traces")
    op.drop_index("ix_traces_status_created", table_name="traces")


def downgrade() -> None:
    op.create_index("ix_traces_status_created", "traces", ["status", "created_at_ns"])
    op.create_index("ix_traces_created", "traces", ["created_at_ns"])
    op.drop_index("ix_traces_status_created_id", table_name="traces")
    op.drop_index("ix_traces_created_id", table_name="traces")
