"""Aggregates over executions, computed in SQL (SQLite and PostgreSQL alike): counts, failure
rate, duration percentiles, tokens and cost, overall and by intent, model, outcome, day or hour.

`stats(engine, since_ns=None, by=None)` is what `tracedb stats` prints and the web overview
draws (`tracedb.reads.reader.Reader.stats`). Its answer:

    {"since_ns": int | None, "by": str | None,
     "total": GROUP, "groups": [GROUP, ...]}        groups: [] without `by`, else largest first
                                                     (day and hour: oldest first)
    GROUP = {"key": str | None, "executions": int, "succeeded": int, "failed": int,
             "incomplete": int, "running": int, "failure_rate": float | None,
             "p50_ms": float | None, "p95_ms": float | None, "p99_ms": float | None,
             "input_tokens": int, "output_tokens": int, "cost_usd": float,
             "cost_unknown": int}

failure_rate is failed / (succeeded + failed), None when none finished. Durations are creation
to last event of executions that are no longer running, nearest-rank percentiles.

Over all time every grouping is summed from stats_rollup (migrations 0007 and 0008 on SQLite,
0009 on PostgreSQL, where each recorder keeps a shard of its own and the shards are summed),
kept in the same transaction as every write of `traces` (by compaction and prune a batch at a
time, tracedb.projection.rollup; by triggers otherwise), plus the running executions,
which the rollup leaves out, counted off `traces`: counts and tokens exact, cost
summed in whole nano-USD (within 1e-9 USD an execution), and each percentile the geometric
middle of the duration bucket (16 an octave, each at most 1/16 of its start wide) holding the
nearest-rank duration: APPROXIMATE, within 3.1% (sqrt(1 + 1/16) - 1), by hour within 11.8%
(buckets 4 times as wide); a
duration under 1 ns counts as 0. `exact=True` and a
window (`since_ns`) read `traces`: percentiles over all time read off an
index in duration order (an index walk: ix_traces_duration, which holds the outcome too, and
ix_traces_intent_duration by intent), else ranked with window functions.
cost_usd sums the known costs; cost_unknown counts the executions whose cost is unknown (a
model the price table does not know). By model, an execution that called several models
counts under each.
Day and hour keys are the UTC start of the bucket, ISO 8601. The database alone is read: an
execution the WAL holds beyond it (no recorder running) counts once `tracedb recover` ran.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Optional

from tracedb.projection import rollup

BY = ("intent", "model", "outcome", "day", "hour")
_BUCKET_NS = {"day": 86_400 * 10**9, "hour": 3_600 * 10**9}
_PERCENTILES = (50, 95, 99)


def _source(dialect: str, by: Optional[str]) -> tuple[str, str]:
    """(FROM clause, key expression) for a grouping."""
    if by is None:
        return "traces", "NULL"
    if by == "model":
        if dialect == "postgresql":
            return "traces CROSS JOIN LATERAL json_array_elements_text(traces.models) AS m(value)", "m.value"
        return "traces, json_each(traces.models) AS m", "m.value"
    if by in _BUCKET_NS:
        size = _BUCKET_NS[by]
        return "traces", f"(traces.created_at_ns / {size}) * {size}"
    # On SQLite a unary + keeps the planner off the indexes that lead with the column
    # (ix_traces_intent_duration, ix_traces_outcome_created_id): walking one to group would look
    # up every row in key order instead of reading the window's rows off ix_traces_created_id.
    return "traces", f"+traces.{by}" if dialect == "sqlite" else f"traces.{by}"


def stats(engine, since_ns: Optional[int] = None, by: Optional[str] = None, exact: bool = False) -> dict:
    """The aggregates of the executions created at or after `since_ns` (every one when None),
    grouped `by` one of BY (module doc). Over all time on SQLite they are summed from
    stats_rollup, percentiles within 3.1%; `exact` reads `traces` instead."""
    import sqlalchemy as sa

    from tracedb.errors import InvalidInputError

    if by is not None and by not in BY:
        raise InvalidInputError(f"unknown grouping {by!r}", hint="one of " + ", ".join(BY))
    if since_ns is not None and (isinstance(since_ns, bool) or not isinstance(since_ns, int)):
        raise InvalidInputError(f"since_ns must be nanoseconds since the epoch, not {since_ns!r}")
    where = "WHERE traces.created_at_ns >= :since" if since_ns is not None else ""
    params = {} if since_ns is None else {"since": since_ns}
    dialect = engine.dialect.name
    with engine.connect() as conn:
        if since_ns is None and not exact and rollup.present(conn):
            total, groups = _rolled_up(conn, sa, dialect, by)
        else:
            total, groups = _exact(conn, sa, dialect, by, where, params, since_ns)
    total = total[0] if total else _group(None, (0,) * 8, {})
    if by in _BUCKET_NS:
        groups.sort(key=lambda g: int(g["key"]))
        for g in groups:
            g["key"] = datetime.fromtimestamp(int(g["key"]) / 1e9, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    else:
        groups.sort(key=lambda g: (-g["executions"], str(g["key"])))
    return {"since_ns": since_ns, "by": by, "total": total, "groups": groups}


def _exact(conn, sa, dialect: str, by: Optional[str], where: str, params: dict, since_ns: Optional[int]):
    """([total GROUP], [GROUP]) read off `traces`: exact percentiles."""
    grouped = _counts(conn, sa, dialect, by, where, params) if by is not None else []
    if by is not None and by != "model":
        # These groups partition the executions: the total is their sum (one scan, not two).
        # By model an execution counts under each model it called.
        counted = [(None, *(sum(r[i] or 0 for r in grouped) for i in range(1, len(r0))))
                   for r0 in grouped[:1]]
    else:
        counted = _counts(conn, sa, dialect, None, where, params)
    total = _groups(conn, sa, dialect, None, where, params, counted, walk=since_ns is None)
    groups = _groups(conn, sa, dialect, by, where, params, grouped) if by is not None else []
    return total, groups


# stats_rollup (migration 0007): bucket b = 16 e + r >= 0 holds durations d (ns) from
# (16 + r) 2^e / 16 up to the next bucket's start, -1 those under 1 ns, -2 the executions not
# finished. By hour four neighbouring buckets are one.
_SUB = 16
_WIDTH = {"hour": 4}


def _middle(bucket: int, width: int) -> float:
    """The geometric middle of a bucket `width` buckets wide: within sqrt(1 + width / 16) - 1 of
    any duration in it (3.1%; 11.8% by hour)."""
    e, r = divmod(bucket, _SUB)
    return ((_SUB + r) * (_SUB + r + width)) ** 0.5 * 2.0 ** e / _SUB
_COUNTS = ("executions", "succeeded", "failed", "incomplete", "input_tokens", "output_tokens", "cost_nano_usd",
           "cost_unknown")
# What stats_rollup leaves to `traces`: the running executions, and any without an outcome (neither
# finished: no duration), each found on ix_traces_outcome_created_id. Named: ANALYZE's statistics
# know no running execution in a store where none runs, and the planner would scan for them.
_NOT_ROLLED_UP = ("traces.outcome = 'running'", "traces.outcome IS NULL")
_INDEXED = "traces INDEXED BY ix_traces_outcome_created_id"
_NO_KEY = object()


# The key of a NULL intent or model in stats_rollup as read (`rollup.NUL`, `rollup.PG_NUL`), and
# written in SQL.
_NULL_READ = {"sqlite": rollup.NUL, "postgresql": rollup.PG_NUL}
_NULL_KEY = {"sqlite": "char(0)", "postgresql": "''"}


def _key(dim: str, stored: str, dialect: str):
    """A stats_rollup key as `traces` has it: char(0) (SQLite) or '' (PostgreSQL) is NULL; day
    and hour are ns."""
    if stored == _NULL_READ[dialect]:
        return None
    return int(stored) if dim in _BUCKET_NS else stored


def _rollup_dim(dim: str) -> str:
    """The grouping of stats_rollup a grouping is read from: the total ('*') sums the outcomes'
    (migration 0008: every execution the rollup holds has one)."""
    return "outcome" if dim == "*" else dim


def _rollup_key(dim: str, dialect: str) -> str:
    """The key column as a grouping reads it: the total's is one, NULL's."""
    return _NULL_KEY[dialect] if dim == "*" else "key"


def _rolled_up(conn, sa, dialect: str, by: Optional[str]):
    """([total GROUP], [GROUP]) summed from stats_rollup (over all time), a few rows a key (and
    a recorder, on PostgreSQL) whatever the size of the store, and the running executions read
    off `traces`. Counts and
    tokens exact, cost to the nano-USD an execution; a percentile is the geometric middle of the
    histogram bucket that holds the nearest-rank duration, within 3.1% of it (11.8% by hour)."""
    dims = ("*",) if by is None else ("*", by)
    sums = ", ".join(f"SUM({c})" for c in _COUNTS)
    # key -> [executions, succeeded, failed, incomplete, running, tokens in, tokens out, cost, unknown]
    groups: dict = {dim: {} for dim in dims}
    finished: dict = {}
    for dim in dims:
        for k, n, ok, failed, incomplete, t_in, t_out, nano, unknown, done in conn.execute(sa.text(
                f"SELECT {_rollup_key(dim, dialect)}, {sums}, SUM(CASE WHEN bucket >= -1 THEN executions ELSE 0 END) "
                f"FROM stats_rollup WHERE dim = :dim GROUP BY 1"), {"dim": _rollup_dim(dim)}):
            k = _key(dim, k, dialect)
            # int(): PostgreSQL sums BIGINT columns as NUMERIC.
            groups[dim][k] = [int(n), int(ok), int(failed), int(incomplete), 0, int(t_in), int(t_out),
                              int(nano) / 1e9, int(unknown)]
            finished[(dim, k)] = int(done)
        source, expr = _source(dialect, None if dim == "*" else dim)
        if dialect == "sqlite":
            source = source.replace("traces", _INDEXED, 1)
        for where in _NOT_ROLLED_UP:
            for k, *c in _counts(conn, sa, dialect, None if dim == "*" else dim, f"WHERE {where}", {}, source):
                if c[0]:
                    have = groups[dim].get(k)
                    # Not finished: no duration.
                    groups[dim][k] = list(c[:-1]) if have is None else [a + (b or 0) for a, b in zip(have, c[:-1])]
    durations: dict = {dim: {} for dim in dims}
    for dim in dims:
        # The buckets of each key in order (the index's), walked once: the bucket where the
        # running count reaches the nearest rank k = ceil(p * n / 100), that is count * 100 >= p * n.
        at, seen, cuts, n = _NO_KEY, 0, [], 0
        for k, bucket, count in conn.execute(sa.text(
                f"SELECT {_rollup_key(dim, dialect)}, bucket, SUM(executions) FROM stats_rollup WHERE dim = :dim "
                "AND bucket >= -1 GROUP BY 1, 2 HAVING SUM(executions) <> 0 ORDER BY 1, 2"), {"dim": _rollup_dim(dim)}):
            k = _key(dim, k, dialect)
            if at is _NO_KEY or k != at:
                at, seen, cuts, n = k, 0, [], finished.get((dim, k), 0)
                durations[dim][k] = cuts
            seen += int(count)
            while len(cuts) < len(_PERCENTILES) and seen * 100 >= _PERCENTILES[len(cuts)] * n:
                cuts.append(0 if bucket < 0 else _middle(bucket, _WIDTH.get(dim, 1)))
    out = {
        dim: [_group(k, c, {k: tuple(durations[dim].get(k) or (None,) * len(_PERCENTILES))})
              for k, c in found.items() if c[0]]
        for dim, found in groups.items()
    }
    return out["*"], (out[by] if by is not None else [])


def totals(engine) -> dict:
    """What `/metrics` shows of the store: {"executions": [(intent, outcome, n)], "models":
    [(model, input tokens, output tokens, known cost USD)]}, each one GROUP BY in SQL."""
    import sqlalchemy as sa

    source, key = _source(engine.dialect.name, "model")
    with engine.connect() as conn:
        executions = conn.execute(sa.text(
            "SELECT intent, outcome, COUNT(*) FROM traces GROUP BY intent, outcome")).all()
        models = conn.execute(sa.text(
            f"SELECT {key}, SUM(COALESCE(input_tokens, 0)), SUM(COALESCE(output_tokens, 0)), "
            f"SUM(COALESCE(cost_usd, 0)) FROM {source} GROUP BY {key}")).all()
    return {"executions": [tuple(r) for r in executions], "models": [tuple(r) for r in models]}


# The rows ix_traces_duration holds (migration 0005): its predicate, word for word, so that
# SQLite sees the query's WHERE imply the partial index's.
_FINISHED = "traces.outcome <> 'running' AND traces.last_event_ns IS NOT NULL"
_DURATION = "(traces.last_event_ns - traces.created_at_ns)"


def _walked(conn, sa, dialect: str, finished: dict, by: Optional[str]) -> dict:
    """{key: (p50, p95, p99)} for each key of `finished` ({key: how many finished executions}),
    each the k-th duration read off an index in duration order (an index walk, no sort):
    ix_traces_duration for every execution (`by` None) and within an outcome (it holds the
    outcome: the walk skips the others' entries without reading a row),
    ix_traces_intent_duration within an intent. Nearest rank k = ceil(p * n / 100)."""
    out = {}
    for key, n in finished.items():
        if not n:
            continue
        # By outcome on SQLite, a unary + keeps the planner off ix_traces_outcome_created_id
        # (which would find the outcome's rows, then sort them all).
        column = f"+traces.{by}" if by == "outcome" and dialect == "sqlite" else f"traces.{by}"
        where, bound = (_FINISHED, {}) if by is None else (f"{column} = :key AND {_FINISHED}", {"key": key})
        cuts = []
        for p in _PERCENTILES:
            rank = (p * n + 99) // 100
            # The high percentiles are walked from the top: fewer index entries to step over.
            order, offset = ("ASC", rank - 1) if rank * 2 <= n else ("DESC", n - rank)
            cuts.append(conn.execute(sa.text(
                f"SELECT {_DURATION} FROM traces WHERE {where} ORDER BY {_DURATION} {order} LIMIT 1 OFFSET :k"
            ), {"k": offset, **bound}).scalar_one())
        out[key] = tuple(cuts)
    return out


def _counts(conn, sa, dialect: str, by: Optional[str], where: str, params: dict, source: Optional[str] = None) -> list:
    """One row per group: key, executions, succeeded, failed, incomplete, running, input and
    output tokens, known cost, executions of unknown cost, finished executions (one scan)."""
    default, key = _source(dialect, by)
    source = source or default
    return conn.execute(sa.text(
        f"SELECT {key} AS k, COUNT(*), "
        "SUM(CASE WHEN outcome = 'succeeded' THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN outcome = 'failed' THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN outcome = 'incomplete' THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN outcome = 'running' THEN 1 ELSE 0 END), "
        "SUM(COALESCE(input_tokens, 0)), SUM(COALESCE(output_tokens, 0)), SUM(COALESCE(cost_usd, 0)), "
        "SUM(CASE WHEN cost_usd IS NULL THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN {_FINISHED} THEN 1 ELSE 0 END) "
        f"FROM {source} {where}" + (f" GROUP BY {key}" if by is not None else "")
    ), params).all()


def _groups(conn, sa, dialect: str, by: Optional[str], where: str, params: dict, counts: list,
            walk: bool = False) -> list[dict]:
    """`counts` (rows of `_counts`) as GROUPs, with their duration percentiles."""
    source, key = _source(dialect, by)
    if not where and (walk if by is None else by in ("intent", "outcome")):
        # Over all time, an index holds the durations in order (module doc): no sort. A NULL
        # key is not equal to itself; its executions are ranked below.
        durations = _walked(conn, sa, dialect, {r[0]: r[-1] for r in counts if by is None or r[0] is not None}, by)
        if by is not None and any(r[0] is None for r in counts):
            durations.update(_ranked(conn, sa, source, key, f"WHERE traces.{by} IS NULL", params))
    else:
        durations = _ranked(conn, sa, source, key, where, params)
    return [_group(r[0], r[1:-1], durations) for r in counts if r[1]]


def _ranked(conn, sa, source: str, key: str, where: str, params: dict) -> dict:
    """{key: (p50, p95, p99)}, nearest rank with window functions (both databases have them;
    SQLite has no percentile aggregate): the smallest duration whose rank r has r * 100 >= p * n.
    A window or a grouping sorts the durations it holds."""
    cuts = ", ".join(f"MIN(CASE WHEN rn * 100 >= {p} * n THEN dur END)" for p in _PERCENTILES)
    finished = ("AND " if where else "WHERE ") + _FINISHED
    ranked = conn.execute(sa.text(
        f"SELECT k, {cuts} FROM ("
        f"SELECT k, dur, ROW_NUMBER() OVER (PARTITION BY k ORDER BY dur) AS rn, COUNT(*) OVER (PARTITION BY k) AS n "
        f"FROM (SELECT {key} AS k, {_DURATION} AS dur "
        f"FROM {source} {where} {finished}) AS d) AS r GROUP BY k"
    ), params).all()
    return {r[0]: r[1:] for r in ranked}


def _group(key, c, durations: dict) -> dict:
    n, ok, failed, incomplete, running, tokens_in, tokens_out, cost, unknown = (
        (c[0], c[1] or 0, c[2] or 0, c[3] or 0, c[4] or 0, c[5] or 0, c[6] or 0, c[7] or 0.0, c[8] or 0)
        if len(c) == 9 else (0,) * 8 + (0,)
    )
    ps = durations.get(key, (None,) * len(_PERCENTILES))
    finished = ok + failed
    g = {
        "key": key, "executions": int(n), "succeeded": int(ok), "failed": int(failed),
        "incomplete": int(incomplete), "running": int(running),
        "failure_rate": None if not finished else round(failed / finished, 6),
    }
    for p, v in zip(_PERCENTILES, ps):
        g[f"p{p}_ms"] = None if v is None else round(int(v) / 1e6, 3)
    g.update(input_tokens=int(tokens_in), output_tokens=int(tokens_out), cost_usd=round(float(cost), 10), cost_unknown=int(unknown))
    return g
