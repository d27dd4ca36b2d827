"""`tracedb ui` over real HTTP: pages, 404 and 400 pages, read-only methods, escaping, the
listen rules (loopback alone, or --allow-remote with a token), and stopping on SIGTERM."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import subprocess
import sys

import httpx
import orjson
import pytest

import tracedb

from .conftest import REPO, TOKENS, XSS_INTENT, UiProcess
from .conftest import owner_get as _get


def _db_digest(data_dir: str) -> str:
    with open(os.path.join(data_dir, "traces.db"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_the_list_shows_every_execution_with_counts_and_filters(ui):
    url, ids = ui
    r = _get(url)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    for eid in ids.values():
        assert f'href="/e/{eid}"' in r.text
    counts = _get(url + "counts").json()
    assert counts["counts"] == {"running": 0, "completed": 6, "incomplete": 1, "invalidated": 1}
    assert counts["total"] == "8" and counts["shown"]["completed"] == "6"
    # Counts per status under the other filters: the status filter itself is left out.
    narrowed = _get(url + "counts", params={"status": "incomplete", "intent": "AnswerQuestion"}).json()
    assert narrowed["counts"] == {"running": 0, "completed": 3, "incomplete": 1, "invalidated": 0}
    assert narrowed["total"] == "1"
    assert _get(url + "counts", params={"status": "nope"}).status_code == 400
    only = _get(url, params={"status": "incomplete"}).text
    assert ids["crashed"] in only and ids["ok"] not in only
    no = _get(url, params={"replayable": "no"}).text
    assert ids["crashed"] in no and ids["invalidated"] in no and ids["ok"] not in no
    searched = _get(url, params={"q": "summ"}).text
    assert ids["invalidated"] in searched and ids["ok"] not in searched
    exact = _get(url, params={"intent": "AnswerQuestion"}).text
    assert ids["ok"] in exact and ids["invalidated"] not in exact
    # The store was recorded in November 2025: nothing is younger than an hour.
    assert "No execution matches" in _get(url, params={"since": "1h"}).text
    assert ids["ok"] in _get(url, params={"since": "2025-11-01T00:00:00Z", "until": "2030-01-01"}).text


def rows_of(html: str) -> dict:
    """The list's rows: {execution id: the row's HTML}."""
    return {part.split('"')[0]: part.split("</tr>")[0] for part in html.split('<tr data-id="')[1:]}


def test_a_failed_execution_is_red_in_the_list_with_its_error_model_tokens_and_cost(ui):
    url, ids = ui
    rows = rows_of(_get(url).text)
    failed = rows[ids["failed"]]
    assert 'data-outcome="failed" class="failed"' in failed and 'class="badge oc-failed"' in failed
    assert f'class="err-msg" data-testid="list-error" href="/e/{ids["failed"]}#ev-5"' in failed
    assert ">TOOL_TIMEOUT: search_flights timed out after 30 s</a>" in failed
    assert '<td class="model">gpt-4o-mini</td>' in failed and ">1,200 / 80<" in failed
    # gpt-4o-mini: $0.15 a million input tokens, $0.60 a million output tokens.
    assert ">$0.000228<" in failed
    otel = rows[ids["otel"]]
    assert 'data-outcome="succeeded"' in otel and 'class="failed"' not in otel and ">2,270 / 138<" in otel
    # It got past its failed tool call: the first error is shown, softer.
    assert 'class="err-msg soft"' in otel and "TimeoutError: search_flights timed out" in otel
    # A model the price table does not know: its cost is unknown, never a guess.
    assert [eid for eid, row in rows.items() if 'class="failed"' in row] == [ids["failed"]]
    assert rows[ids["crashed"]].count('data-outcome="incomplete"') == 1


@pytest.mark.parametrize("query, expected", [
    ({"outcome": "failed"}, {"failed"}),
    ({"outcome": "incomplete"}, {"crashed"}),
    ({"model": "gpt-4o-mini"}, {"failed", "otel"}),
    ({"error": "TOOL_TIMEOUT"}, {"failed"}),
    ({"error": "NO_SUCH_CODE"}, set()),
    ({"min_cost": "0.0002"}, {"failed", "otel"}),
    ({"min_cost": "0.0003"}, {"otel"}),
    ({"slower_than": "1h"}, set()),
    ({"outcome": "failed", "intent": "AnswerQuestion"}, set()),
])
def test_the_list_filters_on_outcome_model_error_cost_and_duration(ui, query, expected):
    url, ids = ui
    html = _get(url, params=query).text
    assert set(rows_of(html)) == {ids[k] for k in expected}, query
    if not expected:
        assert "No execution matches these filters" in html
    for name, value in query.items():  # the form shows what it filtered on
        assert f'name="{name}" value="{value}"' in html or f'<option value="{value}" selected>' in html


def test_the_overview_draws_the_stats_aggregates(ui):
    url, ids = ui
    r = _get(url + "overview")
    assert r.status_code == 200
    page = r.text
    card = lambda name: page.split(f'data-testid="card-{name}">')[1].split("</div></div>")[0]  # noqa: E731
    assert '<div class="value">8</div>' in card("executions")
    assert '<div class="value">1</div>' in card("failed") and "failure rate 14.3%" in card("failed")
    assert '<div class="value">3,688</div>' in card("tokens")  # 1,200 + 80 + 2,270 + 138
    for chart in ("chart-executions", "chart-p95", "chart-tokens", "chart-cost"):
        assert f'data-testid="{chart}"' in page
    executions = page.split('data-testid="chart-executions"')[1].split("</figure>")[0]
    assert executions.count('class="s-failed"') == 1  # one day, one failure
    by_intent = page.split('data-testid="by-intent"')[1].split("</section>")[0]
    assert 'href="/?intent=BookFlight&amp;outcome=failed">1</a>' in by_intent
    assert '<tr data-key="AnswerQuestion"' in by_intent
    by_model = page.split('data-testid="by-model"')[1].split("</section>")[0]
    assert '<tr data-key="gpt-4o-mini" class="has-failed"><td><a href="/?model=gpt-4o-mini">' in by_model
    # Nothing since an hour ago (the store was recorded in 2025); by hour; a bad grouping is a 400.
    recent = _get(url + "overview", params={"since": "1h", "per": "hour"}).text
    assert '<div class="value">0</div>' in recent and "no executions" in recent
    assert _get(url + "overview", params={"per": "week"}).status_code == 400
    assert _get(url + "overview", params={"since": "soon"}).status_code == 400


def test_pages_continue_by_cursor(ui):
    url, ids = ui
    first = _get(url, params={"limit": 4}).text
    assert first.count('<tr data-id="') == 4
    cursor = first.split('class="older" href="/?limit=4&amp;before=')[1].split('"')[0]
    second = _get(url, params={"limit": 4, "before": cursor}).text
    assert second.count('<tr data-id="') == 4
    assert 'class="older"' not in second and "« Newest" in second
    shown = {line.split('"')[0] for line in (first + second).split('<tr data-id="')[1:]}
    assert shown == set(ids.values())


@pytest.mark.parametrize("query, words", [
    ({"status": "bogus"}, "is not a status"),
    ({"replayable": "maybe"}, "is not yes or no"),
    ({"limit": "ten"}, "is not a whole number"),
    ({"limit": "0"}, "out of range"),
    ({"limit": "100000"}, "out of range"),
    ({"since": "yesterday-ish"}, "is not a time"),
    ({"before": "not-a-cursor"}, "is not a page cursor"),
    ({"outcome": "exploded"}, "is not an outcome"),
    ({"min_cost": "-1"}, "is not a cost"),
    ({"min_cost": "nan"}, "is not a cost"),
    ({"min_cost": "cheap"}, "is not a cost"),
    ({"slower_than": "fast"}, "is not a duration"),
    ({"slower_than": "-2s"}, "is not a duration"),
    ({"model": "m" * 201}, "characters long"),
    ({"error": "E" * 201}, "characters long"),
])
def test_a_malformed_parameter_is_a_400_page_saying_what_is_wrong(ui, query, words):
    url, _ = ui
    r = _get(url, params=query)
    assert r.status_code == 400, r.text
    assert words in r.text and 'class="hint"' in r.text


def test_unknown_ids_and_paths_are_404_pages(ui):
    url, ids = ui
    for path in ("e/exec-nope", "api/event?id=exec-nope&seq=1", f"api/event?id={ids['ok']}&seq=999", "nowhere",
                 "api/live?id=exec-nope", "diff?a=exec-nope&b=exec-ok"):
        r = _get(url + path)
        assert r.status_code == 404, path
        if path.startswith("api/"):  # what the page's script fetches: the same error as JSON
            assert r.json()["error"]["status"] == 404 and r.json()["error"]["message"], path
        else:
            assert "404" in r.text and "<html" in r.text
    assert _get(url + f"api/event?id={ids['ok']}&seq=zero").status_code == 400
    assert _get(url + "api/rows").status_code == 400  # no id
    assert _get(url + "diff?a=exec-ok-0001").status_code == 400
    # An ambiguous prefix names the candidates.
    r = _get(url + "e/exec-")
    assert r.status_code == 400 and "exec-ok-0001" in r.text


def test_a_unique_prefix_redirects_to_the_whole_id(ui):
    url, ids = ui
    r = _get(url + "e/exec-cra")
    assert r.status_code == 302 and r.headers["location"] == f"/e/{ids['crashed']}"


def test_the_execution_page_has_its_header_timeline_replay_state_and_lineage(ui):
    url, ids = ui
    page = _get(url + f"e/{ids['ok']}").text
    assert ids["ok"] in page and "sha256:" in page and "AnswerQuestion" in page
    assert page.count('class="bar llm"') == 2 and page.count('class="bar tool"') == 1
    assert f"tracedb --data-dir" in page and f"replay {ids['ok']}" in page  # the command to copy
    assert ids["fork"] in page and "at seq 3" in page  # the fork made from it
    crashed = _get(url + f"e/{ids['crashed']}").text
    assert 'data-testid="stopped-marker" data-seq="4"' in crashed
    assert "stopped after #4 tool.requested" in crashed and "no response" in crashed
    assert "never finished" in crashed and f"replay {ids['crashed']}" not in crashed
    bad = _get(url + f"e/{ids['invalidated']}").text
    assert "an operator invalidated it" in bad and "wrong model &lt;b&gt;v2&lt;/b&gt;" in bad
    fork = _get(url + f"e/{ids['fork']}").text
    assert f'forked from <a class="mono" href="/e/{ids["ok"]}">' in fork


def test_a_nested_execution_has_its_span_tree_beside_the_timeline_and_a_flat_one_none(ui):
    url, ids = ui
    page = _get(url + f"e/{ids['otel']}").text
    assert 'data-testid="span-tree" data-spans="5"' in page
    tree = page.split('data-testid="span-tree"')[1].split("</svg>")[0]
    # The agent span at the top, its four calls under it, in the order they started.
    names = [part.split(">")[1].split("<")[0] for part in tree.split('<text class="name"')[1:]]
    assert names == ["invoke_agent TravelPlanner", "chat gpt-4o-mini", "execute_tool search_flights",
                     "execute_tool search_flights", "chat gpt-4o-mini"]
    depths = [int(part.split('"')[1]) for part in tree.split("data-depth=")[1:]]
    assert depths == [0, 1, 1, 1, 1]
    # The tool call that failed is red, with its message; each span links to its first event.
    assert tree.count('class="span k-tool err"') == 1 and "search_flights timed out" in tree
    assert 'href="#ev-1"' in tree and 'href="#ev-9"' in tree
    assert 'data-testid="span-tree"' not in _get(url + f"e/{ids['ok']}").text


def test_the_failed_call_is_red_on_the_timeline_and_in_the_events_with_its_message(ui):
    url, ids = ui
    page = _get(url + f"e/{ids['failed']}").text
    assert page.count('class="bar tool err"') == 1 and page.count('class="bar llm"') == 1
    assert "search_flights · TOOL_TIMEOUT: search_flights timed out after 30 s" in page
    rows = [r for r in page.split("<tr ")[1:] if 'class="ev' in r]
    errored = [r.split('data-seq="')[1].split('"')[0] for r in rows if 'class="ev err"' in r]
    assert errored == ["5", "6"]  # the tool's error answer, and the final response that failed
    assert 'data-testid="event-error">TOOL_TIMEOUT: search_flights timed out after 30 s<' in page
    assert 'class="final err"' in page
    # The header: failed, why and where, what it called and cost.
    title = page.split('<div class="titlebar">')[1].split("</div>")[0]
    assert 'class="badge oc-failed">failed<' in title
    failure = page.split('data-testid="failure">')[1].split("</section>")[0]
    assert "Failed: " in failure and "TOOL_TIMEOUT: search_flights timed out after 30 s" in failure
    assert '<a href="#ev-5">#5 tool.responded</a>' in failure
    assert "<dt>Cost</dt><dd>$0.000228</dd>" in page and "<dt>Tokens in / out</dt><dd>1,200 / 80</dd>" in page
    went_on = _get(url + f"e/{ids['otel']}").text.split('data-testid="failure">')[1].split("</section>")[0]
    assert "A call failed, and the execution went on" in went_on
    ok = _get(url + f"e/{ids['ok']}").text
    assert " err" not in ok.split("<svg")[1].split("</svg>")[0] and 'class="ev err"' not in ok


def test_recorded_html_is_text(ui):
    url, ids = ui
    for path in ("", f"e/{ids['xss']}", f"diff?a={ids['xss']}&b={ids['ok']}"):
        page = _get(url + path).text
        assert "<script>window.__pwned" not in page and "<img src=x" not in page, path
    page = _get(url + f"e/{ids['xss']}").text
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=window.__pwned=1&gt;" in page
    assert XSS_INTENT not in page
    csp = _get(url).headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    ev = _get(url + f"api/event?id={ids['xss']}&seq=1")
    assert ev.headers["content-type"] == "application/json"
    assert ev.json()["payload"]["html"] == "<script>window.__pwned=1</script>"


def test_no_request_writes(ui, web_store):
    url, ids = ui
    data_dir, _ = web_store
    before = _db_digest(data_dir)
    for path in ("", f"e/{ids['ok']}", f"api/event?id={ids['ok']}&seq=1", f"api/live?id={ids['ok']}", "counts", "diff"):
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            r = httpx.request(method, url + path, timeout=30, content=b"status=invalidated",
                              headers={"authorization": _get(url).request.headers["authorization"]})
            assert r.status_code == 405, (method, path)
            assert "only reads" in r.text
    assert _db_digest(data_dir) == before


def test_live_answers_nothing_new_cheaply_and_a_status_change_as_reload(ui):
    url, ids = ui
    eid = ids["crashed"]
    assert _get(url + "api/live", params={"id": eid, "after": 4, "status": "incomplete"}).json() == {
        "status": "incomplete", "changed": False, "last_seq": 4}
    assert _get(url + "api/live", params={"id": eid, "after": 4, "status": "running"}).json()["reload"] is True
    doc = _get(url + "api/live", params={"id": eid, "after": 2, "status": "incomplete"}).json()
    assert doc["changed"] and doc["last_seq"] == 4 and 'id="ev-4"' in doc["rows"] and 'id="ev-2"' in doc["rows"]
    assert doc["spans"] == ""  # recorded flat: no span tree to redraw
    nested = _get(url + "api/live", params={"id": ids["otel"], "after": 8, "status": "completed"}).json()
    assert nested["changed"] and 'data-testid="span-tree" data-spans="5"' in nested["spans"]
    assert "<svg" in doc["overview"]


def test_the_view_needs_its_token_and_a_first_visit_turns_it_into_a_cookie(ui, web_store):
    url, ids = ui
    data_dir, _ = web_store
    token = TOKENS[url]
    # The data directory's token: made by the view's first start, readable by its owner alone.
    token_file = os.path.join(data_dir, "token")
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600 and open(token_file).read().strip() == token
    for path in ("", "counts", f"e/{ids['ok']}", f"api/event?id={ids['ok']}&seq=1", f"api/rows?id={ids['ok']}",
                 f"diff?a={ids['ok']}&b={ids['other']}", "static/app.css", "nowhere"):
        r = httpx.get(url + path, timeout=30)
        assert r.status_code == 401, path
        assert r.headers["www-authenticate"] == "Bearer" and ids["ok"] not in r.text
        assert "content-security-policy" in r.headers
    assert httpx.get(url, params={"token": "a-guess"}, timeout=30).status_code == 401
    assert _get(url, headers={"authorization": "Bearer a-guess"}).status_code == 401
    # The first visit: the token goes into a cookie and the redirect drops it from the address.
    first = httpx.get(url + f"e/{ids['ok']}", params={"token": token}, timeout=30)
    assert first.status_code == 303 and first.headers["location"] == f"/e/{ids['ok']}"
    cookie = first.headers["set-cookie"]
    port = url.split(":")[2].split("/")[0]
    assert cookie.startswith(f"tracedb_token_{port}={token};")
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower() and "path=/" in cookie.lower()
    kept = httpx.get(url, params={"status": "incomplete", "token": token}, timeout=30)
    assert kept.status_code == 303 and kept.headers["location"] == "/?status=incomplete"
    with httpx.Client(cookies={f"tracedb_token_{port}": token}, timeout=30) as c:
        assert ids["crashed"] in c.get(url, params={"status": "incomplete"}).text
        assert c.get(url + f"api/event?id={ids['ok']}&seq=1").json()["seq"] == 1
    with httpx.Client(cookies={"tracedb_token": token}, timeout=30) as c:
        assert c.get(url).status_code == 401, "the cookie is the port's own"


ROUTES = ["", "counts", "e/exec-ok-0001", "api/event?id=exec-ok-0001&seq=1", "api/rows?id=exec-ok-0001",
          "api/live?id=exec-ok-0001", "api/overview?id=exec-ok-0001", "diff?a=exec-ok-0001&b=exec-other-0002",
          "static/app.css", "static/app.js", "nowhere"]


def test_the_host_header_must_name_a_loopback_host_on_every_route(ui):
    url, ids = ui
    port = url.split(":")[2].split("/")[0]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.nip.io", "localhost.evil.example", "[::2]"):
        for path in ROUTES:
            r = _get(url + path, headers={"host": host})
            assert r.status_code == 403, (host, path)
            assert "Host header" in r.text and "--allowed-host" in r.text and "exec-ok" not in r.text
        first = httpx.get(url, params={"token": TOKENS[url]}, headers={"host": host}, timeout=30)
        assert first.status_code == 403 and "set-cookie" not in first.headers
    # No Host at all (HTTP/1.0 allows it): refused too.
    with socket.create_connection(("127.0.0.1", int(port)), timeout=30) as s:
        s.sendall(b"GET / HTTP/1.0\r\nAuthorization: Bearer " + TOKENS[url].encode() + b"\r\n\r\n")
        answer = s.makefile("rb").read()
    assert answer.startswith(b"HTTP/1.1 403") and b"missing" in answer
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost", "127.0.0.1", "[::1]"):
        for path in ROUTES[:-1]:
            assert _get(url + path, headers={"host": host}).status_code == 200, (host, path)


def test_an_allowed_host_is_answered_and_trusting_local_users_drops_the_token(web_store):
    data_dir, ids = web_store
    ui = UiProcess("--data-dir", data_dir, ui_args=("--trust-local-users", "--allowed-host", "tracedb.test"))
    try:
        assert ui.token is None and "token" not in ui.printed
        r = httpx.get(ui.url + f"e/{ids['ok']}", timeout=30)
        assert r.status_code == 200 and ids["ok"] in r.text
        port = ui.port
        assert httpx.get(ui.url, headers={"host": f"tracedb.test:{port}"}, timeout=30).status_code == 200
        assert httpx.get(ui.url, headers={"host": "evil.example"}, timeout=30).status_code == 403
    finally:
        assert ui.stop() == 0
    r = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", data_dir, "ui", "--port", "0",
                        "--allowed-host", "bad host:1"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and "--allowed-host" in r.stderr and "hint:" in r.stderr


def test_a_missing_store_is_exit_3_and_nothing_is_created(tmp_path):
    missing = tmp_path / "none"
    r = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", str(missing), "ui", "--port", "0"],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith("error: ") and "hint: " in r.stderr and "Traceback" not in r.stderr
    assert not missing.exists()


def test_a_busy_port_is_one_error_and_one_hint(web_store):
    import socket

    data_dir, _ = web_store
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        r = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", data_dir, "ui", "--port",
                            str(holder.getsockname()[1])], capture_output=True, text=True, timeout=60, cwd=REPO)
    finally:
        holder.close()
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: cannot listen") and lines[1].startswith("hint: ")


def test_a_remote_address_needs_allow_remote_and_a_token(web_store, tmp_path):
    data_dir, ids = web_store
    env = {k: v for k, v in os.environ.items() if k != "TRACEDB_TOKEN"}
    base = [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "ui", "--port", "0", "--host", "0.0.0.0"]
    r = subprocess.run(base, capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert r.returncode == 1 and "refusing to serve the web view on non-loopback address" in r.stderr
    r = subprocess.run(base + ["--allow-remote"], capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert r.returncode == 1 and "needs a bearer token" in r.stderr
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    ui = subprocess.Popen(base + ["--allow-remote", "--token-file", str(token_file), "--json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        printed = orjson.loads(ui.stdout.readline())["url"]
        assert printed.endswith("/?token=s3cret-token")
        port = printed.split(":")[2].split("/")[0]
        url = f"http://127.0.0.1:{port}/"
        assert _get(url).status_code == 401
        assert _get(url, headers={"authorization": "Bearer wrong"}).status_code == 401
        assert _get(url + "metrics").status_code == 401
        assert _get(url, headers={"authorization": "Bearer s3cret-token"}).status_code == 200
        # A remote listener answers to any Host name: every request carries the token there,
        # which a page rebinding its own name to this address does not have.
        assert _get(url, headers={"authorization": "Bearer s3cret-token", "host": "tracedb.internal"}).status_code == 200
        first = _get(url + f"e/{ids['ok']}?token=s3cret-token")
        assert first.status_code == 303 and first.headers["location"] == f"/e/{ids['ok']}"
        cookie = first.cookies.get(f"tracedb_token_{port}")
        assert cookie == "s3cret-token"
        with httpx.Client(cookies={f"tracedb_token_{port}": cookie}, timeout=30) as c:
            assert c.get(url + f"e/{ids['ok']}").status_code == 200
    finally:
        ui.terminate()
        assert ui.wait(30) == 0
        ui.stdout.close()
        ui.stderr.close()


def test_serve_refuses_a_remote_http_host_without_allow_remote_and_a_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRACEDB_TOKEN"}
    base = [sys.executable, "-m", "tracedb", "--data-dir", str(tmp_path / "d"), "serve", "--http-port", "0",
            "--http-host", "0.0.0.0"]
    r = subprocess.run(base, capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert r.returncode == 1 and "refusing to serve the web view on non-loopback address 0.0.0.0 (--http-host)" in r.stderr
    r = subprocess.run(base + ["--allow-remote"], capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert r.returncode == 1 and "needs a bearer token" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "d").exists()  # refused before the store was opened


def test_ids_with_slashes_and_url_characters_have_pages(tmp_path):
    # Ids earlier versions accepted (new executions can no longer take them) keep their pages.
    from urllib.parse import quote

    from tests.legacy_ids import record_legacy

    data_dir = str(tmp_path / "odd")
    odd = ["team/a", "q?x#y", "pct%41&b=c", "ends/rows", "ends"]
    record_legacy(data_dir, odd, intent="Odd")
    ui = UiProcess("--data-dir", data_dir)
    try:
        listing = _get(ui.url).text
        for eid in odd:
            path = "e/" + quote(eid, safe="")
            assert f'href="/{path}"' in listing
            page = _get(ui.url + path)
            assert page.status_code == 200 and f'data-id="{eid.replace("&", "&amp;")}"' in page.text, eid
            # The first visit's redirect keeps the path as it was sent, still encoded.
            first = httpx.get(ui.url + path + "?token=" + ui.token, timeout=30)
            assert first.status_code == 303 and first.headers["location"] == "/" + path, eid
            assert _get(ui.url + "api/event", params={"id": eid, "seq": 1}).json()["payload"] == {"id": eid}
            assert _get(ui.url + "api/rows", params={"id": eid}).json()["last_seq"] == 2
            # The page's own fragment addresses work for it (they carry the id in the query).
            src = page.text.split('data-live-src="')[1].split('"')[0].replace("&amp;", "&")
            assert _get(ui.url + src.lstrip("/") + "&after=0&status=completed").json()["last_seq"] == 2
        # "ends/rows" is an execution of its own, and "ends" keeps its own page.
        assert 'data-id="ends/rows"' in _get(ui.url + "e/ends/rows").text
        assert 'data-id="ends"' in _get(ui.url + "e/ends").text
    finally:
        assert ui.stop() == 0


def test_an_empty_store_says_how_to_record_with_the_command_as_it_runs_here(tmp_path):
    """The first page of an empty store names the commands to run as this tracedb was started
    (`python -m tracedb` here, since the test starts it so), not a `tracedb` that may not be on PATH."""
    tracedb.open(str(tmp_path / "data")).close()
    proc = UiProcess("--data-dir", str(tmp_path / "data"))
    try:
        page = _get(proc.url).text
    finally:
        assert proc.stop() == 0
    assert "No executions recorded yet." in page
    assert f"<code>{sys.executable} -m tracedb demo</code>" in page
    assert f"<code>{sys.executable} -m tracedb serve</code>" in page
