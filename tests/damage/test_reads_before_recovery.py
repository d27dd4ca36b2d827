"""Reads see what is durable: after a recorder is SIGKILLed and before anything recovers, the read
commands show what the WAL holds, with the state recovery will give it, without the lock."""

from __future__ import annotations

import os
import sqlite3

import orjson
import pytest

pytestmark = pytest.mark.timeout(120)


def lock_text(data_dir: str) -> bytes:
    with open(os.path.join(data_dir, "wal", "LOCK"), "rb") as f:
        return f.read()


def test_a_crashed_unrecovered_recorder_reads_as_recovery_will_make_it(recorded, cli):
    data_dir, _ = recorded("crash")
    before = lock_text(data_dir)
    run = cli(data_dir)
    # Compaction was held off: the database has nothing, the WAL everything.
    rows = run.json("inspect", "--list", "--json")
    by_id = {r["execution_id"]: r for r in rows}
    assert set(by_id) == {"exec-done", "exec-cut"}
    assert (by_id["exec-done"]["status"], by_id["exec-done"]["replayable"]) == ("completed", True)
    assert by_id["exec-cut"]["status"] == "incomplete"
    assert (by_id["exec-cut"]["replayable"], by_id["exec-cut"]["replayable_reason"]) == (False, "execution_incomplete")
    listed = run("inspect", "--list")
    assert "recover" in listed.stderr and "not compacted" in listed.stderr

    r = run("replay", "exec-cut")
    assert r.exit_code == 6, (r.exit_code, r.stderr)
    assert "execution_incomplete" in r.stderr
    assert run.json("replay", "exec-done", "--json")["response"] == {"status": "success", "answer": 42}

    record = run.json("trace", "get", "exec-cut", "--json")
    assert [(e["seq"], e["type"]) for e in record["events"]] == [(1, "INTENT_RECEIVED"), (2, "AGENT_ATTEMPT_START")]
    assert record["header"]["replayable"] is False
    view = run.json("inspect", "exec-c")  # a unique prefix of an id only the WAL knows
    assert (view["execution_id"], view["status"]) == ("exec-cut", "incomplete")
    exported = run("export", "exec-done", "--json")
    assert exported.exit_code == 0 and orjson.loads(exported.stdout)["finalResponse"]["answer"] == 42
    assert run.json("inspect", "--list", "--status", "running", "--json") == []
    assert [r["execution_id"] for r in run.json("inspect", "--list", "--status", "incomplete", "--json")] == ["exec-cut"]

    # Read-only and without the lock: the database is untouched, the lock file as the recorder left it.
    assert lock_text(data_dir) == before
    with sqlite3.connect(os.path.join(data_dir, "traces.db")) as conn:
        assert conn.execute("SELECT count(*) FROM traces").fetchone()[0] == 0
    # What recovery then makes permanent is what was read.
    assert run("recover").exit_code == 0
    after = {r["execution_id"]: r for r in run.json("inspect", "--list", "--json")}
    for eid in by_id:
        for key in ("status", "replayable", "replayable_reason", "last_seq", "created_utc_iso"):
            assert after[eid][key] == by_id[eid][key], (eid, key)
    assert "recover" not in run("inspect", "--list").stderr


def test_another_database_named_with_db_is_not_mixed_with_this_directory_s_wal(recorded, cli, tmp_path):
    # `--db` reads another store: this data directory's WAL is not that store's to fold in.
    data_dir, _ = recorded("crash")
    other = f"sqlite:///{tmp_path / 'other.db'}"
    run = cli(data_dir)
    assert run("--db", other, "migrate").exit_code == 0
    r = run("--db", other, "inspect", "--list", "--json")
    assert r.exit_code == 0, r.stderr
    assert orjson.loads(r.stdout) == []
    assert "not compacted" not in r.stderr
    assert run("--db", other, "replay", "exec-done").exit_code == 3  # not in that store
    assert {row["execution_id"] for row in run.json("inspect", "--list", "--json")} == {"exec-done", "exec-cut"}


def test_pages_merge_the_wal_with_the_database(recorded, cli):
    """Half compacted, half only in the WAL: pages, cursors, counts and filters see both."""
    data_dir, lsn = recorded("compacted", 30, 3, 1 << 20)
    run = cli(data_dir)
    assert run("recover").exit_code == 0
    # More, never compacted, by a second recorder that is killed as well.
    from tests.damage.conftest import Recorder

    r = Recorder(data_dir, "bulk", 15, 3, 1 << 20, 30)  # exec-00030..44
    r.ready()
    r.kill()
    ids = []
    cursor = None
    while True:
        args = ["inspect", "--list", "--json", "--limit", "7"] + (["--before", cursor] if cursor else [])
        page = run.json(*args)
        ids += [p["execution_id"] for p in page]
        if len(page) < 7:
            break
        cursor = page[-1]["cursor"]
    assert sorted(ids) == [f"exec-{i:05d}" for i in range(45)] and len(ids) == 45
    created = [p for p in run.json("inspect", "--list", "--all", "--json")]
    keys = [(p["created_utc_iso"], p["execution_id"]) for p in created]
    assert keys == sorted(keys, reverse=True)
    assert all(p["status"] == "completed" and p["replayable"] for p in created)


def test_a_tampered_envelope_is_what_inspect_and_replay_report(recorded, cli):
    data_dir, _ = recorded("crash")
    run = cli(data_dir)
    assert run("recover").exit_code == 0
    with sqlite3.connect(os.path.join(data_dir, "traces.db")) as conn:
        conn.execute("""UPDATE traces SET envelope = '{"intent": "Tampered"}' WHERE execution_id = 'exec-done'""")
    v = run("verify")
    assert v.exit_code == 4 and "exec-done" in v.stdout
    view = run.json("inspect", "exec-done")
    assert (view["replayable"], view["replayable_reason"]) == (False, "record_corrupted")
    assert any("envelope hash" in p for p in view["problems"])
    rows = {r["execution_id"]: r for r in run.json("inspect", "--list", "--json")}
    r = run("replay", "exec-done")
    assert r.exit_code == 4 and "record_corrupted" in r.stderr + r.stdout
    assert run.json("trace", "get", "exec-done", "--json")["header"]["replayableReason"] == "record_corrupted"
    assert rows  # the listing still reads
