"""stats_rollup on PostgreSQL: `stats` over all time without reading every row of `traces`

Migrations 0007 and 0008 keep `stats_rollup` on SQLite. On PostgreSQL `stats` over all time
still read `traces`: seconds at a million executions. This revision gives PostgreSQL the same
rollup, kept the same way: compaction and prune sum each batch and upsert one delta per grouping
key and duration bucket (tracedb.projection.rollup), and triggers keep it through every other
UPDATE or DELETE of `traces` (an operator's statement, `tracedb invalidate`, a repair). There is
no INSERT trigger: tracedb inserts rows only by compaction (migration 0008 says why).

What differs from SQLite, and why:

- **A shard a recorder.** Several recorders compact into one database at once, and a row of
  `stats_rollup` updated by one transaction is locked until it commits: recorders sharing rows
  would wait on each other at every batch. Each row here belongs to the recorder that wrote the
  executions it sums (`recorder_id`, the executions' own), so recorders never touch each other's
  rows; `stats` sums the shards. Prune takes an execution away from its recorder's shard.
- **The deferral is a setting, not a table.** While compaction or prune keeps the rollup itself,
  its transaction sets `tracedb.rollup_deferred` to 'on' (`set_config(..., true)`: this
  transaction alone, gone at its end), and the triggers do nothing.
- **The NULL key is ''** (PostgreSQL's text cannot hold char(0)); an intent is never empty.
- The bucket is one SQL function (`tracedb_rollup_bucket`), the same arithmetic as migration
  0007's: 16 buckets an octave, -1 under 1 ns, -2 without a last event; by hour four neighbouring
  buckets are one.

The rows already stored are summed in here, one INSERT ... SELECT a grouping.
tracedb.projection.models declares the table (`postgresql_metadata`).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

DAY_NS = 86_400 * 10**9
HOUR_NS = 3_600 * 10**9
_CAP = 1 << 58  # durations are capped at nine years, as on SQLite (migration 0007)
_COUNTS = ("executions", "succeeded", "failed", "incomplete", "input_tokens", "output_tokens", "cost_nano_usd",
           "cost_unknown")

TABLE = (
    "CREATE TABLE stats_rollup ("
    "dim VARCHAR(8) NOT NULL, key TEXT NOT NULL, bucket INTEGER NOT NULL, recorder_id VARCHAR(64) NOT NULL, "
    + ", ".join(f"{c} BIGINT NOT NULL" for c in _COUNTS)
    + ", CONSTRAINT pk_stats_rollup PRIMARY KEY (dim, key, bucket, recorder_id))"
)

# floor(log2(d)) is the bit length of d less one; d::bit(64) gives its bits.
BUCKET_FUNCTION = f"""
CREATE FUNCTION tracedb_rollup_bucket(created_at_ns bigint, last_event_ns bigint) RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE d bigint; e integer;
BEGIN
    IF last_event_ns IS NULL THEN RETURN -2; END IF;
    d := LEAST(last_event_ns - created_at_ns, {_CAP});
    IF d < 1 THEN RETURN -1; END IF;
    e := length(ltrim(d::bit(64)::text, '0')) - 1;
    RETURN 16 * e + ((d * 16) >> e)::integer - 16;
