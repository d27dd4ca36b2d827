"""`stats_rollup` kept a batch at a time by compaction and retention (SQLite and PostgreSQL).

Migration 0007 kept `stats_rollup` with triggers on `traces`: six or seven upserts each time an
execution finished or was deleted, in the statement that wrote its row. Compaction and prune
instead sum what a batch changes into one delta per grouping key and duration bucket, and
upsert those once a batch (migration 0008): `deferred` puts a row in `stats_rollup_deferred`
for their transaction, which the triggers wait on, and deletes it again before the transaction
commits (on PostgreSQL, migration 0009: a setting of the transaction's own). The writer reads
the rows it is about to change (`read`), takes their contribution away, writes, reads back
those that are or were finished, and adds theirs.

On PostgreSQL each row of `stats_rollup` is one recorder's shard: an execution counts in the
shard of the recorder that recorded it (its `recorder_id`), so that recorders compacting into
one database at once never update the same rows; `stats` sums the shards. A NULL intent or
model is '' there, char(0) on SQLite.

`Delta.add` is the triggers' SQL (migrations 0007 to 0009: `_keys`, `_values`, `_bucket`)
written in Python, and must stay equal to it: tests/store/test_stats_rollup.py (and
tests/pg/test_pg_stats_rollup.py) compare what compaction and prune kept with the migration's
backfill and with stats read off `traces`.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, Optional

import orjson

DAY_NS = 86_400 * 10**9
HOUR_NS = 3_600 * 10**9
_CAP = 1 << 58  # durations are capped at nine years (migration 0007)
SUB = 16  # buckets an octave
HOUR_WIDTH = 4  # by hour four neighbouring buckets are one
NUL = "\x00"  # the key of a NULL intent or model (SQLite)
PG_NUL = ""  # the same on PostgreSQL, whose text holds no char(0); an intent is never empty
DEFERRED_SETTING = "tracedb.rollup_deferred"  # PostgreSQL (migration 0009)

# The columns of `traces` an execution's contribution is made of, in `Delta.add`'s order.
COLUMNS = ("intent", "outcome", "models", "input_tokens", "output_tokens", "cost_usd", "created_at_ns",
           "last_event_ns", "recorder_id")
COUNTS = ("executions", "succeeded", "failed", "incomplete", "input_tokens", "output_tokens", "cost_nano_usd",
          "cost_unknown")

# PostgreSQL: a shard's row takes the sums of the row it would have been.
_PG_ADD = "ON CONFLICT (dim, key, bucket, recorder_id) DO UPDATE SET " + ", ".join(
    f"{c} = stats_rollup.{c} + excluded.{c}" for c in COUNTS)

# By dialect: (defer, resume, upsert).
_SQL = {
    "sqlite": (
        "INSERT INTO stats_rollup_deferred (one) VALUES (1)",
        "DELETE FROM stats_rollup_deferred",
        f"INSERT INTO stats_rollup (dim, key, bucket, {', '.join(COUNTS)}) VALUES ({', '.join('?' * (3 + len(COUNTS)))})"
        " ON CONFLICT (dim, key, bucket) DO UPDATE SET " + ", ".join(f"{c} = {c} + excluded.{c}" for c in COUNTS),
    ),
    "postgresql": (
        f"SELECT set_config('{DEFERRED_SETTING}', 'on', true)",
        f"SELECT set_config('{DEFERRED_SETTING}', 'off', true)",
        f"INSERT INTO stats_rollup (dim, key, bucket, recorder_id, {', '.join(COUNTS)}) "
        f"VALUES ({', '.join(['%s'] * (4 + len(COUNTS)))}) {_PG_ADD}",
    ),
}
_PRESENT = {
    "sqlite": "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'stats_rollup_deferred'",
    "postgresql": "SELECT 1 WHERE to_regclass('stats_rollup') IS NOT NULL",
}


def present(conn) -> bool:
    """Whether this database keeps the rollup by batch (SQLite since migration 0008, PostgreSQL
    since 0009)."""
    sql = _PRESENT.get(conn.dialect.name)
    return sql is not None and conn.exec_driver_sql(sql).first() is not None


@contextlib.contextmanager
def deferred(conn, keep: bool = True) -> Iterator[Optional["Delta"]]:
    """Inside the caller's transaction: the triggers wait, and the Delta yielded is upserted on
    leaving; None (nothing deferred) when `keep` is False. Only for a transaction that rolls back
    if the block raises: then nothing is upserted and the deferral goes with the rollback."""
    if not keep:
        yield None
        return
    defer, resume, _ = _SQL[conn.dialect.name]
    conn.exec_driver_sql(defer)
    delta = Delta(sharded=conn.dialect.name != "sqlite")
    yield delta
    delta.write(conn)
    conn.exec_driver_sql(resume)


def _div(a: int, b: int) -> int:
    """SQLite's integer division (towards zero)."""
    return a // b if a >= 0 else -((-a) // b)


