"""Database engines and the schema's migration.

SQLite settings, and why:
- `foreign_keys=ON` on every connection: SQLite ignores FOREIGN KEY clauses otherwise, and deleting
  a trace must never leave orphan steps.
- `journal_mode=WAL`: readers (the CLI, `tracedb inspect` from cron) never block the compactor.
- `synchronous=FULL`: each commit is fsynced. The projection can be rebuilt from the tracedb WAL only
  until `mark_applied` deletes segments, so the rows and the applied LSN must be durable before
  that call. Commits are batches of thousands of records, so the fsync is amortised.
- The file is made private (0600) before SQLite opens it, and a writer makes an existing one
  private: SQLite gives the `-wal`, `-shm` and journal files it creates the database file's mode,
  and makes the database file itself with a mode of its own (0644 less the umask).
- `busy_timeout`: a writer (prune from cron, `tracedb invalidate`) waits for the other instead of
  failing at once.
- `auto_vacuum=INCREMENTAL`: must be set before the first table exists; lets prune give space back
  with `PRAGMA incremental_vacuum` instead of a full VACUUM that rewrites the file.
- Writers begin with `BEGIN IMMEDIATE`: a deferred transaction that reads, then writes, can fail
  with SQLITE_BUSY without waiting when another process committed in between.

PostgreSQL (a fleet's shared database, `db_url`), the same concerns and their equivalents:
- foreign keys are always enforced; MVCC already lets readers and writers proceed together.
- `synchronous_commit = on` for every tracedb session: a recorder deletes its WAL segments once
  a commit returns, so an asynchronous commit lost in a server crash would lose those records for
  good. "on" overrides a server-wide "off"; it cannot fix a server running with fsync = off.
- `lock_timeout` = busy_timeout_ms: a writer waits that long for a row lock (prune from cron,
  `tracedb invalidate`), then fails and retries, instead of hanging forever.
- auto_vacuum / incremental_vacuum / wal_checkpoint: the server's autovacuum and checkpointer own
  space and WAL; prune runs a plain VACUUM (never VACUUM FULL, which locks out the recorders).
- BEGIN IMMEDIATE: not needed; rows are locked as they are written (READ COMMITTED). The one
  read-then-write that must be serialised, creating the schema, takes an advisory lock.
- `pool_pre_ping`: a pooled connection dropped by the server (restart, idle timeout, an operator's
  pg_terminate_backend) is replaced at checkout instead of failing the next read.
"""

from __future__ import annotations

import os
import sqlite3
from typing import TYPE_CHECKING, Optional

import orjson
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from wal.fs import PRIVATE_FILE, OsFileSystem, make_private

from tracedb.projection import models
from tracedb.reads import sqlite as sqlite_reads
from tracedb.errors import ConfigError, DatabaseUnavailableError, StoreNotFoundError, path_exists
from tracedb.program import extra_hint
from tracedb.projection.schema import HEAD_REVISION
from tracedb.imports import on_first_use

if TYPE_CHECKING:
    import aiosqlite
    from alembic import command as alembic_command
    from alembic import config as alembic_config
    from alembic.runtime import migration as alembic_migration
    from sqlalchemy.ext import asyncio as sa_asyncio

    from tracedb import migrations
else:
    # Lazy seams (`tracedb.imports`): Alembic and the revisions only when there is something to
    # migrate (`current_revision` reads a current schema without them); the asyncio engine only
    # for an AsyncReader (the web view).
    alembic_command = on_first_use("alembic.command")
    alembic_config = on_first_use("alembic.config")
    alembic_migration = on_first_use("alembic.runtime.migration")
    migrations = on_first_use("tracedb.migrations")
    sa_asyncio = on_first_use("sqlalchemy.ext.asyncio")
    aiosqlite = on_first_use("aiosqlite")


def _json_serializer(value) -> str:
    return orjson.dumps(value).decode()


def is_url(target: str) -> bool:
    """True for an SQLAlchemy URL (`postgresql+psycopg://...`), False for a file path."""
    return "://" in target


def describe(target) -> str:
    """The database for messages and logs: a URL without its password, or the SQLite file."""
    if isinstance(target, sa.engine.URL):
        return target.render_as_string(hide_password=True)
    if not is_url(str(target)):
        return str(target)
    try:
        return sa.engine.make_url(str(target)).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<a database URL that does not parse>"


def first_line(error: BaseException) -> str:
    """The driver's message of a database error, first line only (the rest is SQL and context)."""
    orig = getattr(error, "orig", None) or error
    text = str(orig).strip()
    return text.splitlines()[0] if text else type(orig).__name__


