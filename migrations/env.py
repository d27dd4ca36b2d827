"""Alembic environment for tracedb.

tracedb runs Alembic programmatically (`tracedb.projection.db.migrate`): the caller hands over an open
connection in `config.attributes["connection"]`, already inside the transaction that serialises
concurrent migrators, so the migration and its version row commit together. Run from the alembic
command line, `sqlalchemy.url` (or TRACEDB_DB_URL, or TRACEDB_DATABASE_URL) names the database
instead.
"""

from __future__ import annotations

import os

from alembic import context
from tracedb.projection.db import create_engine
from tracedb.projection.models import metadata

config = context.config


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = (
        config.get_main_option("sqlalchemy.url")
        or os.environ.get("TRACEDB_DB_URL")
        or os.environ.get("TRACEDB_DATABASE_URL")
    )
    if not url:
        raise RuntimeError("set sqlalchemy.url or TRACEDB_DB_URL, or use `tracedb migrate`")
    # tracedb's engine: SQLite's pragmas, PostgreSQL's session settings, psycopg 3 by default.
    engine = create_engine(url, write=True)
    with engine.begin() as conn:
        _run(conn)


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
