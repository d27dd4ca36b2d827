"""Database engines and the schema's migration.

SQLite settings, and why:
- `foreign_keys=ON` on every connection: SQLite ignores FOREIGN KEY clauses otherwise, and deleting
  a trace must never leave orphan steps.
- `journal_mode=WAL`: readers (the CLI, `tracedb inspect` from cron) never block the compactor.
- `synchronous=FULL`: each commit is fsynced. The projection can be rebuilt from the tracedb WAL only
  until `mark_applied` deletes segments, so the rows and the applied LSN must be durable before
  that call. Commits are batches of thousands of records, so the fsync is amortised.
- `busy_timeout`: a writer (prune from cron, `tracedb invalidate`) waits for the other instead of
  failing at once.
- `auto_vacuum=INCREMENTAL`: must be set before the first table exists; lets prune give space back
  with `PRAGMA incremental_vacuum` instead of a full VACUUM that rewrites the file.
- Writers begin with `BEGIN IMMEDIATE`: a deferred transaction that reads, then writes, can fail
  with SQLITE_BUSY without waiting when another process committed in between.
"""

from __future__ import annotations

import os
from typing import Optional

import orjson
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

from . import models
from .errors import StoreNotFoundError

HEAD_REVISION = "0001"


def _json_serializer(value) -> str:
    return orjson.dumps(value).decode()


def is_url(target: str) -> bool:
    """True for an SQLAlchemy URL (`postgresql+psycopg://...`), False for a file path."""
    return "://" in target


def create_engine(target: str, *, busy_timeout_ms: int = 5000, write: bool = False) -> Engine:
    """An engine for the SQLite file `target` (or an SQLAlchemy URL).

    `write=True` makes every transaction of the engine start with BEGIN IMMEDIATE on SQLite.
    """
    if is_url(target):
        return sa.create_engine(
            target, json_serializer=_json_serializer, json_deserializer=orjson.loads
        )
    engine = sa.create_engine(
        "sqlite:///" + os.path.abspath(target),
        json_serializer=_json_serializer,
        json_deserializer=orjson.loads,
        connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000.0},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Let SQLAlchemy's "begin" event below issue BEGIN itself (pysqlite's own is deferred).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.close()

    begin = "BEGIN IMMEDIATE" if write else "BEGIN"

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql(begin)

    return engine


def _alembic_config(connection):
    from alembic.config import Config as AlembicConfig

    import migrations

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", os.path.dirname(os.path.abspath(migrations.__file__)))
    cfg.attributes["connection"] = connection
    return cfg


def current_revision(engine: Engine) -> Optional[str]:
    """The schema revision the database is at, None for an empty database."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def migrate(engine: Engine, revision: str = "head") -> Optional[str]:
    """Upgrade the schema to `revision` (head by default); return the revision it was at before.

    The check and the upgrade run in one write transaction, so two processes opening a new data
    directory at the same time cannot both create the tables.
    """
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    if revision == "head" and current_revision(engine) == HEAD_REVISION:
        return HEAD_REVISION
    with engine.begin() as conn:
        before = MigrationContext.configure(conn).get_current_revision()
        command.upgrade(_alembic_config(conn), revision)
    return before


def require_store(path: str) -> None:
    """Refuse to read a store that does not exist, instead of creating an empty one."""
    if is_url(path):
        return
    if not os.path.exists(path):
        raise StoreNotFoundError(path)


def ensure_checkpoint(engine: Engine, recorder_id: str, now_ns: int) -> int:
    """Make sure the recorder's checkpoint row exists; return its applied LSN (0: nothing applied)."""
    cp = models.compaction_checkpoint
    with engine.begin() as conn:
        row = conn.execute(
            sa.select(cp.c.applied_lsn).where(cp.c.recorder_id == recorder_id)
        ).first()
        if row is not None:
            return int(row[0])
        conn.execute(
            cp.insert().values(recorder_id=recorder_id, applied_lsn=0, updated_at_ns=now_ns)
        )
        return 0


def integrity_check(engine: Engine) -> list[str]:
    """Problems the database itself reports (SQLite: integrity_check, foreign_key_check)."""
    problems: list[str] = []
    if engine.dialect.name != "sqlite":
        return problems
    with engine.connect() as conn:
        rows = [r[0] for r in conn.exec_driver_sql("PRAGMA integrity_check").fetchall()]
        if rows != ["ok"]:
            problems.extend(f"sqlite integrity_check: {r}" for r in rows)
        for r in conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall():
            problems.append(f"sqlite foreign_key_check: row {r[1]} of {r[0]} references missing {r[2]}")
    return problems