def sqlstate(error: BaseException) -> Optional[str]:
    """The SQLSTATE of a database error (PostgreSQL's five characters), None if it has none."""
    return getattr(getattr(error, "orig", None), "sqlstate", None)


# SQLSTATEs of a transaction that may simply run again: serialization_failure,
# deadlock_detected, lock_not_available (lock_timeout).
RETRY_SQLSTATES = frozenset({"40001", "40P01", "55P03"})


def is_disconnect(error: BaseException) -> bool:
    """True when a database error means the connection itself is gone (server restarted,
    backend terminated, network cut): the work can be retried on a new connection."""
    if isinstance(error, sa.exc.ResourceClosedError):
        return True
    if not isinstance(error, sa.exc.DBAPIError):
        return False
    if error.connection_invalidated:
        return True
    state = sqlstate(error)
    if isinstance(error, sa.exc.OperationalError):
        # No SQLSTATE: the driver lost the socket. 08xxx: connection exception. 57P01-57P03:
        # the server is shutting the session down (pg_terminate_backend, restart).
        return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")
    # Commands on a closed psycopg connection surface as InterfaceError.
    return isinstance(error, sa.exc.InterfaceError)


def _parse_url(target: str) -> sa.engine.URL:
    try:
        url = sa.engine.make_url(target)
    except sa.exc.ArgumentError as e:
        raise ConfigError(
            f"{describe(target)} is not a database URL: {e}",
            hint="write it in SQLAlchemy form, e.g. postgresql+psycopg://user@host:5432/dbname",
        ) from None
    if url.drivername in ("postgresql", "postgres"):
        # SQLAlchemy's default PostgreSQL driver is psycopg2; tracedb depends on psycopg 3.
        url = url.set(drivername="postgresql+psycopg")
    return url


def create_engine(target: str, *, busy_timeout_ms: int = 5000, write: bool = False) -> Engine:
    """An engine for the SQLite file `target`, or for a database URL (SQLite or PostgreSQL).

    `write=True` makes every transaction of the engine start with BEGIN IMMEDIATE on SQLite.
    """
    if is_url(target):
        url = _parse_url(target)
        backend = url.get_backend_name()
        if backend == "sqlite":
            if not url.database or url.database == ":memory:":
                raise ConfigError(
                    f"{target} names no SQLite file",
                    hint="give a file (sqlite:///path/traces.db), or leave db_url empty for "
                    "<data_dir>/traces.db",
                )
            return _create_sqlite_engine(url.database, busy_timeout_ms, write)
        if backend != "postgresql":
            raise ConfigError(
                f"{describe(url)}: tracedb stores traces in SQLite or PostgreSQL, not {backend}",
                hint="use a postgresql+psycopg:// URL, or leave db_url empty for SQLite",
            )
        return _create_pg_engine(url, busy_timeout_ms)
    return _create_sqlite_engine(target, busy_timeout_ms, write)


def _create_pg_engine(url: sa.engine.URL, busy_timeout_ms: int) -> Engine:
    connect_args: dict = {}
    if "connect_timeout" not in url.query:
        # A server that does not answer fails the command in seconds, with the hint below.
        connect_args["connect_timeout"] = 10
    try:
        engine = sa.create_engine(
            url,
            json_serializer=_json_serializer,
            json_deserializer=orjson.loads,
            pool_pre_ping=True,
            # Many recorders share one server (max_connections is 100 by default): keep few
            # idle connections per engine; bursts still get up to 10 more.
            pool_size=2,
            max_overflow=10,
            connect_args=connect_args,
        )
    except ModuleNotFoundError as e:
        raise ConfigError(
            f"the PostgreSQL driver for {describe(url)} is not installed ({e.name})",
            hint=extra_hint("postgres"),
        ) from None
    set_name = "application_name" not in url.query

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Session settings, committed at once: a SET inside a transaction that SQLAlchemy later
        # rolls back would be undone. See the module doc for why each one.
        with dbapi_conn.cursor() as cur:
            cur.execute("SET synchronous_commit TO on")
            cur.execute(f"SET lock_timeout TO {int(busy_timeout_ms)}")
            if set_name:
                # Lets operators (and tests) find tracedb's sessions in pg_stat_activity.
                cur.execute("SET application_name TO 'tracedb'")
        dbapi_conn.commit()

    return engine


def sqlite_json(value):
    """A JSON column's value as SQLite hands it back (None, a number, or JSON text), decoded."""
    if value is None:
        return None
    return _sqlite_json_loads(value)


