"""traces: outcome, first error, models, tokens, cost, last event time (tracedb.records.outcomes)

What each execution came to and cost, folded from its events by the compactor as records are
applied. Rows already stored get theirs here, from their steps, a batch of traces at a time in
primary-key order (memory does not grow with the store), by the same fold
(`tracedb.records.outcomes.derive`).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

from __future__ import annotations

import orjson
import sqlalchemy as sa
from alembic import op

from tracedb.records import outcomes

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_BATCH = 500  # traces a statement; their steps are read together

_COLUMNS = (
    sa.Column("outcome", sa.String(16), nullable=True),
    sa.Column("error_seq", sa.Integer, nullable=True),
    sa.Column("error_type", sa.String(128), nullable=True),
    sa.Column("error_code", sa.String(200), nullable=True),
    sa.Column("error_message", sa.Text, nullable=True),
    sa.Column("models", sa.JSON, nullable=True),
    sa.Column("input_tokens", sa.BigInteger, nullable=True),
    sa.Column("output_tokens", sa.BigInteger, nullable=True),
    sa.Column("cost_usd", sa.Float, nullable=True),
    sa.Column("prices_version", sa.String(32), nullable=True),
    sa.Column("last_event_ns", sa.BigInteger, nullable=True),
)
_INDEXES = (
    ("ix_traces_outcome_created_id", ("outcome", "created_at_ns", "execution_id")),
    ("ix_traces_error_code", ("error_code",)),
    ("ix_traces_cost", ("cost_usd",)),
)
# Durations of finished executions in order, with the columns they come from (an index-only walk
# on both databases): a percentile over all time is ORDER BY ... LIMIT 1 OFFSET k (tracedb.reads.stats),
# not a sort of every duration. tracedb.projection.models declares the same index.
_DURATION_INDEX = (
    "CREATE INDEX ix_traces_duration ON traces ((last_event_ns - created_at_ns), created_at_ns, last_event_ns) "
    "WHERE outcome <> 'running' AND last_event_ns IS NOT NULL"
)


def upgrade() -> None:
    # Plain ALTER TABLE on both databases: a batch rebuild of `traces` on SQLite would drop the
    # table, and its steps with it (ON DELETE CASCADE).
    for column in _COLUMNS:
        op.add_column("traces", column)
    _backfill(op.get_bind())
    for name, cols in _INDEXES:
        op.create_index(name, "traces", list(cols))
    op.execute(_DURATION_INDEX)


def _backfill(bind) -> None:
    names = [c.name for c in _COLUMNS]
    update = sa.text(
        f"UPDATE traces SET {', '.join(f'{n} = :{n}' for n in names)} WHERE execution_id = :k_id"
    ).bindparams(sa.bindparam("models", type_=sa.JSON))
    last = None
    while True:
        where = "WHERE execution_id > :last " if last is not None else ""
        traces = bind.execute(
            sa.text(f"SELECT execution_id, status FROM traces {where}ORDER BY execution_id LIMIT {_BATCH}"),
            {} if last is None else {"last": last},
        ).all()
        if not traces:
            return
        ids = [t[0] for t in traces]
        steps: dict = {i: [] for i in ids}
        rows = bind.execute(
            sa.text(
                "SELECT execution_id, seq, type, payload, recorded_at_ns FROM trace_steps "
                "WHERE execution_id IN :ids ORDER BY execution_id, seq"
            ).bindparams(sa.bindparam("ids", expanding=True)),
            {"ids": ids},
        )
        for eid, seq, type_, payload, t in rows:
            if isinstance(payload, (str, bytes)):
                try:
                    payload = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    payload = None
            steps[eid].append((seq, type_, payload, t))
        params = []
        for eid, status in traces:
            events = steps[eid]
            p = outcomes.derive(status, events)
            p["last_event_ns"] = events[-1][3] if events else None
            p["k_id"] = eid
            params.append(p)
        bind.execute(update, params)
        last = ids[-1]


def downgrade() -> None:
    op.drop_index("ix_traces_duration", "traces")
    for name, _ in _INDEXES:
        op.drop_index(name, "traces")
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35 and later), for the reason in upgrade().
    for column in reversed(_COLUMNS):
        op.execute(f"ALTER TABLE traces DROP COLUMN {column.name}")
