"""Reads a person can use: `inspect --list` newest first a page at a time, cursors, --all,
filters, the header, event counts and durations, ids by unique prefix, event times."""

from __future__ import annotations

import json

import pytest

import tracedb
from tracedb.projection import db
from tracedb.config import load_config
from tracedb.humanize import format_duration
from tracedb.reads.reader import Filter, Reader

from tests.conftest import FakeClock

from .conftest import ENVELOPE, page_queries, settings

MS = 10**6
S = 10**9


def stdout_ids(result) -> list[str]:
    return [line.split()[0] for line in result.stdout.splitlines()]


def next_cursor(result) -> str:
    """The cursor the footer on stderr names for the next page."""
    words = result.stderr.split()
    return words[words.index("--before") + 1]


@pytest.fixture
def many(data_dir):
    """60 completed executions exec-00 .. exec-59, created one second apart (exec-59 newest)."""
    clock = FakeClock()
    with tracedb.open(data_dir, config=settings(), clock=clock) as store:
        for i in range(60):
            ex = store.start("Batch" if i % 2 else "Other", ENVELOPE, f"exec-{i:02d}")
            ex.finish({"status": "success"})
            clock.ns += S
    return [f"exec-{i:02d}" for i in reversed(range(60))]  # newest first


def test_a_page_is_the_newest_executions_and_the_footer_names_the_next(many, run):
    first = run("inspect", "--list")
    assert first.exit_code == 0
    assert stdout_ids(first) == many[:50]  # the default page
    assert "--all" in first.stderr
    rest = run("inspect", "--list", "--before", next_cursor(first))
    assert stdout_ids(rest) == many[50:]
    assert "--before" not in rest.stderr  # the last page says nothing more


def test_pages_of_any_size_cover_every_execution_once_in_order(many, run):
    seen, args = [], []
    while True:
        page = run("inspect", "--list", "--limit", "7", *args)
        assert page.exit_code == 0
        assert len(stdout_ids(page)) <= 7
        seen += stdout_ids(page)
        if "--before" not in page.stderr:
            break
        args = ["--before", next_cursor(page)]
    assert seen == many


def test_all_lists_every_execution_without_a_footer(many, run):
    everything = run("inspect", "--list", "--all")
    assert stdout_ids(everything) == many
    assert "--before" not in everything.stderr
    as_json = json.loads(run("inspect", "--list", "--all", "--json").stdout)
    assert [r["execution_id"] for r in as_json] == many
    assert run("inspect", "--list", "--all", "--limit", "5").exit_code == 2


def test_every_execution_is_read_a_page_at_a_time(many, data_dir, monkeypatch):
    limits = []
    real_page = Reader.page

    def spy(self, where, **kw):
        limits.append(kw["limit"])
        return real_page(self, where, **kw)

    monkeypatch.setattr(Reader, "page", spy)
    with Reader.open(load_config(None, overrides={"data_dir": data_dir})) as reader:
        got = [i.execution_id for i in reader.each(page_size=8)]
    assert got == many
    assert limits == [8] * 8  # 60 rows: seven full pages and a last one of 4


def test_json_rows_carry_the_cursor_that_continues_after_them(many, run):
    rows = json.loads(run("inspect", "--list", "--limit", "3", "--json").stdout)
    assert [r["execution_id"] for r in rows] == many[:3]
    after_second = json.loads(run("inspect", "--list", "--limit", "2", "--json", "--before", rows[1]["cursor"]).stdout)
    assert [r["execution_id"] for r in after_second] == many[2:4]
    bad = run("inspect", "--list", "--before", "not-a-cursor")
    assert bad.exit_code == 2 and "not a page cursor" in bad.stderr


def test_executions_created_in_the_same_nanosecond_are_paged_by_id(data_dir, run):
    clock = FakeClock()
    with tracedb.open(data_dir, config=settings(), clock=clock) as store:
        for eid in ("exec-b", "exec-a", "exec-c"):
            store.start("Same", ENVELOPE, eid).finish({"status": "success"})
    seen, args = [], []
    for _ in range(4):
        page = run("inspect", "--list", "--limit", "1", *args)
        seen += stdout_ids(page)
        if "--before" not in page.stderr:
            break
        args = ["--before", next_cursor(page)]
    assert seen == ["exec-c", "exec-b", "exec-a"]


