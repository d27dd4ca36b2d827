"""IntentusNet on a fleet: a router records into a PostgreSQL-backed store, and a reader on
another machine (the database URL alone) hands the record to IntentusNet's ReplayEngine."""

from __future__ import annotations

import pytest

from tracedb.projection import db
from tracedb.interop.intentusnet import TraceDBExecutionStore, to_plain

pytestmark = pytest.mark.postgres
intentusnet = pytest.importorskip(
    "intentusnet", reason="the intentusnet package is not installed (pip install intentusnet)"
)
from intentusnet import ReplayEngine  # noqa: E402

from tests.interop.conftest import Upper, envelope, make_router  # noqa: E402


def test_a_router_records_into_postgresql_and_intentusnet_replays_from_the_database(open_pg_store, pg_url):
    store = open_pg_store()
    router = make_router(TraceDBExecutionStore(store), (Upper, "upper", "Up"))
    env, as_recorded = envelope("Up", "fleet")
    response = router.route_intent(env)
    store.compact()
    engine = db.create_engine(pg_url)
    try:
        reader = TraceDBExecutionStore.reader(engine)
        (eid,) = reader.list_ids()
        result = ReplayEngine(reader.load(eid)).replay(env=as_recorded)
    finally:
        engine.dispose()
    assert result.envelope_hash_ok and result.response == to_plain(response)
