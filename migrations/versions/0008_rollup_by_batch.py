"""stats_rollup kept by compaction and retention a batch at a time; the triggers for every other write (SQLite)

Migration 0007's triggers upsert six or seven `stats_rollup` rows for every execution that
finishes or is deleted, in the statement that writes its row: most of what a finished execution
cost compaction. Compaction and retention now sum a batch's executions themselves
(tracedb.projection.rollup) and upsert each grouping key and bucket once a batch. While they
write, their transaction holds a row in `stats_rollup_deferred` and the triggers do nothing; the
row is deleted before the transaction commits, so no other transaction ever sees it. Every
other UPDATE or DELETE of `traces` (recovery's repairs, an operator's statement, a backfill)
still fires them.

There is no INSERT trigger any more: tracedb inserts rows into `traces` only by compaction, and
even a trigger that does nothing (its WHEN is evaluated in the trigger's own program) cost
about 16,000 instructions a row inserted, a twentieth of what compacting a 20-event execution
costs. A row inserted by hand from outside tracedb is not counted over all time; `stats` over a
window (`--since`) reads `traces` itself.

The total ('*') is no longer a grouping of its own: it is the sum of the 'outcome' grouping,
which holds every execution the rollup holds (one with no outcome is in neither), so its rows
are deleted and every write upserts one row fewer.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from __future__ import annotations

import importlib.util
import pathlib

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

DEFERRED = "NOT EXISTS (SELECT 1 FROM stats_rollup_deferred)"


def _before():
    """Migration 0007, whose SQL these triggers reuse."""
    path = next(pathlib.Path(__file__).parent.glob("0007_*.py"))
    spec = importlib.util.spec_from_file_location("tracedb_migration_0007", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


m = _before()


def _keys(r: str) -> str:
    """(dim, key) rows of one execution `r`: 0007's, without the total."""
    return (
        f"SELECT 'intent' AS dim, COALESCE({r}.intent, char(0)) AS key "
        f"UNION ALL SELECT 'outcome', COALESCE({r}.outcome, char(0)) "
        f"UNION ALL SELECT 'day', CAST(({r}.created_at_ns / {m.DAY_NS}) * {m.DAY_NS} AS TEXT) "
        f"UNION ALL SELECT 'hour', CAST(({r}.created_at_ns / {m.HOUR_NS}) * {m.HOUR_NS} AS TEXT) "
        f"UNION ALL SELECT 'model', COALESCE(value, char(0)) FROM json_each({r}.models)"
    )


def _add(r: str, sign: int) -> str:
    """0007's `_add` over these keys."""
    values = ", ".join(f"{sign} * ({v})" for v in m._values(r))
    return (f"INSERT INTO stats_rollup (dim, key, bucket, {', '.join(m._COUNTS)}) "
            f"SELECT dim, key, {m._bucket_of('dim', 'b')}, {values} FROM ({_keys(r)}), {m._bucket_table(r)} "
            f"WHERE {r}.outcome <> 'running'" + m._UPSERT + ";")


TRIGGERS = {
    "tr_traces_rollup_update": (f"AFTER UPDATE OF {m._WATCHED} ON traces WHEN {m._CHANGED} AND {DEFERRED} "
                                f"BEGIN {_add('OLD', -1)} {_add('NEW', 1)} END"),
    "tr_traces_rollup_delete": (f"AFTER DELETE ON traces WHEN OLD.outcome <> 'running' AND {DEFERRED} "
                                f"BEGIN {_add('OLD', -1)} END"),
}


def _recreate(bodies: dict) -> None:
    """Migration 0007's triggers replaced by `bodies` (by name)."""
    execute = op.get_bind().exec_driver_sql  # the SQL as written: no bind parameters in it
    for name in m.TRIGGERS:
        execute(f"DROP TRIGGER IF EXISTS {name}")
    for name, body in bodies.items():
        execute(f"CREATE TRIGGER {name} {body}")


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    execute = op.get_bind().exec_driver_sql
    execute("CREATE TABLE stats_rollup_deferred (one INTEGER NOT NULL, "
            "CONSTRAINT pk_stats_rollup_deferred PRIMARY KEY (one))")
    execute("DELETE FROM stats_rollup WHERE dim = '*'")
    _recreate(TRIGGERS)


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    execute = op.get_bind().exec_driver_sql
    _recreate(m.TRIGGERS)
    counts = ", ".join(m._COUNTS)
    execute(f"INSERT INTO stats_rollup (dim, key, bucket, {counts}) SELECT '*', char(0), bucket, "
            + ", ".join(f"SUM({c})" for c in m._COUNTS) + " FROM stats_rollup WHERE dim = 'outcome' GROUP BY bucket")
    execute("DROP TABLE stats_rollup_deferred")