def test_filters_combine_with_pages(many, run):
    batch = [e for e in many if int(e[-2:]) % 2]
    by_intent = run("inspect", "--list", "--intent", "Batch", "--limit", "20")
    assert stdout_ids(by_intent) == batch[:20]
    rest = run("inspect", "--list", "--intent", "Batch", "--limit", "20", "--before", next_cursor(by_intent))
    assert stdout_ids(rest) == batch[20:]
    assert stdout_ids(run("inspect", "--list", "--search", "ATC", "--all")) == batch  # any case
    assert stdout_ids(run("inspect", "--list", "--search", "%", "--all")) == []  # not a wildcard
    assert stdout_ids(run("inspect", "--list", "--intent", "Batc")) == []  # exact
    window = run("inspect", "--list", "--since", "2024-01-15T10:30:50Z", "--intent", "Other")
    assert stdout_ids(window) == ["exec-58", "exec-56", "exec-54", "exec-52", "exec-50"]


def _timed(store, clock, execution_id: str, to_event_ns: int, to_finish_ns: int) -> None:
    """An execution started now, its INTENT_RECEIVED `to_event_ns` later, its finish (success)
    `to_finish_ns` after that, on the fake `clock`."""
    ex = store.start("ProcessIntent", ENVELOPE, execution_id)
    clock.ns += to_event_ns
    ex.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
    clock.ns += to_finish_ns
    ex.finish({"status": "success"})


def test_the_header_events_and_durations(data_dir, run):
    clock = FakeClock()
    with tracedb.open(data_dir, config=settings(), clock=clock) as store:
        _timed(store, clock, "exec-done", 120 * MS, 192 * S - 120 * MS)  # finished 3m12s after the start
        clock.ns += S
        quick = store.start("ProcessIntent", ENVELOPE, "exec-quick")
        clock.ns += 340 * MS
        quick.finish({"status": "success"})
        clock.ns += S
        store.start("ProcessIntent", ENVELOPE, "exec-open").event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
        store.compact()
        result = run("inspect", "--list")
        as_json = {r["execution_id"]: r for r in json.loads(run("inspect", "--list", "--json").stdout)}
    assert result.stderr.splitlines()[0].split() == ["ID", "CREATED", "INTENT", "STATUS", "REPLAY", "EVENTS", "DURATION", "OUTCOME", "MODEL", "TOKENS", "COST"]
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
    assert rows["exec-done"][5:7] == ["2", "3m12s"]
    assert rows["exec-quick"][5:7] == ["1", "340ms"]
    assert rows["exec-open"][3:8] == ["running", "not-replayable", "1", "-", "running"]
    assert as_json["exec-done"]["duration_ms"] == 192_000 and as_json["exec-open"]["duration_ms"] is None


def test_an_invalidation_later_does_not_lengthen_the_duration(data_dir, run):
    clock = FakeClock()
    with tracedb.open(data_dir, config=settings(), clock=clock) as store:
        ex = store.start("ProcessIntent", ENVELOPE, "exec-x")
        clock.ns += 2 * S
        ex.finish({"status": "success"})
    assert run("invalidate", "exec-x", "--reason", "bad tool").exit_code == 0
    assert run("inspect", "--list").stdout.split()[5:7] == ["1", "2.0s"]


@pytest.mark.parametrize(
    ("ns", "text"),
    [(None, "-"), (0, "0ms"), (400, "1µs"), (850_400, "850µs"), (4_290_000, "4.2ms"), (10 * MS, "10ms"),
     (340 * MS, "340ms"), (1_200 * MS, "1.2s"), (192 * S, "3m12s"),
     (2 * 3600 * S + 5 * 60 * S, "2h05m"), (3 * 86400 * S + 4 * 3600 * S, "3d04h")],
)
def test_durations_read_as_a_person_writes_them(ns, text):
    from tracedb.web.pages import fmt_duration

    assert format_duration(ns) == text
    assert fmt_duration(ns) == ("–" if ns is None else text)  # the web view prints the same


@pytest.fixture
def similar(data_dir):
    with tracedb.open(data_dir, config=settings()) as store:
        for eid in ("exec-a1b2c3d4", "exec-a1b2ffff", "exec-e5f6g7h8", "exec-e5"):
            ex = store.start("ProcessIntent", ENVELOPE, eid)
            ex.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
            ex.finish({"status": "success"})
    return data_dir


