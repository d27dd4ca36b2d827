"""traces: durations of finished executions in order within each intent

`tracedb stats --by intent` over all time reads each intent's percentiles off this index, an
index walk per intent (ORDER BY ... LIMIT 1 OFFSET k), instead of ranking every duration with
window functions (a sort of the whole table). Partial, with the predicate of ix_traces_duration:
a running execution is not in it, so recording into it costs nothing until it finishes.
tracedb.models declares the same index.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_INDEX = (
    "CREATE INDEX ix_traces_intent_duration ON traces (intent, (last_event_ns - created_at_ns)) "
    "WHERE outcome <> 'running' AND last_event_ns IS NOT NULL"
)


def upgrade() -> None:
    op.execute(_INDEX)


def downgrade() -> None:
    op.drop_index("ix_traces_intent_duration", "traces")
