"""`verify` checks everything (the traces, the database file, the WAL), and a damaged database file
is an error naming the file and the way out (exit 4), never a traceback."""

from __future__ import annotations

import os
import sqlite3

import pytest

import wal
from tests.damage.conftest import flip_bit, follow, hinted_commands, wal_records

pytestmark = pytest.mark.timeout(180)


def truncate_half(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


def damage_root_page(path: str, table: str = "traces") -> None:
    """Overwrite the b-tree page header of `table`'s root page."""
    with sqlite3.connect(path) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size + (100 if root == 1 else 0))
        f.write(b"\xff" * 12)


@pytest.mark.parametrize("damage", [truncate_half, damage_root_page])
def test_a_damaged_database_file_is_exit_4_naming_the_file(recorded, cli, damage):
    data_dir, _ = recorded("compacted", 300, 5, 1 << 20)
    run = cli(data_dir)
    assert run("recover").exit_code == 0
    db_path = os.path.join(data_dir, "traces.db")
    damage(db_path)
    for args in (("inspect", "--list", "--all"), ("trace", "get", "exec-00007"), ("verify",)):
        r = run(*args)
        assert r.exit_code == 4, (args, r.exit_code, r.stdout, r.stderr)
        out = r.stderr + r.stdout
        assert "Traceback" not in out and "sqlalchemy" not in out
        assert db_path in out and "damaged" in out, out
        assert "hint:" in out
    report = run.json("verify", "--json", code=4)
    assert report["ok"] is False and report["database"]["ok"] is False
    assert report["database"]["path"] == db_path and report["database"]["hint"]
    # The WAL is still checked and reported.
    assert report["wal"]["last_lsn"] > 0 and report["wal"]["damages"] == []


def test_rebuild_from_a_wal_that_holds_every_record_by_following_the_hint(recorded, cli):
    data_dir, lsn = recorded("bulk", 50, 4, 64 << 20)
    run = cli(data_dir)
    assert run("recover").exit_code == 0
    before = run.json("inspect", "--list", "--all", "--json")
    truncate_half(os.path.join(data_dir, "traces.db"))
    r = run("verify")
    assert r.exit_code == 4
    commands = hinted_commands(r.stdout + r.stderr)
    assert commands and commands[0] == "tracedb recover --rebuild", commands
    rebuilt = follow(run, commands[0])
    assert rebuilt.exit_code == 0, rebuilt.stderr
    assert os.path.exists(os.path.join(data_dir, "traces.db.damaged"))  # moved aside, not deleted
    assert run("verify").exit_code == 0
    after = run.json("inspect", "--list", "--all", "--json")
    strip = lambda rows: [{k: v for k, v in row.items() if k != "duration_ms"} for row in rows]  # noqa: E731
    assert strip(after) == strip(before) and len(after) == 50


def test_rebuild_from_a_partial_wal_is_refused_unless_the_loss_is_accepted(recorded, cli):
    data_dir, lsn = recorded("compacted", 60, 4, 4096)
    run = cli(data_dir)
    assert run("recover").exit_code == 0
    first = wal.list_segments(os.path.join(data_dir, "wal"))[0].first_lsn
    assert first > 1, "the scenario needs compacted segments deleted"
    damage_root_page(os.path.join(data_dir, "traces.db"))
    r = run("verify")
    assert r.exit_code == 4
    text = r.stdout + r.stderr
    assert f"LSN {first}" in text, text
    refused = run("recover", "--rebuild")
    assert refused.exit_code == 4 and "--partial" in refused.stderr
    assert not os.path.exists(os.path.join(data_dir, "traces.db.damaged"))
    commands = hinted_commands(text)
    assert "tracedb recover --rebuild --partial" in commands
    for command in commands:  # every command the hint names works as written
        if command != "tracedb recover --rebuild --partial" and command != "tracedb recover":
            assert follow(run, command).exit_code == 0, command
    assert follow(run, "tracedb recover --rebuild --partial").exit_code == 0
    assert run("verify").exit_code == 0
    assert run("inspect", "--list").exit_code == 0


def test_verify_reads_the_wal_one_flipped_bit(recorded, cli):
    """200 executions of 5 events, compaction held off, SIGKILL, one bit flipped mid-segment:
    verify exits 4 naming the file and offset (it printed `ok` before)."""
    data_dir, lsn = recorded("bulk", 200, 5, 64 << 20)
    wal_dir = os.path.join(data_dir, "wal")
    recs = wal_records(wal_dir)
    lsn_hit, seg, off, length = recs[len(recs) // 2]
    flip_bit(os.path.join(wal_dir, seg), off + 30, 3)
    run = cli(data_dir)
    r = run("verify")
    assert r.exit_code == 4, r.stdout
    assert seg in r.stdout and str(off) in r.stdout
    report = run.json("verify", "--json", code=4)
    [d] = [d for d in report["wal"]["damages"] if d["corruption"]]
    assert (d["path"], d["offset"]) == (seg, off)
    assert report["wal"]["uncompacted_records"] == lsn_hit - 1  # what reads can see: before the damage
    assert report["wal"]["applied_lsn"] == 0


def test_verify_names_uncompacted_records_and_executions_left_running(recorded, cli):
    data_dir, lsn = recorded("crash")
    run = cli(data_dir)
    report = run.json("verify", "--json")
    assert report["ok"] is True
    assert report["left_running"] == ["exec-cut"]
    assert report["wal"]["uncompacted_records"] == lsn
    assert any("tracedb recover" in n for n in report["notes"])
    one = run.json("verify", "exec-cut", "--json")  # only in the WAL: checked all the same
    assert one["ok"] is True and one["checked_traces"] == 1 and one["checked_steps"] == 2
    assert any("only in the WAL" in n for n in one["notes"])
    assert run("recover").exit_code == 0
    report = run.json("verify", "--json")
    assert report["left_running"] == [] and report["wal"]["uncompacted_records"] == 0 and report["notes"] == []