@pytest.mark.parametrize(
    "command",
    [["inspect", "ID"], ["trace", "get", "ID"], ["trace", "lineage", "ID"], ["replay", "ID"],
     ["pin", "ID"], ["unpin", "ID"], ["invalidate", "ID", "--reason", "x"], ["export", "ID"],
     ["verify", "ID"], ["fork", "ID", "--at", "1"]],
)
def test_every_command_takes_a_unique_prefix_of_an_id(similar, run, command):
    def with_id(text):
        return [text if word == "ID" else word for word in command]

    unique = run(*with_id("exec-e5f"))
    assert unique.exit_code == 0, unique.output
    if command[0] != "verify":
        assert "exec-e5f6g7h8" in unique.stdout
    ambiguous = run(*with_id("exec-a1b2"))
    assert ambiguous.exit_code == 2
    assert "exec-a1b2c3d4" in ambiguous.stderr and "exec-a1b2ffff" in ambiguous.stderr
    assert "hint: give more characters" in ambiguous.stderr
    missing = run(*with_id("exec-zz"))
    assert missing.exit_code == 3
    assert "no execution 'exec-zz'" in missing.stderr


def test_an_exact_id_wins_over_the_longer_ids_it_begins(similar, run):
    assert json.loads(run("inspect", "exec-e5").stdout)["execution_id"] == "exec-e5"
    assert run("inspect", "exec-e").exit_code == 2


def test_trace_diff_takes_prefixes(similar, run):
    out = json.loads(run("trace", "diff", "exec-a1b2c", "exec-e5f", "--json").stdout)
    assert (out["a"], out["b"]) == ("exec-a1b2c3d4", "exec-e5f6g7h8")


def test_trace_get_shows_when_each_event_was_recorded(data_dir, run):
    clock = FakeClock()
    with tracedb.open(data_dir, config=settings(), clock=clock) as store:
        _timed(store, clock, "exec-timed", 250 * MS, 1_500 * MS)
    record = json.loads(run("trace", "get", "exec-timed").stdout)
    assert record["eventTimes"] == [
        {"seq": 1, "recordedUtcIso": "2024-01-15T10:30:00.250000Z", "sincePreviousMs": 250.0},
        {"seq": 2, "recordedUtcIso": "2024-01-15T10:30:01.750000Z", "sincePreviousMs": 1500.0},
    ]
    assert record["events"][0] == {"seq": 1, "type": "INTENT_RECEIVED", "payload": {"intent": "ProcessIntent"}, "error": None}
    assert "eventTimes" not in json.loads(run("trace", "get", "exec-timed", "--json").stdout)


def test_trace_lineage_names_parents_and_forks(data_dir, run):
    with tracedb.open(data_dir, config=settings()) as store:
        ex = store.start("ProcessIntent", ENVELOPE, "exec-root")
        ex.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
        ex.event("ROUTER_DECISION", {"agent": "a"})
        ex.finish({"status": "success"})
    assert run("fork", "exec-root", "--at", "2", "--id", "exec-child").exit_code == 0
    assert run("fork", "exec-child", "--at", "1", "--id", "exec-grandchild").exit_code == 0
    grandchild = json.loads(run("trace", "lineage", "exec-grand", "--json").stdout)
    assert grandchild["ancestors"] == [
        {"execution_id": "exec-child", "forked_at_seq": 1},
        {"execution_id": "exec-root", "forked_at_seq": 2},
    ]
    child = run("trace", "lineage", "exec-child").stdout
    assert "forked at seq 2 from exec-root" in child and "fork exec-grandchild at seq 1" in child


def _assert_keyset_plans(plans: list) -> None:
    assert len(plans) == 3
    assert "ix_traces_created_id" in plans[0] and "ix_traces_created_id" in plans[1]
    assert "ix_traces_status_created_id" in plans[2]
    assert not any("TEMP B-TREE" in p for p in plans), plans


