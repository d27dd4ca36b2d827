"""traces: durations of finished executions in order, by intent and with their outcome

`tracedb stats` over all time reads its percentiles off indexes in duration order (an index
walk: ORDER BY ... LIMIT 1 OFFSET k) instead of ranking every duration with window functions
(a sort of the whole table): `ix_traces_intent_duration` (new) for each intent's, and
`ix_traces_duration` for the total's and, now that it carries the outcome too, each outcome's.
Both partial, with one predicate: a running execution is in neither, so recording costs them
nothing until it finishes. tracedb.projection.models declares the same indexes.

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

_FINISHED = "WHERE outcome <> 'running' AND last_event_ns IS NOT NULL"
_DURATION = "CREATE INDEX ix_traces_duration ON traces ((last_event_ns - created_at_ns), created_at_ns, last_event_ns{})"


def upgrade() -> None:
    op.drop_index("ix_traces_duration", "traces")
    op.execute(_DURATION.format(", outcome") + " " + _FINISHED)
    op.execute(
        "CREATE INDEX ix_traces_intent_duration ON traces (intent, (last_event_ns - created_at_ns)) " + _FINISHED
    )


def downgrade() -> None:
    op.drop_index("ix_traces_intent_duration", "traces")
    op.drop_index("ix_traces_duration", "traces")
    op.execute(_DURATION.format("") + " " + _FINISHED)
