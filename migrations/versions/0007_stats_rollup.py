"""stats_rollup: the aggregates of `tracedb stats` over all time, kept by triggers (SQLite)

`tracedb stats` over all time, by model, day or hour, and the web overview, ranked every
duration of the store (a sort of a million rows took seconds). `stats_rollup` holds, for each
grouping key (`dim`: '*' the total, 'intent', 'outcome', 'model', 'day', 'hour'; `key` its value,
char(0) for a NULL intent or outcome and for '*', the UTC start of the bucket in ns for day and hour) and each
duration bucket, the counts by outcome, tokens and cost of the executions that are no longer
running: a few rows a key, summed in tracedb.reads.stats instead of a scan of `traces`. The
running ones (and any without an outcome) it leaves to `traces`, where the outcome's index finds
them: what compaction does to a running execution, at every batch, costs the rollup nothing.

The database keeps it, with triggers on `traces` that run in the transaction of the statement
that changed the row: AFTER INSERT adds the row's contribution, AFTER UPDATE takes the old one
away and adds the new, AFTER DELETE takes it away (a running row contributes nothing). Every
path that writes `traces` (compaction,
a second start replacing an execution, recovery marking executions incomplete, retention,
rebuild, backfills) keeps it exact with no code of its own. The writes are plain INSERT, UPDATE
and DELETE statements; an INSERT OR REPLACE would need recursive_triggers for its DELETE.

A duration bucket b >= 0 holds the finished executions (outcome not 'running', a last event)
whose duration d in ns, with e = floor(log2(d)), has b = 16 * e + floor(16 * d / 2^e) - 16: 16
buckets an octave, each at most 1/16 of its lower bound wide, worked out with integers alone (no
math functions, which not every SQLite has, and the same bucket on every build); -1 holds d < 1
ns, -2 those without a last event; by hour four neighbouring buckets are one (b a multiple of 4:
a histogram an hour at 1/16 would be most of the rows). Cost is summed in whole nano-USD
(`cost_nano_usd`, each execution's rounded), so that adding and taking away leaves no drift.

SQLite only: on PostgreSQL, several recorders compact into one database at once, and triggers
updating shared rows would serialize them (and deadlock between transactions that touch keys in
different orders); stats reads `traces` there as before. The rows already stored are summed in
here, one INSERT ... SELECT a grouping. tracedb.projection.models declares the table.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

DAY_NS = 86_400 * 10**9
HOUR_NS = 3_600 * 10**9
_COUNTS = ("executions", "succeeded", "failed", "incomplete", "input_tokens", "output_tokens", "cost_nano_usd",
           "cost_unknown")

# Stored in key order (WITHOUT ROWID): a grouping's rows are one range, read without a lookup a row.
# NULL is a key of its own (a NULL intent), stored as char(0), which no intent or model is.
_TABLE = (
    "CREATE TABLE stats_rollup ("
    "dim VARCHAR(8) NOT NULL, key TEXT NOT NULL, bucket INTEGER NOT NULL, "
    + ", ".join(f"{c} BIGINT NOT NULL" for c in _COUNTS)
    + ", CONSTRAINT pk_stats_rollup PRIMARY KEY (dim, key, bucket)) WITHOUT ROWID"
)


# Durations are capped at 2^58 ns (nine years) so that 16 * d stays a 64-bit integer.
_CAP = 1 << 58
SUB = 16  # buckets an octave
# By hour four neighbouring buckets are one: a histogram an hour at 1/16 would be most of the rows.
HOUR_WIDTH = 4


def _duration(r: str) -> str:
    """The duration of finished execution `r` in ns (capped), NULL for one not finished."""
    return (f"CASE WHEN {r}.outcome <> 'running' AND {r}.last_event_ns IS NOT NULL "
            f"THEN min({r}.last_event_ns - {r}.created_at_ns, {_CAP}) END")


def _log2(d: str, lo: int = 0, hi: int = 59) -> str:
    """floor(log2(d)) for 2^lo <= d < 2^hi, in integers: a binary search, six comparisons."""
    if hi - lo == 1:
        return str(lo)
    mid = (lo + hi) // 2
    return f"CASE WHEN {d} >= {1 << mid} THEN {_log2(d, mid, hi)} ELSE {_log2(d, lo, mid)} END"


def _bucket(d: str, e: str) -> str:
    """The bucket of duration `d` (module doc), `e` its floor(log2)."""
    return f"CASE WHEN {d} IS NULL THEN -2 WHEN {d} < 1 THEN -1 ELSE {SUB} * {e} + (({d} * {SUB}) >> {e}) - {SUB} END"


def _bucket_of(dim: str, b: str) -> str:
    """Bucket `b` as grouping `dim` keeps it (an SQL expression or a column naming one)."""
    return f"CASE WHEN {dim} = 'hour' AND {b} >= 0 THEN ({b} / {HOUR_WIDTH}) * {HOUR_WIDTH} ELSE {b} END"


def _bucket_table(r: str) -> str:
    """A one-row table of row `r`'s bucket `b`, each step worked out once."""
    return (f"(SELECT {_bucket('d', 'e')} AS b FROM (SELECT d, {_log2('d')} AS e "
            f"FROM (SELECT {_duration(r)} AS d)))")


