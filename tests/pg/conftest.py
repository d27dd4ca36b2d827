"""PostgreSQL fixtures: the server at TRACEDB_TEST_PG_URL, one fresh schema per test.

Every test gets a URL whose connections use only its own schema (`options=-csearch_path=...`),
created before the test and dropped after it; nothing outside that schema is touched. Without
TRACEDB_TEST_PG_URL, or with no server answering there, the tests skip and say why.
"""

from __future__ import annotations

import os
import uuid

import pytest
import sqlalchemy as sa

import tracedb
from tracedb.projection import db

PG_ENV = "TRACEDB_TEST_PG_URL"


def schema_url(server_url: str, schema: str) -> str:
    """`server_url` with every connection's search_path set to `schema` alone, and named after
    it (application_name) so that the test's leftover sessions can be found and ended."""
    url = sa.engine.make_url(server_url).update_query_dict(
        {"options": f"-csearch_path={schema}", "application_name": schema}
    )
    return url.render_as_string(hide_password=False)


def _admin_connect(server_url: str):
    import psycopg

    url = sa.engine.make_url(server_url)
    return psycopg.connect(
        host=url.host or "127.0.0.1", port=url.port or 5432, user=url.username,
        password=url.password, dbname=url.database, connect_timeout=3, autocommit=True,
    )


@pytest.fixture(scope="session")
def pg_server() -> str:
    """The server URL, or a skip saying why there is none."""
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(
            f"{PG_ENV} is not set, so there is no PostgreSQL server to test against "
            "(scripts/test sets it to postgresql+psycopg://postgres@127.0.0.1:5432/test)"
        )
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg (PostgreSQL driver) is not installed: pip install 'tracedb[postgres]'")
    try:
        conn = _admin_connect(url)
    except Exception as e:  # noqa: BLE001 - any failure means: no server to test against
        pytest.skip(f"no PostgreSQL server answers at {db.describe(url)}: {db.first_line(e)}")
    conn.close()
    return url


@pytest.fixture
def pg_admin(pg_server):
    """An autocommit psycopg connection to the server, outside any test schema."""
    conn = _admin_connect(pg_server)
    yield conn
    conn.close()


@pytest.fixture
def pg_schema(pg_server, pg_admin):
    """A fresh schema name, dropped (with everything in it) after the test."""
    schema = "tracedb_test_" + uuid.uuid4().hex[:12]
    pg_admin.execute(f'CREATE SCHEMA "{schema}"')
    yield schema
    # Sessions a test left open would hold locks on the schema's tables: end them first.
    pg_admin.execute(
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
        "WHERE pid <> pg_backend_pid() AND application_name = %s",
        (schema,),
    )
    pg_admin.execute("SET lock_timeout = '10s'")
    pg_admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def pg_url(pg_server, pg_schema) -> str:
    """A URL for this test's own schema."""
    return schema_url(pg_server, pg_schema)


@pytest.fixture
def pg_engine(pg_url):
    engine = db.create_engine(pg_url)
    yield engine
    engine.dispose()


@pytest.fixture
def open_pg_store(pg_url, tmp_path):
    """open_pg_store(name="a", **settings) -> Store with its own data dir, compacting into this
    test's schema; background work off unless asked for; closed at teardown."""
    opened = []

    def _open(name: str = "a", clock=None, **settings):
        settings.setdefault("compact_interval_ms", 0)
        settings.setdefault("idle_timeout_s", 0)
        settings["db_url"] = pg_url
        store = tracedb.open(str(tmp_path / name), config=settings, clock=clock)
        opened.append(store)
        return store

    yield _open
    for s in opened:
        s.close()


def counts(engine) -> tuple[int, int]:
    from tracedb.projection.models import trace_steps, traces

    with engine.connect() as conn:
        return (
            conn.execute(sa.select(sa.func.count()).select_from(traces)).scalar(),
            conn.execute(sa.select(sa.func.count()).select_from(trace_steps)).scalar(),
        )


# -- seed 002's execution and a recorder process, as in tests/store ---------------------------

from tests.children import Child, killed_after  # noqa: E402
from tests.store.conftest import (  # noqa: E402,F401
    ENVELOPE,
    SEED_002_EVENTS,
    FakeClock,
    assert_compaction_skips_a_pruned_trace,
    invalidated_in_the_database,
    record_seed_002,
)


CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pg_child.py")


@pytest.fixture
def children():
    """children(data_dir, db_url, *args) -> Child; any left running are killed at teardown."""
    def start(data_dir: str, db_url: str, *args: str) -> Child:
        return Child(CHILD, data_dir, *args, env={"TRACEDB_DB_URL": db_url})

    with killed_after(start) as tracked:
        yield tracked
