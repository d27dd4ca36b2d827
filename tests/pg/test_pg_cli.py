"""The command line against PostgreSQL: --db, TRACEDB_DB_URL and [store] db_url; every read
command, maintenance, replay and fork; and the error for a server that cannot be reached."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import tracedb
from tracedb.cli import main
from tracedb.config import load_config
from tracedb.reads.reader import Reader
from tracedb.projection.schema import HEAD_REVISION

from tests.cli.conftest import page_queries

from .conftest import ENVELOPE, SEED_002_EVENTS, FakeClock

T0 = "2024-01-15T10:30:00Z"


@pytest.fixture
def seeded_pg(pg_url, tmp_path):
    """Seed 002's two executions recorded by a recorder (data dir "host") into the schema:
    exec-a1b2c3d4 completed, exec-e5f6g7h8 cut off after AGENT_ATTEMPT_START."""
    clock = FakeClock()
    host = str(tmp_path / "host")
    settings = {"db_url": pg_url, "compact_interval_ms": 0, "idle_timeout_s": 0}
    with tracedb.open(host, config=settings, clock=clock) as store:
        ex = store.start("ProcessIntent", ENVELOPE, "exec-a1b2c3d4")
        for _, type_, payload in SEED_002_EVENTS[:-1]:
            ex.event(type_, payload)
        ex.finish({"status": "success"})
        clock.advance(60)
        ex = store.start("ProcessIntent", ENVELOPE, "exec-e5f6g7h8")
        ex.event(*SEED_002_EVENTS[0][1:])
        ex.event(*SEED_002_EVENTS[1][1:])
    return host


def run(*args, env=None):
    return CliRunner().invoke(main, list(args), catch_exceptions=False, env=env)


@pytest.mark.postgres
def test_read_commands_take_the_database_url_three_ways(seeded_pg, pg_url, tmp_path):
    elsewhere = str(tmp_path / "reader")  # a reader on another machine: no WAL, no SQLite file
    expected = [  # newest first, then the events and duration columns
        ["exec-e5f6g7h8", "2024-01-15T10:31:00Z", "ProcessIntent", "incomplete", "not-replayable", "2", "0ms", "incomplete", "-", "0", "-"],
        ["exec-a1b2c3d4", "2024-01-15T10:30:00Z", "ProcessIntent", "completed", "replayable", "8", "0ms", "succeeded", "-", "0", "-"],
    ]
    by_flag = run("--data-dir", elsewhere, "--db", pg_url, "inspect", "--list")
    assert by_flag.exit_code == 0, by_flag.output
    assert [line.split() for line in by_flag.stdout.splitlines()] == expected
    by_env = run("--data-dir", elsewhere, "inspect", "--list", env={"TRACEDB_DB_URL": pg_url})
    assert [line.split() for line in by_env.stdout.splitlines()] == expected
    conf = tmp_path / "tracedb.toml"
    conf.write_text(f'[store]\ndb_url = "{pg_url}"\n')
    by_file = run("--config", str(conf), "--data-dir", elsewhere, "inspect", "--list")
    assert [line.split() for line in by_file.stdout.splitlines()] == expected

    inspect = json.loads(run("--db", pg_url, "inspect", "exec-e5f6g7h8").stdout)
    assert inspect == {
        "execution_id": "exec-e5f6g7h8",
        "status": "incomplete",
        "last_event": {"seq": 2, "type": "AGENT_ATTEMPT_START", "agent": "processor-a"},
        "replayable": False,
        "replayable_reason": "execution_incomplete",
        "outcome": "incomplete", "error": None, "models": [], "input_tokens": 0, "output_tokens": 0,
        "cost_usd": 0.0, "errored_events": [],
    }
    record = json.loads(run("--db", pg_url, "trace", "get", "exec-a1b2c3d4", "--json").stdout)
    assert record["header"]["envelopeHash"] == tracedb.compute_envelope_hash(ENVELOPE)
    assert [e["seq"] for e in record["events"]] == list(range(1, 9))
    verify = run("--db", pg_url, "verify", "--json")
    assert verify.exit_code == 0 and json.loads(verify.stdout)["checked_steps"] == 10
    missing = run("--db", pg_url, "trace", "get", "exec-nope")
    assert missing.exit_code == 3


@pytest.mark.postgres
def test_maintenance_replay_and_fork_against_postgresql(seeded_pg, pg_url):
    db = ["--db", pg_url]
    assert run(*db, "pin", "exec-a1b2c3d4").exit_code == 0
    dry = json.loads(run(*db, "prune", "--older-than", "1d", "--dry-run", "--json").stdout)
    assert (dry["deleted_traces"], dry["kept_pinned"]) == (1, 1)
    replay = run(*db, "replay", "exec-a1b2c3d4", "--json")
    assert replay.exit_code == 0 and json.loads(replay.stdout)["fromReplay"] is True
    assert run(*db, "replay", "exec-e5f6g7h8").exit_code == 6  # incomplete: not replayable
    # A fork without a running recorder is recorded through the data directory's WAL.
    fork = run("--data-dir", seeded_pg, *db, "fork", "exec-a1b2c3d4", "--at", "3", "--id", "exec-fork", "--json")
    assert fork.exit_code == 0, fork.output
    got = json.loads(run(*db, "trace", "get", "exec-fork", "--json").stdout)
    assert got["lineage"] == {"parentExecutionId": "exec-a1b2c3d4", "forkedAtSeq": 3}
    assert [e["type"] for e in got["events"]] == [t for _, t, _ in SEED_002_EVENTS[:3]]
    assert run(*db, "invalidate", "exec-a1b2c3d4", "--reason", "bad tool").exit_code == 0
    assert run(*db, "replay", "exec-a1b2c3d4").exit_code == 6
    assert run(*db, "unpin", "exec-a1b2c3d4").exit_code == 0
    pruned = json.loads(run(*db, "prune", "--older-than", "1d", "--json").stdout)
    # exec-a1b2c3d4 stays: the fork made from it is recent.
    assert (pruned["deleted_traces"], pruned["kept_parents"]) == (1, 1)
    compact = run("--data-dir", seeded_pg, *db, "compact", "--json")
    assert compact.exit_code == 0, compact.output
    assert run("--data-dir", seeded_pg, *db, "recover").exit_code == 0
    assert run(*db, "verify").exit_code == 0


@pytest.mark.postgres
def test_migrate_creates_the_schema_on_a_new_database(pg_url):
    first = run("--db", pg_url, "migrate")
    assert first.exit_code == 0 and first.stdout.strip() == f"schema at {HEAD_REVISION} (was empty)"
    assert run("--db", pg_url, "migrate").stdout.strip() == f"schema at {HEAD_REVISION}"


def test_an_unreachable_server_is_named_without_its_password_with_what_to_check(tmp_path):
    # Port 1 on the loopback: nothing listens there, the connection is refused at once.
    url = "postgresql+psycopg://tracedb:s3cret@127.0.0.1:1/traces"
    result = CliRunner().invoke(main, ["--data-dir", str(tmp_path), "--db", url, "inspect", "--list"])
    assert result.exit_code == 1
    assert "s3cret" not in result.output
    assert "error: cannot use the database postgresql+psycopg://tracedb:***@127.0.0.1:1/traces" in result.stderr
    assert "hint: check that the server is running" in result.stderr
    assert "pg_hba.conf" in result.stderr


def test_a_database_url_tracedb_cannot_use_is_refused_with_a_hint(tmp_path):
    not_url = CliRunner().invoke(main, ["--db", "traces.db", "inspect", "--list"])
    assert not_url.exit_code == 1 and "is not a database URL" in not_url.stderr
    other = CliRunner().invoke(main, ["--db", "mysql://u@h/db", "inspect", "--list"])
    assert other.exit_code == 1 and "SQLite or PostgreSQL, not mysql" in other.stderr


@pytest.mark.postgres
def test_pages_of_executions_and_id_prefixes_on_postgresql(pg_url, tmp_path):
    """The keyset pages (newest first; ties in one nanosecond by id) and prefix resolution
    (PostgreSQL's LIKE, not SQLite's range) against the server."""
    clock = FakeClock()
    settings = {"db_url": pg_url, "compact_interval_ms": 0, "idle_timeout_s": 0}
    ids: list[str] = []
    with tracedb.open(str(tmp_path / "host"), config=settings, clock=clock) as store:
        for i in range(23):
            eid = f"exec-{i:02d}_{'x' if i % 3 else 'y'}"
            store.start("Batch" if i % 2 else "Other", ENVELOPE, eid).finish({"status": "success"})
            ids.append(eid)
            if i % 4 == 3:  # executions share a creation time four at a time
                clock.advance(1)
    newest_first = sorted(ids, key=lambda e: (int(e[5:7]) // 4, e), reverse=True)
    db = ["--db", pg_url]
    seen, args = [], []
    for _ in range(10):
        page = run(*db, "inspect", "--list", "--limit", "5", "--json", *args)
        assert page.exit_code == 0, page.output
        rows = json.loads(page.stdout)
        seen += [r["execution_id"] for r in rows]
        if "--before" not in page.stderr:
            break
        args = ["--before", rows[-1]["cursor"]]
    assert seen == newest_first
    batch = run(*db, "inspect", "--list", "--status", "completed", "--intent", "Batch", "--all")
    assert [line.split()[0] for line in batch.stdout.splitlines()] == [e for e in newest_first if int(e[5:7]) % 2]
    assert json.loads(run(*db, "inspect", "exec-07").stdout)["execution_id"] == "exec-07_x"
    ambiguous = run(*db, "inspect", "exec-1")
    assert ambiguous.exit_code == 2 and "exec-10_x" in ambiguous.stderr
    # `_` is a LIKE wildcard: the prefix "exec-0_" must not match "exec-00_y".
    assert run(*db, "inspect", "exec-0_").exit_code == 3
    assert run(*db, "inspect", "exec-2%").exit_code == 3
    # The pages come from the keyset indexes, walked backwards, with no sort (the planner is
    # told to avoid sequential scans: on 23 rows it would rightly prefer one).
    with Reader.open(load_config(None, overrides={"db_url": pg_url, "data_dir": str(tmp_path)})) as reader:
        with reader.engine.connect() as conn:
            conn.exec_driver_sql("SET enable_seqscan = off")
            # With statistics, as autovacuum gathers them: without, the planner guesses the
            # width of the JSON and text columns and may take a bitmap scan and a sort.
            conn.exec_driver_sql("ANALYZE traces")
            plans = [
                "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql, params))
                for sql, params in page_queries(reader)
            ]
    assert len(plans) == 3
    assert "ix_traces_created_id" in plans[0] and "ix_traces_created_id" in plans[1]
    assert "ix_traces_status_created_id" in plans[2]
    assert not any("Sort" in p for p in plans), plans


def test_the_async_reader_answers_like_the_sync_one_on_postgresql(open_pg_store, pg_url, tmp_path):
    import asyncio

    from tracedb.reads.reader import AsyncReader, Filter

    store = open_pg_store()
    for i in range(5):
        ex = store.start("Batch" if i % 2 else "Other", ENVELOPE, f"exec-async-{i}")
        ex.event(*SEED_002_EVENTS[0][1:])
        ex.finish({"status": "success", "payload": {"i": i}})
    store.compact()
    cfg = load_config(None, overrides={"db_url": pg_url, "data_dir": str(tmp_path / "reader")})

    async def read():
        async with await AsyncReader.open(cfg) as r:
            first = await r.page(limit=2)
            rest = await r.page(Filter(intent="Batch"), before=first.next_cursor, limit=10)
            return first, rest, await r.get("exec-async-3"), await r.resolve("exec-async-4")

    first, rest, record, resolved = asyncio.run(read())
    with Reader.open(cfg) as sync:
        assert first == sync.page(limit=2)
        assert rest == sync.page(Filter(intent="Batch"), before=first.next_cursor, limit=10)
        assert record == sync.get("exec-async-3")
    assert [i.execution_id for i in rest.items] == ["exec-async-1"]
    assert record.finalResponse == {"status": "success", "payload": {"i": 3}}
    assert resolved == "exec-async-4"


def test_a_read_on_a_schema_with_no_store_is_not_found_and_creates_nothing(pg_url, pg_admin, pg_schema, tmp_path):
    """An empty schema (a wrong search_path, a database not yet used): exit 3 with a hint, and
    no tracedb tables made there by a command that only reads."""
    for args in (["inspect", "--list"], ["verify"], ["prune", "--older-than", "30d", "--dry-run"]):
        r = CliRunner().invoke(main, ["--data-dir", str(tmp_path / "none"), "--db", pg_url, *args])
        assert r.exit_code == 3 and "no trace store" in r.output and "search_path" in r.output, (args, r.output)
    tables = pg_admin.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
                              (pg_schema,)).fetchone()[0]
    assert tables == 0