def _keys(r: str) -> str:
    """(dim, key) rows of one execution `r`: once in each grouping, once a model it called."""
    return (
        f"SELECT '*' AS dim, char(0) AS key UNION ALL SELECT 'intent', COALESCE({r}.intent, char(0)) "
        f"UNION ALL SELECT 'outcome', COALESCE({r}.outcome, char(0)) "
        f"UNION ALL SELECT 'day', CAST(({r}.created_at_ns / {DAY_NS}) * {DAY_NS} AS TEXT) "
        f"UNION ALL SELECT 'hour', CAST(({r}.created_at_ns / {HOUR_NS}) * {HOUR_NS} AS TEXT) "
        f"UNION ALL SELECT 'model', COALESCE(value, char(0)) FROM json_each({r}.models)"
    )


def _values(r: str) -> tuple[str, ...]:
    """What execution `r` adds to each of _COUNTS."""
    return (
        "1", f"{r}.outcome = 'succeeded'", f"{r}.outcome = 'failed'", f"{r}.outcome = 'incomplete'",
        f"COALESCE({r}.input_tokens, 0)", f"COALESCE({r}.output_tokens, 0)",
        f"COALESCE(CAST(round({r}.cost_usd * 1e9) AS INTEGER), 0)", f"{r}.cost_usd IS NULL",
    )


_UPSERT = (
    " ON CONFLICT (dim, key, bucket) DO UPDATE SET "
    + ", ".join(f"{c} = {c} + excluded.{c}" for c in _COUNTS)
)


def _add(r: str, sign: int) -> str:
    """One statement: the contribution of row `r` (NEW or OLD) times `sign`, one upsert a
    grouping key (a model listed twice is upserted twice, counting twice, as a join with
    json_each counts it). No GROUP BY: a sorter for each row written would cost more than the
    upserts."""
    values = ", ".join(f"{sign} * ({v})" for v in _values(r))
    return (f"INSERT INTO stats_rollup (dim, key, bucket, {', '.join(_COUNTS)}) "
            f"SELECT dim, key, {_bucket_of('dim', 'b')}, {values} FROM ({_keys(r)}), {_bucket_table(r)} "
            f"WHERE {r}.outcome <> 'running'" + _UPSERT + ";")


# An UPDATE that changes none of what the rollup holds fires nothing: one of a running execution
# (most of compaction's), or one that changes its status note, its steps' count.
_CHANGED = "(OLD.outcome <> 'running' OR NEW.outcome <> 'running') AND (" + " OR ".join(
    [f"OLD.{c} IS NOT NEW.{c}" for c in ("intent", "outcome", "models", "input_tokens", "output_tokens",
                                          "cost_usd", "created_at_ns")]
    + ["(OLD.last_event_ns IS NOT NEW.last_event_ns AND NEW.outcome <> 'running')"]
) + ")"
_WATCHED = "intent, outcome, models, input_tokens, output_tokens, cost_usd, created_at_ns, last_event_ns"
TRIGGERS = {
    "tr_traces_rollup_insert": f"AFTER INSERT ON traces WHEN NEW.outcome <> 'running' BEGIN {_add('NEW', 1)} END",
    "tr_traces_rollup_update": (f"AFTER UPDATE OF {_WATCHED} ON traces WHEN {_CHANGED} "
                                f"BEGIN {_add('OLD', -1)} {_add('NEW', 1)} END"),
    "tr_traces_rollup_delete": f"AFTER DELETE ON traces WHEN OLD.outcome <> 'running' BEGIN {_add('OLD', -1)} END",
}


def _backfill() -> None:
    values = ", ".join(f"SUM({v})" for v in _values("t"))
    keys = (("'*'", "char(0)", "traces AS t"), ("'intent'", "COALESCE(t.intent, char(0))", "traces AS t"),
            ("'outcome'", "COALESCE(t.outcome, char(0))", "traces AS t"),
            ("'day'", f"CAST((t.created_at_ns / {DAY_NS}) * {DAY_NS} AS TEXT)", "traces AS t"),
            ("'hour'", f"CAST((t.created_at_ns / {HOUR_NS}) * {HOUR_NS} AS TEXT)", "traces AS t"),
            ("'model'", "COALESCE(m.value, char(0))", "traces AS t, json_each(t.models) AS m"))
    d = _duration("t")
    bucket = _bucket(d, _log2(d))
    execute = op.get_bind().exec_driver_sql  # no bind parameters to look for in these long texts
    for dim, key, source in keys:
        # Every key once per statement (GROUP BY): a plain insert, no conflict.
        execute(f"INSERT INTO stats_rollup (dim, key, bucket, {', '.join(_COUNTS)}) "
                f"SELECT {dim}, {key}, {_bucket_of(dim, bucket)}, {values} FROM {source} WHERE t.outcome <> 'running' "
                "GROUP BY 1, 2, 3")


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    execute = op.get_bind().exec_driver_sql  # the SQL as written: no bind parameters in it
    execute(_TABLE)
    _backfill()
    for name, body in TRIGGERS.items():
        execute(f"CREATE TRIGGER {name} {body}")


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for name in TRIGGERS:
        op.execute(f"DROP TRIGGER {name}")
    op.execute("DROP TABLE stats_rollup")