def test_page_queries_use_the_keyset_indexes(many, data_dir):
    """SQLite walks an index in the listing's order: no sort, however large the store. Through
    SQLAlchemy's engine, and through the sqlite3 module as `Reader.open` reads a SQLite file."""
    cfg = load_config(None, overrides={"data_dir": data_dir})
    engine = db.open_store_engine(cfg.database)
    try:
        reader = Reader(engine, config=cfg)
        with reader.engine.connect() as conn:
            plans = [
                " ".join(r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params))
                for sql, params in page_queries(reader)
            ]
    finally:
        engine.dispose()
    _assert_keyset_plans(plans)

    with Reader.open(cfg) as reader:
        conn = reader._lite  # the sqlite3 connection: its trace callback shows each statement run
        assert conn is not None
        ran: list = []
        conn.set_trace_callback(lambda sql: ran.append(sql) if "FROM traces" in sql and "ORDER BY" in sql else None)
        try:
            cursor = reader.page(limit=5).next_cursor
            reader.page(limit=5, before=cursor)
            reader.page(Filter(status="completed"), limit=5, before=cursor)
        finally:
            conn.set_trace_callback(None)
        plans = [" ".join(r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + sql)) for sql in ran]
    _assert_keyset_plans(plans)


def test_list_formats_carry_the_same_rows(many, data_dir):
    import csv
    import io

    from click.testing import CliRunner

    from tracedb.cli import main

    def listing(*args):
        r = CliRunner().invoke(main, ["--data-dir", data_dir, "inspect", "--list", "--limit", "5", *args])
        assert r.exit_code == 0, r.output
        return r.stdout

    as_json = json.loads(listing("--format", "json"))
    assert as_json == json.loads(listing("--json"))
    as_ndjson = [json.loads(line) for line in listing("--format", "ndjson").splitlines()]
    assert as_ndjson == as_json
    rows = list(csv.DictReader(io.StringIO(listing("--format", "csv"))))
    assert [r["execution_id"] for r in rows] == [d["execution_id"] for d in as_json]
    assert [r["replayable"] for r in rows] == [str(d["replayable"]).lower() for d in as_json]
    assert [r["cursor"] for r in rows] == [d["cursor"] for d in as_json]
    table = listing()
    assert [line.split()[0] for line in table.splitlines()] == [d["execution_id"] for d in as_json]
    clash = CliRunner().invoke(main, ["--data-dir", data_dir, "inspect", "--list", "--json", "--format", "csv"])
    assert clash.exit_code == 2


def test_trace_get_follow_prints_new_events_until_the_execution_closes(data_dir):
    # A recorder keeps recording into an execution; `trace get --follow` in another process
    # prints each new event as a JSON line, then the final status, and exits by itself.
    import subprocess
    import sys

    import tracedb

    with tracedb.open(data_dir, config={"compact_interval_ms": 20, "idle_timeout_s": 0}) as store:
        ex = store.start("Followed", {"intent": "Followed"})
        ex.event("tool.requested", {"n": 0})
        store.compact()
        follower = subprocess.Popen(
            [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "trace", "get", ex.execution_id,
             "--json", "--follow", "--interval", "0.05"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        first = follower.stdout.readline()  # the record as it is
        assert json.loads(first)["events"] == [{"seq": 1, "type": "tool.requested", "payload": {"n": 0}, "error": None}]
        for n in (1, 2):
            ex.event("tool.responded", {"n": n})
        ex.finish({"status": "success", "payload": "done"})
        out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(d.get("seq"), d.get("type")) for d in lines[:-1]] == [
        (2, "tool.responded"), (3, "tool.responded"), (4, "FINAL_RESPONSE"),
    ]
    assert lines[-1] == {"status": "completed", "replayable": True, "replayable_reason": None}


def test_a_long_export_shows_progress_on_a_terminal_and_nothing_in_a_pipe(many, data_dir, tmp_path):
    import os
    import pty
    import subprocess
    import sys

    from tracedb.config import load_config
    from tracedb.reads.reader import Filter, Reader

    with Reader.open(load_config(overrides={"data_dir": data_dir})) as reader:
        total = reader.count()
        assert total == len(list(reader.each())) and reader.count(Filter(status="running")) == 0
    argv = [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "export", "--all"]
    master, slave = pty.openpty()
    try:
        r = subprocess.run([*argv, "-o", str(tmp_path / "out")], stderr=slave, stdout=subprocess.PIPE, timeout=120)
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    assert r.returncode == 0
    assert b"exporting" in seen and b"100%" in seen
    assert len(os.listdir(tmp_path / "out")) == total
    piped = subprocess.run([*argv, "-o", str(tmp_path / "again")], capture_output=True, text=True, timeout=120)
    assert "exporting" not in piped.stderr