def _sqlite_json_loads(value):
    """Read a JSON column of SQLite. A column declared JSON has NUMERIC affinity: SQLite stores
    a document that is a bare number (a payload of `5` or `1.5`) as an INTEGER or REAL, and hands
    back a number, not its text. It is the value already; anything else is JSON text."""
    if isinstance(value, (int, float)):
        return value
    return orjson.loads(value)


def undecoded(column, dialect: str):
    """A JSON `column` selected as the database stores it, not decoded (for its checksum,
    `tracedb.projection.checksums`): PostgreSQL's json as its verbatim text, SQLite's value as it is (a
    cast would spell a REAL its own way). Labelled with the column's name."""
    if dialect == "postgresql":
        return sa.cast(column, sa.Text).label(column.name)
    return sa.type_coerce(column, sa.Text).label(column.name)


# The files SQLite keeps beside a database file, made with its mode.
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def make_private_database(path: str) -> None:
    """Create the SQLite file `path` (empty, 0600, its directory fsynced) before SQLite does, or
    make an existing one and the files SQLite keeps beside it 0600 when they are ours: new
    traces go on being written into them, and SQLite makes each new -wal or -shm file with the
    database file's mode."""
    path = os.path.abspath(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    except FileExistsError:
        for name in (path, *(path + side for side in SQLITE_SIDE_FILES)):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # none (most often), or not ours to read: SQLite says what it finds
            try:
                make_private(fd)
            finally:
                os.close(fd)
        return
    except OSError:
        return  # SQLite cannot make it either, and reports why as it always has
    try:
        make_private(fd)
    finally:
        os.close(fd)
    OsFileSystem().fsync_dir(os.path.dirname(path))


def _create_sqlite_engine(path: str, busy_timeout_ms: int, write: bool) -> Engine:
    if write:
        make_private_database(path)
    engine = sa.create_engine(
        "sqlite:///" + os.path.abspath(path),
        json_serializer=_json_serializer,
        json_deserializer=_sqlite_json_loads,
        connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000.0},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Let SQLAlchemy's "begin" event below issue BEGIN itself (pysqlite's own is deferred).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        if write:
            # Takes the write lock even when it changes nothing: readers must not wait for it.
            cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.close()

    begin = "BEGIN IMMEDIATE" if write else "BEGIN"

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql(begin)

    _name_refusing_files(engine, path, write)
    return engine


def _name_refusing_files(engine: Engine, path: str, write: bool) -> None:
    """SQLite says "unable to open database file" or "attempt to write a readonly database"
    without naming the file or the reason: such an error is raised as the one that names which
    file refuses this process and what to run (`sqlite_reads.access_error`)."""

    @event.listens_for(engine, "handle_error")
    def _file_errors(context):
        return sqlite_reads.access_error(path, context.original_exception, write=write)


def unavailable(engine: Engine, error: BaseException) -> DatabaseUnavailableError:
    """The error to raise when a server database fails at the connection level."""
    return DatabaseUnavailableError(describe(engine.url), first_line(error))


def _alembic_config(connection):
    cfg = alembic_config.Config()
    cfg.set_main_option("script_location", os.path.dirname(os.path.abspath(migrations.__file__)))
    cfg.attributes["connection"] = connection
    return cfg


def current_revision(engine: Engine) -> Optional[str]:
    """The schema revision the database is at, None for an empty database.

    A plain read of Alembic's version table: read commands check it on every start, and
    Alembic itself is imported only when there is something to migrate."""
    try:
        with engine.connect() as conn:
            try:
                rows = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all()
            except (sa.exc.OperationalError, sa.exc.ProgrammingError) as e:
                if "no such table" in str(e.orig) or sqlstate(e) == "42P01":
                    return None
                raise
    except sa.exc.OperationalError as e:
        if engine.dialect.name == "sqlite":
            raise
        raise unavailable(engine, e) from e
    return rows[0] if len(rows) == 1 else (None if not rows else ",".join(sorted(rows)))


def migrate(engine: Engine, revision: str = "head") -> Optional[str]:
    """Upgrade the schema to `revision` (head by default); return the revision it was at before.

    The check and the upgrade run in one write transaction, so two processes opening a new data
    directory at the same time cannot both create the tables. On PostgreSQL, where a transaction
    takes no lock by beginning, an advisory lock keyed by the schema does that: many recorders
    starting at once against a new database create its tables exactly once.
    """
    if revision == "head" and current_revision(engine) == HEAD_REVISION:
        return HEAD_REVISION
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(
                    "SELECT pg_advisory_xact_lock(hashtext('tracedb.migrate.' || "
                    "coalesce(current_schema(), '')))"
                )
            before = alembic_migration.MigrationContext.configure(conn).get_current_revision()
            alembic_command.upgrade(_alembic_config(conn), revision)
    except sa.exc.OperationalError as e:
        if engine.dialect.name == "sqlite":
            raise
        raise unavailable(engine, e) from e
    except sa.exc.ProgrammingError as e:
        if engine.dialect.name == "sqlite" or getattr(e.orig, "sqlstate", None) != "42501":
            raise
        raise DatabaseUnavailableError(
            describe(engine.url), first_line(e),
            hint="this database user may not create tracedb's tables: run `tracedb --db URL "
            "migrate` once as a user who may (or GRANT CREATE ON SCHEMA to this one)",
        ) from e
    return before