END $$"""


def _nano(c: str) -> str:
    """Cost `c` in whole nano-USD, rounded half away from zero as tracedb.projection.rollup does."""
    return (f"(CASE WHEN {c} >= 0 THEN floor({c} * 1e9::float8 + 0.5::float8) "
            f"ELSE -floor(-{c} * 1e9::float8 + 0.5::float8) END)::bigint")


def _values(r: str, times: str) -> tuple[str, ...]:
    """What execution `r` adds to each of _COUNTS, `times` over."""
    return (
        times, f"{times} * ({r}.outcome = 'succeeded')::int", f"{times} * ({r}.outcome = 'failed')::int",
        f"{times} * ({r}.outcome = 'incomplete')::int", f"{times} * COALESCE({r}.input_tokens, 0)",
        f"{times} * COALESCE({r}.output_tokens, 0)", f"{times} * COALESCE({_nano(f'{r}.cost_usd')}, 0)",
        f"{times} * ({r}.cost_usd IS NULL)::int",
    )


def _bucket_of(dim: str, b: str) -> str:
    return f"CASE WHEN {dim} = 'hour' AND {b} >= 0 THEN ({b} / 4) * 4 ELSE {b} END"


def _models(r: str) -> str:
    """The model names of `r` (none when its models are not a JSON list)."""
    return f"json_array_elements_text(CASE WHEN json_typeof({r}.models) = 'array' THEN {r}.models END)"


_UPSERT = (" ON CONFLICT (dim, key, bucket, recorder_id) DO UPDATE SET "
           + ", ".join(f"{c} = stats_rollup.{c} + excluded.{c}" for c in _COUNTS))

# One execution's contribution times `sign`: one upsert a grouping key, a model listed twice
# counted twice (as json_array_elements_text counts it in a join), in one row.
ADD_FUNCTION = f"""
CREATE FUNCTION tracedb_rollup_add(r traces, sign integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE b integer;
BEGIN
    IF r.outcome IS NULL OR r.outcome = 'running' THEN RETURN; END IF;
    b := tracedb_rollup_bucket(r.created_at_ns, r.last_event_ns);
    INSERT INTO stats_rollup (dim, key, bucket, recorder_id, {', '.join(_COUNTS)})
    SELECT k.dim, k.key, {_bucket_of('k.dim', 'b')}, r.recorder_id, {', '.join(_values('r', 'sign * k.times'))}
    FROM (SELECT 'intent' AS dim, COALESCE(r.intent, '') AS key, 1 AS times
          UNION ALL SELECT 'outcome', r.outcome, 1
          UNION ALL SELECT 'day', ((r.created_at_ns / {DAY_NS}) * {DAY_NS})::text, 1
          UNION ALL SELECT 'hour', ((r.created_at_ns / {HOUR_NS}) * {HOUR_NS})::text, 1
          UNION ALL SELECT 'model', m.value, COUNT(*)::int FROM {_models('r')} AS m(value) GROUP BY m.value) AS k
    ORDER BY 1, 2{_UPSERT};
END $$"""

DEFERRED_SETTING = "tracedb.rollup_deferred"
TRIGGER_FUNCTION = f"""
CREATE FUNCTION tracedb_rollup_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('{DEFERRED_SETTING}', true) IS DISTINCT FROM 'on' THEN
        PERFORM tracedb_rollup_add(OLD, -1);
        IF TG_OP = 'UPDATE' THEN PERFORM tracedb_rollup_add(NEW, 1); END IF;
    END IF;
    RETURN NULL;
END $$"""

_WATCHED = "intent, outcome, models, input_tokens, output_tokens, cost_usd, created_at_ns, last_event_ns, recorder_id"
# An UPDATE that changes none of what the rollup holds fires nothing (most of compaction's: a
# running execution's). json has no equality: its text is compared.
_CHANGED = "(OLD.outcome <> 'running' OR NEW.outcome <> 'running') AND (" + " OR ".join(
    [f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in ("intent", "outcome", "input_tokens", "output_tokens", "cost_usd",
                                                     "created_at_ns", "recorder_id")]
    + ["OLD.models::text IS DISTINCT FROM NEW.models::text",
       "(OLD.last_event_ns IS DISTINCT FROM NEW.last_event_ns AND NEW.outcome <> 'running')"]
) + ")"
TRIGGERS = {
    "tr_traces_rollup_update": f"AFTER UPDATE OF {_WATCHED} ON traces FOR EACH ROW WHEN ({_CHANGED}) "
                               "EXECUTE FUNCTION tracedb_rollup_trigger()",
    "tr_traces_rollup_delete": "AFTER DELETE ON traces FOR EACH ROW WHEN (OLD.outcome <> 'running') "
                               "EXECUTE FUNCTION tracedb_rollup_trigger()",
}


def _backfill(execute) -> None:
    keys = (("'intent'", "COALESCE(t.intent, '')", "traces AS t"),
            ("'outcome'", "t.outcome", "traces AS t"),
            ("'day'", f"((t.created_at_ns / {DAY_NS}) * {DAY_NS})::text", "traces AS t"),
            ("'hour'", f"((t.created_at_ns / {HOUR_NS}) * {HOUR_NS})::text", "traces AS t"),
            ("'model'", "m.value", f"traces AS t CROSS JOIN LATERAL {_models('t')} AS m(value)"))
    values = ", ".join(f"SUM({v})" for v in _values("t", "1"))
    bucket = "tracedb_rollup_bucket(t.created_at_ns, t.last_event_ns)"
    for dim, key, source in keys:
        # Every key once per statement (GROUP BY): a plain insert, no conflict.
        execute(f"INSERT INTO stats_rollup (dim, key, bucket, recorder_id, {', '.join(_COUNTS)}) "
                f"SELECT {dim}, {key}, {_bucket_of(dim, bucket)}, t.recorder_id, {values} FROM {source} "
                "WHERE t.outcome <> 'running' GROUP BY 1, 2, 3, 4")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    execute = op.get_bind().exec_driver_sql  # the SQL as written: no bind parameters in it
    execute(TABLE)
    for ddl in (BUCKET_FUNCTION, ADD_FUNCTION, TRIGGER_FUNCTION):
        execute(ddl)
    _backfill(execute)
    for name, body in TRIGGERS.items():
        execute(f"CREATE TRIGGER {name} {body}")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    execute = op.get_bind().exec_driver_sql
    for name in TRIGGERS:
        execute(f"DROP TRIGGER {name} ON traces")
    execute("DROP FUNCTION tracedb_rollup_trigger()")
    execute("DROP FUNCTION tracedb_rollup_add(traces, integer)")
    execute("DROP FUNCTION tracedb_rollup_bucket(bigint, bigint)")
    execute("DROP TABLE stats_rollup")
