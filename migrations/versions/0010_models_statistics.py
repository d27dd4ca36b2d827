"""traces: the planner's statistics on the text of `models` (PostgreSQL)

`inspect --list --model M` (and the web view's model filter) finds the executions whose `models`
list holds M with `CAST(models AS TEXT) LIKE '%"M"%'`, newest first. PostgreSQL had no
statistics on that expression and guessed that a LIKE keeps 0.5% of rows: for a model most
executions call it scanned the whole table and sorted (350 ms for a page at 1M executions)
instead of walking `ix_traces_created_id` newest first and stopping at the page's end (under
1 ms). Extended statistics on the expression (PostgreSQL 14 and later) give ANALYZE its most
common values, and the planner the real share; nothing is written when a row is, unlike an
index. SQLite's planner walks the index without them.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    execute = op.get_bind().exec_driver_sql
    if int(execute("SHOW server_version_num").scalar()) < 140000:
        return  # statistics on an expression came with PostgreSQL 14; older servers go without
    execute("CREATE STATISTICS st_traces_models_text ON ((models::text)) FROM traces")
    # A store that holds rows gets the statistics now, not at autovacuum's next ANALYZE. An
    # empty one is left unanalyzed: a row count of 0 would tell prune's planner that a table
    # loaded later is still empty (tracedb.maintenance.retention._analyze_if_unknown).
    if execute("SELECT EXISTS (SELECT 1 FROM traces)").scalar():
        execute("ANALYZE traces")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.get_bind().exec_driver_sql("DROP STATISTICS IF EXISTS st_traces_models_text")