def open_store_engine(database: str, *, busy_timeout_ms: int = 5000, write: bool = False) -> Engine:
    """An engine on an existing store's database, its schema brought to the current revision.

    StoreNotFoundError (exit 3) when there is no store; no WAL lock is taken. Without `write`
    the database refuses writes on the engine's connections; with it, SQLite transactions
    BEGIN IMMEDIATE, for the maintenance calls that write.
    """
    require_store(database)
    engine = create_engine(database, busy_timeout_ms=busy_timeout_ms, write=write)
    if not write:
        event.listen(engine, "connect", _refuse_writes)
    try:
        revision = current_revision(engine)
        if revision is None and is_url(database):
            # A database (or schema) with no tracedb tables: a command that reads or maintains a
            # store does not make one there.
            raise StoreNotFoundError(
                describe(database),
                hint="check the URL's database and search_path (--db or TRACEDB_DB_URL); the first "
                "`tracedb serve` compacting into it, or `tracedb --db URL migrate`, makes the tables",
            )
        if revision != HEAD_REVISION:
            writer = engine if write else create_engine(database, busy_timeout_ms=busy_timeout_ms, write=True)
            try:
                migrate(writer)
            finally:
                if writer is not engine:
                    writer.dispose()
    except BaseException:
        engine.dispose()
        raise
    return engine


def create_async_read_engine(database: str, *, busy_timeout_ms: int = 5000):
    """An asyncio engine that only reads: `sqlite+aiosqlite` for a SQLite file, psycopg's async
    mode for PostgreSQL. The same JSON decoding and session settings as the sync engines; the
    database refuses writes on its connections."""
    if is_url(database):
        url = _parse_url(database)
        if url.get_backend_name() != "sqlite":
            engine = sa_asyncio.create_async_engine(
                url, json_serializer=_json_serializer, json_deserializer=orjson.loads,
                pool_pre_ping=True, pool_size=2, max_overflow=10,
            )

            @event.listens_for(engine.sync_engine, "connect")
            def _read_only(dbapi_conn, _record):
                cur = dbapi_conn.cursor()
                cur.execute("SET default_transaction_read_only TO on")
                cur.close()
                dbapi_conn.commit()

            return engine
        database = url.database
    path = os.path.abspath(database)

    async def connect_read_only():
        # Opened read-only by SQLite itself, as the sidecar's quick reader is.
        return await aiosqlite.connect(sqlite_reads.read_uri(path), uri=True, timeout=busy_timeout_ms / 1000.0)

    engine = sa_asyncio.create_async_engine(
        "sqlite+aiosqlite://",
        async_creator=connect_read_only,
        json_serializer=_json_serializer,
        json_deserializer=_sqlite_json_loads,
    )
    _name_refusing_files(engine.sync_engine, path, False)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn, _record):
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cur.execute("PRAGMA query_only=ON")
        cur.close()

    return engine


def _refuse_writes(dbapi_conn, _record) -> None:
    # Runs after the engine's own connect settings (listeners run in the order they were added).
    if isinstance(dbapi_conn, sqlite3.Connection):
        dbapi_conn.execute("PRAGMA query_only = ON")
        return
    with dbapi_conn.cursor() as cur:
        cur.execute("SET default_transaction_read_only TO on")
    dbapi_conn.commit()


def require_store(path: str) -> None:
    """Refuse to read a store that does not exist, instead of creating an empty one (one hidden
    by permissions is the error that says so, not a missing one)."""
    if is_url(path):
        return
    if not path_exists(path):
        raise StoreNotFoundError(path)