class Delta:
    """What a batch adds to `stats_rollup`.

    The executions are kept by what they share (intent, outcome, models, hour, duration bucket,
    sign): a batch's executions fall in a few such groups, each summed once and spread over its
    grouping keys when written, instead of eight sums for each of six keys an execution."""

    __slots__ = ("groups", "sharded")

    def __init__(self, sharded: bool = False):
        self.groups: dict = {}
        self.sharded = sharded  # PostgreSQL's rows are a recorder's shard; SQLite has one

    def add(self, intent, outcome, models: Optional[Iterable], input_tokens, output_tokens, cost_usd,
            created_at_ns: int, last_event_ns: Optional[int], shard: Optional[str] = None, sign: int = 1) -> None:
        """Add (`sign` 1) or take away (-1) one execution's contribution, to the shard of its
        recorder (`shard`, when `sharded`); nothing for one that is running (or has no outcome),
        as the triggers' `outcome <> 'running'`."""
        if outcome is None or outcome == "running":
            return
        if last_event_ns is None:
            b = -2
        else:  # the duration's bucket (migration 0007's module doc)
            d = last_event_ns - created_at_ns
            if d < 1:
                b = -1
            else:
                if d > _CAP:
                    d = _CAP
                e = d.bit_length() - 1
                b = SUB * e + ((d * SUB) >> e) - SUB
        key = (intent, outcome, tuple(models) if models else (),
               created_at_ns // HOUR_NS if created_at_ns >= 0 else _div(created_at_ns, HOUR_NS), b,
               shard if self.sharded else None, sign)
        rows = self.groups.get(key)
        if rows is None:
            rows = self.groups[key] = []
        rows.append((input_tokens or 0, output_tokens or 0, cost_usd))

    def add_stored(self, row, sign: int = 1) -> None:
        """Add a row as `read` reads it."""
        self.add(row[0], row[1], models_of(row[2]), *row[3:], sign=sign)

    def sums(self, null: str = NUL) -> dict:
        """(dim, key, bucket, shard) -> the sums of COUNTS; `null` the key of a NULL intent or
        model."""
        out: dict = {}
        for (intent, outcome, models, hour, b, shard, sign), rows in self.groups.items():
            n = len(rows)
            tokens_in, tokens_out, costs = zip(*rows)
            known = [c for c in costs if c is not None]
            cost = sum([int(c * 1e9 + 0.5) if c >= 0 else -int(-c * 1e9 + 0.5) for c in known])  # _round
            values = (sign * n, sign * n * (outcome == "succeeded"), sign * n * (outcome == "failed"),
                      sign * n * (outcome == "incomplete"), sign * sum(tokens_in), sign * sum(tokens_out),
                      sign * cost, sign * (n - len(known)))
            hour_ns = hour * HOUR_NS
            keys = [("intent", null if intent is None else intent, b, shard), ("outcome", outcome, b, shard),
                    ("day", str(_div(hour_ns, DAY_NS) * DAY_NS), b, shard),
                    ("hour", str(hour_ns), (b // HOUR_WIDTH) * HOUR_WIDTH if b >= 0 else b, shard)]
            keys += [("model", null if m is None else str(m), b, shard) for m in models]
            for key in keys:
                have = out.get(key)
                if have is None:
                    out[key] = [values]
                else:
                    have.append(values)
        return {k: v[0] if len(v) == 1 else tuple(map(sum, zip(*v))) for k, v in out.items()}

    def write(self, conn) -> int:
        """Upsert the sums that are not all zero, in key order (every writer locks rows in the
        same order); returns how many rows it upserted."""
        if conn.dialect.name == "sqlite":
            rows = [(*k[:3], *v) for k, v in sorted(self.sums().items(), key=_sort_key) if any(v)]
        else:
            # A NUL cannot be stored in PostgreSQL's text: the compactor stores an intent with one
            # as U+FFFD (tracedb.projection.compactor._pg_text), and so is it counted.
            rows = [(dim, key.replace(NUL, "\ufffd"), *rest, *v)
                    for (dim, key, *rest), v in sorted(self.sums(PG_NUL).items(), key=_sort_key) if any(v)]
        if rows:
            conn.exec_driver_sql(_SQL[conn.dialect.name][2], rows)
        return len(rows)


def _sort_key(item) -> tuple:
    dim, key, bucket, shard = item[0]
    return dim, key, bucket, shard or ""


def models_of(stored) -> Optional[list]:
    """A row's `models` as read: JSON text (SQLite), a list already (PostgreSQL), or NULL."""
    if isinstance(stored, (str, bytes)):
        return orjson.loads(stored)
    return stored


def select_sql(n: int, marker: str = "?") -> str:
    """The contribution columns (and the id, first) of `n` executions by id."""
    return (f"SELECT execution_id, {', '.join(COLUMNS)} FROM traces WHERE execution_id IN "
            f"({', '.join([marker] * n)})")


def read(conn, ids: list) -> dict:
    """execution id -> its contribution columns (`COLUMNS`), for the ids that have a row."""
    out = {}
    marker = "?" if conn.dialect.name == "sqlite" else "%s"
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        for r in conn.exec_driver_sql(select_sql(len(chunk), marker), tuple(chunk)):
            out[r[0]] = r[1:]
    return out


# The shard of no one recorder (PostgreSQL): days and hours that are over, merged by `merge_shards`.
MERGED = ""
_MERGE = (
    "WITH locked AS (SELECT dim, key, bucket, recorder_id FROM stats_rollup "
    f"WHERE dim IN ('day', 'hour') AND recorder_id <> '{MERGED}' "
    f"AND key::bigint + CASE dim WHEN 'day' THEN {DAY_NS} ELSE {HOUR_NS} END <= %s "
    # In Python's order (code points: the "C" collation), the order `Delta.write` locks rows in.
    'ORDER BY dim COLLATE "C", key COLLATE "C", bucket, recorder_id COLLATE "C" FOR UPDATE), '
    "moved AS (DELETE FROM stats_rollup AS s USING locked AS l WHERE s.dim = l.dim AND s.key = l.key "
    "AND s.bucket = l.bucket AND s.recorder_id = l.recorder_id RETURNING s.*) "
    f"INSERT INTO stats_rollup (dim, key, bucket, recorder_id, {', '.join(COUNTS)}) "
    f"SELECT dim, key, bucket, '{MERGED}', {', '.join(f'SUM({c})' for c in COUNTS)} FROM moved "
    f'GROUP BY dim, key, bucket ORDER BY dim COLLATE "C", key COLLATE "C", bucket {_PG_ADD}'
)
_EMPTIED = f"DELETE FROM stats_rollup WHERE recorder_id = '{MERGED}' AND " + " AND ".join(f"{c} = 0" for c in COUNTS)


def merge_shards(conn, before_ns: int) -> int:
    """PostgreSQL: fold the recorders' shards of every day and hour over by `before_ns` into one
    row a key and bucket (`MERGED`), in the caller's transaction, and drop the merged rows that
    sum to nothing (days and hours prune emptied). A grouping by hour over all time reads a row a
    bucket instead of one a recorder; the days and hours still being written stay sharded.
    The shards' rows are locked in key order, as every writer locks them. Returns how many
    merged rows it wrote."""
    merged = conn.exec_driver_sql(_MERGE, (before_ns,)).rowcount
    conn.exec_driver_sql(_EMPTIED)
    return merged
