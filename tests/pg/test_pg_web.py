"""The read API the web view stands on, on PostgreSQL: counts per status, the replayable filter,
progress after a seq, one event, diff and lineage, through the async reader (psycopg's async
mode) as `tracedb ui --db URL` reads them, and the pages rendered from them."""

from __future__ import annotations

import asyncio

import pytest

from tracedb.config import load_config
from tracedb.reads.reader import AsyncReader, Filter, Reader
from tracedb.web import create_app

pytestmark = pytest.mark.postgres


def _record(store) -> dict:
    ok = store.start("AnswerQuestion", {"intent": "AnswerQuestion"}, "exec-ok")
    ok.event("tool.requested", {"name": "calculator", "arguments": {"x": 1}})
    ok.event("tool.responded", {"name": "calculator", "request_seq": 1, "response": {"v": 1}})
    ok.finish({"status": "success"})
    other = store.start("AnswerQuestion", {"intent": "AnswerQuestion"}, "exec-other")
    other.event("tool.requested", {"name": "calculator", "arguments": {"x": 2}})
    other.finish({"status": "success"})
    from tracedb.replay import fork

    fork(store, "exec-ok", 1, new_execution_id="exec-fork").execution.finish({"status": "success"})
    crashed = store.start("Summarize", {"intent": "Summarize"}, "exec-crash")
    crashed.event("llm.requested", {"request": {"model": "m"}})
    store.invalidate("exec-other", "bad <b>")
    store.compact()
    return {"ok": "exec-ok", "other": "exec-other", "fork": "exec-fork", "crash": "exec-crash"}


def test_the_web_queries_on_postgresql(open_pg_store, pg_url):
    store = open_pg_store()
    ids = _record(store)
    cfg = load_config(overrides={"db_url": pg_url, "data_dir": store.config.data_dir})

    async def read():
        async with await AsyncReader.open(cfg) as r:
            return (
                await r.status_counts(),
                await r.status_counts(Filter(status="running", intent="AnswerQuestion")),
                await r.page(Filter(replayable=False)),
                await r.progress(ids["crash"], 0),
                await r.event(ids["ok"], 2),
                await r.diff(ids["ok"], ids["other"]),
                await r.lineage(ids["fork"]),
            )

    counts, answer_counts, not_replayable, progress, event, diff, lineage = asyncio.run(read())
    assert counts == {"running": 1, "completed": 2, "incomplete": 0, "invalidated": 1}
    assert answer_counts == {"running": 0, "completed": 2, "incomplete": 0, "invalidated": 1}
    assert {s.execution_id for s in not_replayable.items} == {ids["crash"], ids["other"]}
    assert (progress.status, [e.type for e in progress.events]) == ("running", ["llm.requested"])
    assert (event.type, event.payload) == ("tool.responded", {"name": "calculator", "request_seq": 1, "response": {"v": 1}})
    assert not diff.identical
    assert lineage.ancestors == ((ids["ok"], 1),)
    with Reader.open(cfg) as s:
        assert s.status_counts() == counts
        assert s.progress(ids["crash"], 0) == progress
        assert s.lineage(ids["ok"]).forks == ((ids["fork"], 1),)


def _pages(cfg, paths) -> list:
    """The web view's answers to `paths`, through the app itself over the async reader."""
    import httpx

    async def pages():
        reader = await AsyncReader.open(cfg)
        try:
            transport = httpx.ASGITransport(app=create_app(reader))
            async with httpx.AsyncClient(transport=transport, base_url="http://ui") as c:
                return [await c.get(p) for p in paths]
        finally:
            await reader.close()

    return asyncio.run(pages())