def checkpoint_sqlite(engine: Engine) -> Optional[tuple[int, int, int]]:
    """SQLite: copy the write-ahead log into the database file and truncate it
    (`wal_checkpoint(TRUNCATE)`), so that the file alone holds every commit. It waits up to the
    busy timeout for readers inside a transaction; (busy, frames in the log, frames copied),
    busy 1 when one still held it. None on PostgreSQL."""
    if engine.dialect.name != "sqlite":
        return None
    raw = engine.raw_connection()
    try:
        # Outside any transaction (the engine's BEGIN IMMEDIATE would make it fail as locked).
        row = raw.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        raw.close()
    return int(row[0]), int(row[1]), int(row[2])


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
    """Problems the database itself reports, and broken invariants of the projection.

    SQLite: integrity_check and foreign_key_check. PostgreSQL, which has no whole-database check:
    the schema revision, the primary keys, the foreign key from steps to traces (present,
    validated, ON DELETE CASCADE) and index validity, read from the catalog. Both: no recorder
    has rows beyond its checkpoint (rows and checkpoint commit together, so any such row was
    written outside the compactor), and every recorder with rows has a checkpoint.
    """
    problems: list[str] = []
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            rows = [r[0] for r in conn.exec_driver_sql("PRAGMA integrity_check").fetchall()]
            if rows != ["ok"]:
                problems.extend(f"sqlite integrity_check: {r}" for r in rows)
            for r in conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall():
                problems.append(f"sqlite foreign_key_check: row {r[1]} of {r[0]} references missing {r[2]}")
    elif engine.dialect.name == "postgresql":
        problems.extend(_pg_catalog_check(engine))
    problems.extend(_checkpoint_check(engine))
    return problems


def _checkpoint_check(engine: Engine) -> list[str]:
    t, s, cp = models.traces, models.trace_steps, models.compaction_checkpoint
    problems: list[str] = []
    with engine.connect() as conn:
        applied = dict(conn.execute(sa.select(cp.c.recorder_id, cp.c.applied_lsn)).all())
        newest = conn.execute(
            sa.select(t.c.recorder_id, sa.func.max(s.c.lsn))
            .select_from(s.join(t, s.c.execution_id == t.c.execution_id))
            .group_by(t.c.recorder_id)
        ).all()
        owners = conn.execute(sa.select(t.c.recorder_id).distinct()).scalars().all()
    for rid, lsn in newest:
        if rid in applied and lsn is not None and lsn > applied[rid]:
            problems.append(
                f"recorder {rid!r}: steps from WAL LSN {lsn} but its checkpoint is at {applied[rid]}"
            )
    for rid in owners:
        if rid not in applied:
            problems.append(f"recorder {rid!r} has traces but no compaction checkpoint")
    return problems


def _pg_catalog_check(engine: Engine) -> list[str]:
    problems: list[str] = []
    with engine.connect() as conn:
        rev = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all()
        if rev != [HEAD_REVISION]:
            problems.append(f"postgresql: schema revision {rev} where {HEAD_REVISION!r} was expected")
        pkeys = dict(
            conn.exec_driver_sql(
                "SELECT c.relname, pg_get_constraintdef(k.oid) FROM pg_constraint k "
                "JOIN pg_class c ON c.oid = k.conrelid "
                "WHERE k.contype = 'p' AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) "
                "AND c.relname IN ('traces', 'trace_steps', 'compaction_checkpoint')"
            ).all()
        )
        expected = {
            "traces": "PRIMARY KEY (execution_id)",
            "trace_steps": "PRIMARY KEY (execution_id, seq)",
            "compaction_checkpoint": "PRIMARY KEY (recorder_id)",
        }
        for table, definition in expected.items():
            if pkeys.get(table) != definition:
                problems.append(f"postgresql: {table} has {pkeys.get(table) or 'no primary key'}, not {definition}")
        fk = conn.exec_driver_sql(
            "SELECT k.convalidated, k.confdeltype, k.confrelid::regclass::text FROM pg_constraint k "
            "WHERE k.conname = 'fk_trace_steps_trace' AND k.contype = 'f' "
            "AND k.connamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())"
        ).first()
        if fk is None:
            problems.append("postgresql: the foreign key fk_trace_steps_trace (trace_steps -> traces) is missing")
        else:
            validated, on_delete, target = fk
            if not validated:
                problems.append("postgresql: fk_trace_steps_trace is NOT VALID: steps may reference missing traces")
            if on_delete != "c":
                problems.append("postgresql: fk_trace_steps_trace does not cascade deletes to the steps")
            if target.split(".")[-1] != "traces":
                problems.append(f"postgresql: fk_trace_steps_trace references {target}, not traces")
        for (name,) in conn.exec_driver_sql(
            "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "JOIN pg_class c ON c.oid = x.indrelid "
            "WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) "
            "AND c.relname IN ('traces', 'trace_steps', 'compaction_checkpoint') "
            "AND NOT (x.indisvalid AND x.indisready)"
        ).all():
            problems.append(f"postgresql: index {name} is invalid (an interrupted build?); REINDEX it")
    return problems
