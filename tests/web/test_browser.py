"""The web view in a real browser: Debian's headless Chromium driven by Playwright's Python
package. Skips, saying why, where /usr/bin/chromium is missing (scripts/test installs it when it
runs as root).

Screenshots go to $TRACEDB_SCREENSHOTS when it is set (docs/screenshots/ holds the ones the
README shows), else to the test's temporary directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

import tracedb
from tests.waiting import wait_until

from .conftest import FLEET_DAYS, REPO, UiProcess, with_token

CHROMIUM = os.environ.get("TRACEDB_CHROMIUM", "/usr/bin/chromium")

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install chromium; scripts/test "
    "does it when run as root) to run the browser tests",
)


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    context.close()
    assert errors == [], f"JavaScript errors: {errors}"


@pytest.fixture
def shots(tmp_path):
    where = os.environ.get("TRACEDB_SCREENSHOTS") or str(tmp_path)
    os.makedirs(where, exist_ok=True)

    def shot(pg, name: str) -> None:
        pg.screenshot(path=os.path.join(where, name), full_page=True)

    return shot


def test_list_filter_open_an_execution_see_its_timeline_and_where_it_stopped(ui, page, shots):
    url, ids = ui
    page.goto(with_token(url))
    assert page.url == url  # the token left the address bar: the view keeps it in a cookie
    assert page.locator("table.executions tbody tr").count() == len(ids)
    page.locator(".counts.loaded").wait_for()  # the counts per status come after the page
    assert page.locator(".chip[data-status=incomplete] .n").inner_text() == "1"
    assert page.locator(".chip[data-status=all] .n").inner_text() == str(len(ids))
    assert page.locator(".pager .total").inner_text() == f"{len(ids)} matching"
    shots(page, "list.png")  # (after the counts loaded)
    page.select_option("select[name=status]", "incomplete")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**status=incomplete**")
    rows = page.locator("table.executions tbody tr")
    assert rows.count() == 1 and rows.first.get_attribute("data-id") == ids["crashed"]
    page.click(f"a[href='/e/{ids['crashed']}']")
    page.wait_for_url(f"**/e/{ids['crashed']}")
    assert page.locator("h1.intent").inner_text() == "AnswerQuestion"
    # The timeline: the LLM call as a bar, the unanswered tool call as an open bar, the stop.
    assert page.locator("svg.timeline rect.bar.llm").count() == 1
    assert page.locator("svg.timeline rect.bar.tool.open").count() == 1
    marker = page.locator("[data-testid=stopped-marker]")
    assert marker.is_visible() and marker.get_attribute("data-seq") == "4"
    assert "stopped after #4 tool.requested" in marker.text_content()
    assert page.locator("tr.stopped [data-testid=stopped-row]").is_visible()
    assert "never finished" in page.locator("[data-testid=replay]").inner_text()
    # The payload viewer: folded JSON, loaded when the row is opened.
    page.click("tr#ev-4")
    tree = page.locator("tr.payload .jtree")
    tree.wait_for()
    assert '"pair": "EUR/USD"' in tree.inner_text().replace("\n", " ") or "EUR/USD" in tree.inner_text()
    assert page.locator("tr.payload button.copy").inner_text() == "Copy JSON"
    shots(page, "execution-incomplete.png")


def test_the_printed_address_opens_and_later_pages_ride_on_the_cookie(web_store, browser):
    data_dir, ids = web_store
    ui = UiProcess("--data-dir", data_dir)
    context = browser.new_context()
    try:
        assert "?token=" in ui.printed
        page = context.new_page()
        page.goto(ui.printed)
        # The token left the address bar (and the history): the view keeps it in a cookie that
        # scripts cannot read and other sites' pages do not send.
        assert page.url == ui.url and "token" not in page.evaluate("location.href")
        assert page.evaluate("document.cookie") == ""
        (cookie,) = context.cookies()
        assert cookie["name"] == f"tracedb_token_{ui.port}" and cookie["value"] == ui.token
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
        assert page.locator("table.executions tbody tr").count() == len(ids)
        page.click(f"a[href='/e/{ids['ok']}']")
        page.wait_for_url(f"**/e/{ids['ok']}")
        page.click("tr#ev-4")  # the payload viewer fetches /api/event with the cookie
        page.locator("tr.payload .jtree").wait_for()
        page.goto(ui.url + f"diff?a={ids['ok']}&b={ids['other']}")
        assert "First divergence" in page.locator("[data-testid=verdict]").inner_text()
        # Without the cookie (another browser profile, or a page that guessed the address): refused.
        other = browser.new_context().new_page()
        answer = other.goto(ui.url)
        assert answer.status == 401 and ids["ok"] not in other.content()
        other.context.close()
    finally:
        context.close()
        assert ui.stop() == 0


def test_a_replayable_execution_offers_its_replay_command_to_copy(ui, page, shots):
    url, ids = ui
    page.goto(with_token(url + f"e/{ids['ok']}"))
    assert page.locator("svg.timeline rect.bar.llm").count() == 2
    assert page.locator("svg.timeline rect.bar.tool").count() == 1
    assert page.locator("[data-testid=stopped-marker]").count() == 0
    cmd = page.locator("[data-testid=replay] .cmd code").inner_text()
    assert cmd.endswith(f"replay {ids['ok']}") and "tracedb --data-dir" in cmd  # program: tests/cli/test_program_name.py
    page.click("[data-testid=replay] button.copy")
    # The label changes once the clipboard's promise settles (asynchronously): wait for it.
    page.wait_for_function(
        "document.querySelector('[data-testid=replay] button.copy').textContent === 'Copied'"
    )
    page.click("tr#ev-4")
    page.locator("tr.payload .jtree").wait_for()
    shots(page, "execution.png")


def test_recorded_script_renders_as_text_and_never_runs(ui, page):
    url, ids = ui
    page.goto(with_token(url))
    page.goto(url + f"e/{ids['xss']}")
    assert page.evaluate("window.__pwned") is None
    assert page.locator("h1.intent").inner_text() == "<img src=x onerror=window.__pwned=1>"
    assert "<script>window.__pwned=1</script>" in page.locator("tr#ev-1 td.preview").inner_text()
    page.click("tr#ev-1")
    page.locator("tr.payload .jtree").wait_for()
    assert "<script>window.__pwned=1</script>" in page.locator("tr.payload .jtree").inner_text()
    assert page.evaluate("window.__pwned") is None


def test_follow_a_fork_and_open_the_diff(ui, page, shots):
    url, ids = ui
    page.goto(with_token(url + f"e/{ids['ok']}"))
    page.click(f"[data-testid=lineage] a[href='/e/{ids['fork']}']")
    page.wait_for_url(f"**/e/{ids['fork']}")
    lineage = page.locator("[data-testid=lineage]").inner_text()
    assert f"forked from {ids['ok']} at seq 3" in lineage
    shots(page, "fork.png")
    page.click("[data-testid=lineage] li.parent a:text('diff')")
    page.wait_for_url("**/diff?**")
    assert "First divergence" in page.locator("[data-testid=verdict]").inner_text()
    # Compare two runs from the form: the first divergent step is highlighted.
    page.fill("form.diffform input[name=a]", ids["ok"])
    page.fill("form.diffform input[name=b]", "exec-oth")
    page.click("form.diffform button")
    page.wait_for_url("**b=exec-oth**")
    diverge = page.locator("table.diff tr.diverge")
    assert diverge.count() == 1 and diverge.get_attribute("data-step") == "0"
    assert "17 * 24" in diverge.inner_text() and "17 * 23" in diverge.inner_text()
    shots(page, "diff.png")


def test_a_running_execution_receives_an_event_without_a_reload(tmp_path, page, shots):
    from concurrent.futures import ThreadPoolExecutor

    # Playwright's sync API runs an event loop in this thread, where the sync store refuses to
    # wait for fsync: the agent records from a thread of its own.
    agent = ThreadPoolExecutor(1)

    def run(fn, *args):
        return agent.submit(fn, *args).result(60)

    data_dir = str(tmp_path / "live")
    store = run(lambda: tracedb.open(data_dir, config={"compact_interval_ms": 20, "idle_timeout_s": 0}))
    ui = None
    try:
        ex = run(store.start, "LiveAgent", {"intent": "LiveAgent"}, "exec-live-0001")
        run(ex.event, "INTENT_RECEIVED", {"intent": "LiveAgent"})
        run(ex.event, "llm.requested", {"prompt_hash": "sha256:9", "request": {"model": "m"}})
        run(store.compact)
        ui = UiProcess("--data-dir", data_dir)
        page.goto(with_token(ui.url + "e/exec-live-0001"))
        assert page.locator(".status-now .badge").inner_text() == "running"
        page.evaluate("window.__sameDocument = true")
        run(ex.event, "llm.responded", {"prompt_hash": "sha256:9", "request_seq": 2, "response": {"content": "hi"}})
        page.locator("tr#ev-3").wait_for(timeout=15_000)
        assert page.evaluate("window.__sameDocument") is True  # no reload
        assert page.locator("tr#ev-2 td.call").inner_text().startswith("→ #3")  # the answered call
        assert page.locator("svg.timeline rect.bar.llm").count() == 1
        assert page.locator(".n-events").inner_text() == "3"
        shots(page, "live.png")
        run(ex.finish, {"status": "success", "payload": {"answer": "hi"}})
        page.locator(".status-now .st-completed").wait_for(timeout=15_000)
    finally:
        if ui is not None:
            assert ui.stop() == 0
        run(store.close)
        agent.shutdown()


def test_a_10000_event_timeline_paints_within_a_second(tmp_path, page):
    from benchmarks.common import fill_store_wal

    data_dir = tmp_path / "big"
    from concurrent.futures import ThreadPoolExecutor

    def build():
        # The store's own WAL records of one 10,000-event execution; opening the store compacts them.
        fill_store_wal(str(data_dir / "wal"), 1, 10_000)
        tracedb.open(str(data_dir), config={"compact_interval_ms": 0}).close()

    with ThreadPoolExecutor(1) as t:  # blocking WAL calls: not in Playwright's event-loop thread
        t.submit(build).result(120)
    ui = UiProcess("--data-dir", str(data_dir))
    try:
        page.goto(with_token(ui.url))  # the cookie, before the timed loads
        # Milliseconds from the start of navigation to the first contentful paint (the page is not
        # streamed: that is when the header and the timeline appear); the median of three loads,
        # the machine being shared.
        paints = []
        for _ in range(3):
            page.goto(ui.url + "e/exec-00000000")
            paints.append(page.evaluate(
                """new Promise((resolve) => new PerformanceObserver((list) => {
                     const e = list.getEntriesByName('first-contentful-paint')[0];
                     if (e) resolve(e.startTime);
                   }).observe({type: 'paint', buffered: true}))"""
            ))
        paint_ms = sorted(paints)[1]
        assert paint_ms <= 1000, f"first paint after {paints} ms"
        assert page.locator("svg.timeline path.ticks").count() == 1
        assert page.locator("#event-rows tr.ev").count() == 200
        page.click("button.more")
        wait_until(lambda: page.locator("#event-rows tr.ev").count() == 400, 20, "the next 200 rows")
        print(f"10,000-event timeline: first contentful paint {paints} ms, median {paint_ms:.0f} ms")
    finally:
        assert ui.stop() == 0


def test_a_newcomer_sees_the_crashed_demo_execution_stop_on_its_timeline(tmp_path, page, shots):
    """scripts/run (tracedb serve), then tracedb demo, then tracedb ui, then the printed address."""
    # In a project directory of its own, naming no data directory: ./.tracedb, as scripts/run uses.
    data_dir = str(tmp_path / ".tracedb")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRACEDB_DATA_DIR", None)
    tracedb_cmd = [sys.executable, "-m", "tracedb"]
    serve = subprocess.Popen(tracedb_cmd + ["serve", "--log-level", "warning"], env=env, cwd=str(tmp_path),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ui = None
    try:
        wait_until(lambda: os.path.exists(os.path.join(data_dir, "tracedb.sock")) or serve.poll() is not None,
                   60, "tracedb serve to listen")
        assert serve.poll() is None, serve.stderr.read()
        demo = subprocess.run(tracedb_cmd + ["demo", "--json"], env=env, cwd=str(tmp_path), capture_output=True,
                              text=True, timeout=120)
        assert demo.returncode == 0, demo.stderr
        import orjson

        crashed = orjson.loads(demo.stdout)["executions"][-1]
        assert crashed["status"] == "incomplete"
        ui = UiProcess(cwd=str(tmp_path))
        page.goto(ui.printed)  # the address it printed, token and all

        def listed() -> bool:
            page.goto(ui.url)  # the recorder compacts in the background: look again until it shows
            return page.locator(f"tr[data-id='{crashed['execution_id']}'] .st-incomplete").count() == 1

        wait_until(listed, 30, "the crashed execution in the list")
        page.click(f"a[href='/e/{crashed['execution_id']}']")
        marker = page.locator("[data-testid=stopped-marker]")
        marker.wait_for()
        assert "tool.requested" in marker.text_content()
        assert page.locator("svg.timeline rect.bar.tool.open").count() == 1
        assert "never finished" in page.locator("[data-testid=replay]").inner_text()
        shots(page, "demo-crashed.png")
        page.goto(ui.url)
        page.locator(".counts.loaded").wait_for()
        shots(page, "demo-list.png")
    finally:
        if ui is not None:
            assert ui.stop() == 0
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0
        serve.stderr.close()


def test_an_otel_trace_shows_its_span_tree_beside_the_timeline(ui, page, shots):
    url, ids = ui
    page.goto(with_token(url + f"e/{ids['otel']}"))
    tree = page.locator("[data-testid=span-tree]")
    assert tree.is_visible() and tree.get_attribute("data-spans") == "5"
    spans = tree.locator("a.span")
    assert spans.count() == 5
    assert [spans.nth(i).get_attribute("data-depth") for i in range(5)] == ["0", "1", "1", "1", "1"]
    failed = tree.locator("a.span.err")
    assert failed.count() == 1 and "search_flights timed out" in failed.text_content()
    # The failed span is drawn red.
    color = failed.locator("rect.bar").evaluate("e => getComputedStyle(e).fill")
    assert color == "rgb(192, 53, 43)", color
    # A span leads to its events in the table.
    failed.click()
    page.wait_for_url("**#ev-3")
    shots(page, "span-tree.png")


def test_a_failed_execution_is_red_in_the_list_and_on_its_timeline(ui, page, shots):
    url, ids = ui
    page.goto(with_token(url))
    row = page.locator(f"tr[data-id='{ids['failed']}']")
    assert row.get_attribute("class") == "failed"
    assert row.locator("td").first.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(253, 233, 231)"
    assert row.locator(".badge.oc-failed").inner_text() == "failed"
    error = row.locator("[data-testid=list-error]")
    assert error.is_visible() and error.inner_text() == "TOOL_TIMEOUT: search_flights timed out after 30 s"
    assert error.evaluate("e => getComputedStyle(e).color") == "rgb(192, 53, 43)"
    ok = page.locator(f"tr[data-id='{ids['ok']}'] td").first
    assert ok.evaluate("e => getComputedStyle(e).backgroundColor") in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)")
    # The filter form: failed executions only.
    page.select_option("select[name=outcome]", "failed")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**outcome=failed**")
    assert page.locator("table.executions tbody tr").count() == 1
    # Its error leads to the failed call, red on the timeline with its message.
    page.click("[data-testid=list-error]")
    page.wait_for_url(f"**/e/{ids['failed']}#ev-5")
    bar = page.locator("svg.timeline rect.bar.tool.err")
    assert bar.count() == 1 and bar.evaluate("e => getComputedStyle(e).fill") == "rgb(192, 53, 43)"
    assert "search_flights timed out after 30 s" in page.locator("svg.timeline").text_content()
    assert page.locator("tr#ev-5.err [data-testid=event-error]").inner_text().startswith("TOOL_TIMEOUT")
    shots(page, "execution-failed.png")


def test_the_overview_page_charts_two_weeks_of_executions_failures_duration_tokens_and_cost(fleet_ui, page, shots):
    url, counts = fleet_ui
    page.goto(with_token(url))
    page.click("header.top nav a[href='/overview']")
    page.wait_for_url("**/overview")
    assert page.locator("[data-testid=card-executions] .value").inner_text() == f"{counts['executions']:,}"
    assert page.locator("[data-testid=card-failed] .value").inner_text() == f"{counts['failed']:,}"
    for chart in ("executions", "p95", "tokens", "cost"):
        svg = page.locator(f"[data-testid=chart-{chart}] svg")
        assert svg.is_visible() and svg.bounding_box()["width"] > 300, chart
        assert svg.locator("g.bucket").count() == FLEET_DAYS, chart  # a bar a day
    failed_bars = page.locator("[data-testid=chart-executions] rect.s-failed")
    assert failed_bars.count() > 0
    assert failed_bars.first.evaluate("e => getComputedStyle(e).fill") == "rgb(192, 53, 43)"
    # A model the price table does not know: its executions' cost is counted as unknown.
    unknown = page.locator("[data-testid=by-model] tr[data-key='local-llama-3'] td").last
    assert "unknown" in unknown.inner_text()
    assert page.locator("[data-testid=by-intent] tbody tr").count() == 3
    shots(page, "overview.png")
    # A failure count leads to the list of those failures.
    page.click("[data-testid=by-intent] a.failed-n >> nth=0")
    page.wait_for_url("**outcome=failed**")
    outcomes = page.locator("table.executions tbody tr").evaluate_all("rows => rows.map(r => r.dataset.outcome)")
    assert outcomes and set(outcomes) == {"failed"}
