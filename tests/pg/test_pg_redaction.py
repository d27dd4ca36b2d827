"""Redaction on a fleet: what the [redaction] rules match never reaches PostgreSQL either."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.store.redaction_config import SECRET_KEY, SECRET_PASSWORD, envelope, response, tool_call

pytestmark = pytest.mark.postgres


def test_no_secret_reaches_postgresql(open_pg_store, pg_engine):
    store = open_pg_store()  # the default rules: authorization, api_key, password, ...
    ex = store.start("Research", envelope())
    ex.event("tool.requested", tool_call())
    ex.finish(response())
    store.compact()
    rec = store.get(ex.execution_id)
    assert rec.events[0].payload["api_key"] == "[REDACTED]" and rec.header.replayable
    with pg_engine.connect() as conn:
        text = " ".join(
            str(v) for v in conn.execute(sa.text(
                "SELECT t.envelope::text, t.final_response::text, s.payload::text, t.meta::text "
                "FROM traces t JOIN trace_steps s USING (execution_id)"
            )).all()
        )
    assert "[REDACTED]" in text
    assert SECRET_KEY not in text and SECRET_PASSWORD not in text
