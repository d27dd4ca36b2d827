"""Exact or refused, on PostgreSQL: the same property as tests/interop/test_exact_values.py,
recorded into this test's schema and imported into a second schema (JSON columns of
PostgreSQL's own on both sides)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings

import tracedb
from tests.interop.exact_roundtrip import round_trip, values

from .conftest import schema_url

pytestmark = pytest.mark.postgres
# Exactness is tested without the default redaction: a generated key such as "APIKEY" would be
# rewritten (tests/store and tests/sidecar test redaction).
SETTINGS = {"compact_interval_ms": 0, "idle_timeout_s": 0, "redact": False}


@pytest.fixture
def pg_stores(pg_server, pg_admin, pg_url, tmp_path):
    """A store compacting into this test's schema, and one into a second schema of its own."""
    other = "tracedb_test_" + uuid.uuid4().hex[:12]
    pg_admin.execute(f'CREATE SCHEMA "{other}"')
    a = tracedb.open(str(tmp_path / "a"), config={**SETTINGS, "db_url": pg_url})
    b = tracedb.open(str(tmp_path / "b"), config={**SETTINGS, "db_url": schema_url(pg_server, other)})
    try:
        yield a, b
    finally:
        a.close()
        b.close()
        pg_admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND application_name = %s", (other,),
        )
        pg_admin.execute(f'DROP SCHEMA "{other}" CASCADE')


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(v_env=values, v_event=values, v_bare=values, v_response=values)
def test_values_come_back_identical_or_are_refused_on_postgresql(pg_stores, v_env, v_event, v_bare, v_response):
    round_trip(*pg_stores, v_env, v_event, v_bare, v_response)


def test_the_values_that_used_to_change_silently_on_postgresql(pg_stores):
    round_trip(*pg_stores, {"big": (1 << 64) - 1, "f": -0.0, "one": 1.0}, [1e16, 1e-300, 0.1], 1.5,
               {"s": "\u0000 \u2028 \U0001F600 é", "n": None, "t": True})
