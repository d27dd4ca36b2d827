"""`stats_rollup` kept a batch at a time by compaction and retention (SQLite).

Migration 0007 kept `stats_rollup` with triggers on `traces`: six or seven upserts each time an
execution finished or was deleted, in the statement that wrote its row. Compaction and prune
instead sum what a batch changes into one delta per grouping key and duration bucket, and
upsert those once a batch (migration 0008): `deferred` puts a row in `stats_rollup_deferred`
for their transaction, which the triggers wait on, and deletes it again before the transaction
commits. The writer reads the rows it is about to change (`read`), takes their contribution
away, writes, reads back those that are or were finished, and adds theirs.

`Delta.add` is the triggers' SQL (migrations 0007 and 0008: `_keys`, `_values`, `_bucket`)
written in Python, and must stay equal to it: tests/store/test_stats_rollup.py compares what
compaction and prune kept with the migration's backfill and with stats read off `traces`.
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
NUL = "\x00"  # the key of a NULL intent or model

# The columns of `traces` an execution's contribution is made of, in `Delta.add`'s order.
COLUMNS = ("intent", "outcome", "models", "input_tokens", "output_tokens", "cost_usd", "created_at_ns",
           "last_event_ns")
COUNTS = ("executions", "succeeded", "failed", "incomplete", "input_tokens", "output_tokens", "cost_nano_usd",
          "cost_unknown")

DEFER = "INSERT INTO stats_rollup_deferred (one) VALUES (1)"
RESUME = "DELETE FROM stats_rollup_deferred"
UPSERT = (
    f"INSERT INTO stats_rollup (dim, key, bucket, {', '.join(COUNTS)}) VALUES ({', '.join('?' * (3 + len(COUNTS)))})"
    " ON CONFLICT (dim, key, bucket) DO UPDATE SET " + ", ".join(f"{c} = {c} + excluded.{c}" for c in COUNTS)
)


def present(conn) -> bool:
    """Whether this database keeps the rollup by batch (SQLite, migration 0008)."""
    return conn.dialect.name == "sqlite" and conn.exec_driver_sql(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'stats_rollup_deferred'"
    ).first() is not None


@contextlib.contextmanager
def deferred(conn, keep: bool = True) -> Iterator[Optional["Delta"]]:
    """Inside the caller's transaction: the triggers wait, and the Delta yielded is upserted on
    leaving; None (nothing deferred) when `keep` is False. Only for a transaction that rolls back
    if the block raises: then nothing is upserted and the deferral goes with the rollback."""
    if not keep:
        yield None
        return
    conn.exec_driver_sql(DEFER)
    delta = Delta()
    yield delta
    delta.write(conn)
    conn.exec_driver_sql(RESUME)


def _div(a: int, b: int) -> int:
    """SQLite's integer division (towards zero)."""
    return a // b if a >= 0 else -((-a) // b)


class Delta:
    """What a batch adds to `stats_rollup`.

    The executions are kept by what they share (intent, outcome, models, hour, duration bucket,
    sign): a batch's executions fall in a few such groups, each summed once and spread over its
    grouping keys when written, instead of eight sums for each of six keys an execution."""

    __slots__ = ("groups",)

    def __init__(self):
        self.groups: dict = {}

    def add(self, intent, outcome, models: Optional[Iterable], input_tokens, output_tokens, cost_usd,
            created_at_ns: int, last_event_ns: Optional[int], sign: int = 1) -> None:
        """Add (`sign` 1) or take away (-1) one execution's contribution; nothing for one that is
        running (or has no outcome), as the triggers' `outcome <> 'running'`."""
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
               created_at_ns // HOUR_NS if created_at_ns >= 0 else _div(created_at_ns, HOUR_NS), b, sign)
        rows = self.groups.get(key)
        if rows is None:
            rows = self.groups[key] = []
        rows.append((input_tokens or 0, output_tokens or 0, cost_usd))

    def add_stored(self, row, sign: int = 1) -> None:
        """Add a row as `read` reads it (its models JSON text)."""
        models = row[2]
        self.add(row[0], row[1], orjson.loads(models) if models else None, *row[3:], sign=sign)

    def sums(self) -> dict:
        """(dim, key, bucket) -> the sums of COUNTS."""
        out: dict = {}
        for (intent, outcome, models, hour, b, sign), rows in self.groups.items():
            n = len(rows)
            tokens_in, tokens_out, costs = zip(*rows)
            known = [c for c in costs if c is not None]
            cost = sum([int(c * 1e9 + 0.5) if c >= 0 else -int(-c * 1e9 + 0.5) for c in known])  # _round
            values = (sign * n, sign * n * (outcome == "succeeded"), sign * n * (outcome == "failed"),
                      sign * n * (outcome == "incomplete"), sign * sum(tokens_in), sign * sum(tokens_out),
                      sign * cost, sign * (n - len(known)))
            hour_ns = hour * HOUR_NS
            keys = [("intent", NUL if intent is None else intent, b), ("outcome", outcome, b),
                    ("day", str(_div(hour_ns, DAY_NS) * DAY_NS), b),
                    ("hour", str(hour_ns), (b // HOUR_WIDTH) * HOUR_WIDTH if b >= 0 else b)]
            keys += [("model", NUL if m is None else str(m), b) for m in models]
            for key in keys:
                have = out.get(key)
                if have is None:
                    out[key] = [values]
                else:
                    have.append(values)
        return {k: v[0] if len(v) == 1 else tuple(map(sum, zip(*v))) for k, v in out.items()}

    def write(self, conn) -> int:
        """Upsert the sums that are not all zero; returns how many rows it upserted."""
        rows = [(*k, *v) for k, v in sorted(self.sums().items()) if any(v)]
        if rows:
            conn.exec_driver_sql(UPSERT, rows)
        return len(rows)


def select_sql(n: int) -> str:
    """The contribution columns (and the id, first) of `n` executions by id."""
    return (f"SELECT execution_id, {', '.join(COLUMNS)} FROM traces WHERE execution_id IN "
            f"({', '.join('?' * n)})")


def read(conn, ids: list) -> dict:
    """execution id -> its contribution columns (`COLUMNS`), for the ids that have a row."""
    out = {}
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        for r in conn.exec_driver_sql(select_sql(len(chunk)), tuple(chunk)):
            out[r[0]] = r[1:]
    return out