def test_the_pages_render_from_postgresql(open_pg_store, pg_url):
    store = open_pg_store()
    ids = _record(store)
    cfg = load_config(overrides={"db_url": pg_url, "data_dir": store.config.data_dir})

    running, crash, fork_page, diff, missing, bad = _pages(cfg, (
        "/?status=running", f"/e/{ids['crash']}", f"/e/{ids['fork']}", f"/diff?a={ids['ok']}&b={ids['other']}",
        "/e/exec-nope", "/?replayable=perhaps"))
    assert running.status_code == 200 and ids["crash"] in running.text and ids["ok"] not in running.text
    assert crash.status_code == 200 and 'class="bar llm open"' in crash.text
    assert f'forked from <a class="mono" href="/e/{ids["ok"]}">' in fork_page.text
    assert diff.status_code == 200 and "First divergence" in diff.text
    assert (missing.status_code, bad.status_code) == (404, 400)


def test_failures_filters_and_the_overview_render_from_postgresql(open_pg_store, pg_url):
    from tests.web.conftest import record_failed

    store = open_pg_store()
    ids = _record(store)
    failed = record_failed(store)
    store.compact()
    cfg = load_config(overrides={"db_url": pg_url, "data_dir": store.config.data_dir})

    every, only_failed, narrowed, costly, overview, hourly, page = _pages(cfg, (
        "/", "/?outcome=failed", "/?model=gpt-4o-mini&min_cost=0.0002&error=TOOL_TIMEOUT",
        "/?min_cost=0.001", "/overview", "/overview?per=hour&since=2000-01-01", f"/e/{failed}"))
    assert f'<tr data-id="{failed}" data-outcome="failed" class="failed">' in every.text
    assert ids["ok"] in every.text
    for r in (only_failed, narrowed):
        assert r.status_code == 200 and r.text.count("<tr data-id=") == 1 and failed in r.text
    assert "No execution matches" in costly.text
    assert overview.status_code == 200 and hourly.status_code == 200
    card = overview.text.split('data-testid="card-failed">')[1].split("</div></div>")[0]
    assert '<div class="value">1</div>' in card
    assert '<tr data-key="BookFlight" class="has-failed">' in overview.text
    assert 'class="bar tool err"' in page.text and "TOOL_TIMEOUT: search_flights timed out after 30 s" in page.text


def test_tracedb_ui_with_db_serves_a_fleets_database(open_pg_store, pg_url, tmp_path):
    from tests.web.conftest import UiProcess, owner_get

    store = open_pg_store()
    ids = _record(store)
    # Run where no data directory is: the database alone is what the view reads.
    ui = UiProcess("--db", pg_url, cwd=str(tmp_path))
    try:
        page = owner_get(ui.url)
        assert page.status_code == 200 and ids["crash"] in page.text and ids["fork"] in page.text
        crash = owner_get(ui.url + f"e/{ids['crash']}")
        assert crash.status_code == 200 and "Summarize" in crash.text
        counts = owner_get(ui.url + "counts").json()["counts"]
        assert counts == {"running": 1, "completed": 2, "incomplete": 0, "invalidated": 1}
        # No data directory here: the token is this run's, in the printed address alone.
        assert ui.token and not (tmp_path / ".tracedb").exists() and not list(tmp_path.rglob("token"))
    finally:
        assert ui.stop() == 0


def test_no_generated_query_gets_a_500_on_postgresql(open_pg_store, pg_url):
    # The property test of tests/web/test_query_params.py, on PostgreSQL: what psycopg refuses
    # (a NUL in a bound string, an integer past 64 bits) is refused before it is bound.
    from hypothesis import HealthCheck, given, settings

    from tests.web.query_fuzz import check_answer, requests
    from tests.web.test_query_params import AppOn

    store = open_pg_store()
    _record(store)
    app = AppOn(load_config(overrides={"db_url": pg_url, "data_dir": store.config.data_dir}))

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(requests())
    def no_500(request_bytes):
        raw_path, query = request_bytes
        check_answer(raw_path, query, *app.get(raw_path, query))

    try:
        no_500()
        for path, query in ((b"/", b"since=1677-09-22&until=2262-04-11&q=%25_"), (b"/e/exec-ok", b""),
                            (b"/api/event", b"id=exec-ok&seq=1")):
            assert app.get(path, query)[0] == 200, (path, query)
    finally:
        app.close()
