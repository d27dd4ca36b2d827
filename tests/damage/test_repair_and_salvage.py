"""Repair is safe and salvage keeps every record whose CRC is valid: a dry run that changes
nothing and says what a cut drops, a cut below the applied LSN that still opens, salvage from the
live log and from the `.broken` copy of an earlier cut, and every hint printed works."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys

import orjson
import pytest

import tracedb
import wal
from tests.damage.conftest import flip_bit, follow, hinted_commands

pytestmark = pytest.mark.timeout(240)


def digest(data_dir: str) -> dict:
    """Every WAL file's bytes, and what the database holds (SQLite may checkpoint its own -wal
    file when a reader closes: that is not a change of content)."""
    out = {}
    wal_dir = os.path.join(data_dir, "wal")
    for name in sorted(os.listdir(wal_dir)):
        with open(os.path.join(wal_dir, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    with sqlite3.connect(os.path.join(data_dir, "traces.db")) as conn:
        for table in ("traces", "trace_steps", "compaction_checkpoint"):
            rows = conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            out[table] = hashlib.sha256(repr(rows).encode()).hexdigest()
    return out


def event_record_in_the_middle(wal_dir: str):
    """(lsn, segment, offset, execution id, seq) of an event record about halfway through."""
    recs = list(wal.read_records(wal_dir))
    for rec in recs[len(recs) // 2 :]:
        if rec.payload[:1] == b"\x01":
            eid, seq = orjson.loads(rec.payload[1 : rec.payload.index(b"\n")])[:2]
            if seq > 1:
                return rec.lsn, rec.segment, rec.offset, eid, seq
    raise AssertionError("no event record")


def test_one_flipped_bit_costs_one_record(recorded, cli):
    """200 executions of 5 events, compaction held off, SIGKILL, one bit flipped mid-segment:
    salvage keeps the other 1,199 records; the one execution that lost an event is not
    replayable (record_corrupted) and names its missing seq."""
    data_dir, durable = recorded("bulk", 200, 5, 64 << 20)
    wal_dir = os.path.join(data_dir, "wal")
    lsn, seg, off, eid, seq = event_record_in_the_middle(wal_dir)
    flip_bit(os.path.join(wal_dir, seg), off + 30, 5)
    run = cli(data_dir)
    scanned = run("wal", "scan")
    assert scanned.exit_code == 4 and f"{seg} at {off}" in scanned.stdout
    assert "tracedb wal repair --salvage" in hinted_commands(scanned.stderr)
    assert run("verify").exit_code == 4
    # A read shows what comes before the damage, and says that the rest is not shown.
    listed = run("inspect", "--list", "--all")
    assert listed.exit_code == 0
    assert f"the WAL is damaged in {seg} at offset {off}" in listed.stderr, listed.stderr

    before = digest(data_dir)
    plan = run.json("wal", "repair", "--salvage", "--dry-run", "--json")
    assert digest(data_dir) == before  # a dry run changes nothing
    [d] = plan["damaged"]
    assert (d["file"], d["offset"], d["first_lost_lsn"], d["last_lost_lsn"]) == (seg, off, lsn, lsn)
    assert d["length"] > 0 and plan["kept_records"] == durable - lsn
    assert plan["corrupted_executions"] == [{"execution_id": eid, "missing_seqs": [seq]}]

    done = run.json("wal", "repair", "--salvage", "--json")
    assert done["damaged"] == plan["damaged"]
    assert done["corrupted_executions"] == [{"execution_id": eid, "missing_seqs": [seq]}]
    assert any(c.endswith(".wal.broken") for c in done["broken_copies"])  # the evidence is kept
    rows = run.json("inspect", "--list", "--all", "--json")
    assert len(rows) == 200
    for row in rows:
        if row["execution_id"] == eid:
            assert (row["replayable"], row["replayable_reason"]) == (False, "record_corrupted")
        else:
            assert (row["status"], row["replayable"]) == ("completed", True), row
    view = run.json("inspect", eid)
    assert view["missing_seqs"] == [seq] and view["replayable_reason"] == "record_corrupted"
    record = run.json("trace", "get", eid, "--json")
    assert [e["seq"] for e in record["events"]] == [s for s in range(1, 6) if s != seq]  # what survived
    assert run("replay", eid).exit_code in (4, 6)
    assert run("verify").exit_code == 0  # the loss is recorded, and nothing else is wrong
    # The directory is a working store again.
    with tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
        ex = store.start("After", {"n": 1})
        ex.finish({"ok": True})
    assert run("verify").exit_code == 0


def test_dry_run_then_cut_then_the_printed_hints(recorded, cli):
    data_dir, durable = recorded("bulk", 60, 5, 64 << 20)
    wal_dir = os.path.join(data_dir, "wal")
    lsn, seg, off, eid, seq = event_record_in_the_middle(wal_dir)
    flip_bit(os.path.join(wal_dir, seg), off + 24, 0)
    run = cli(data_dir)
    recovered = run("recover")
    assert recovered.exit_code == 4
    commands = hinted_commands(recovered.stderr)
    assert "tracedb wal repair --dry-run" in commands and "tracedb wal repair --salvage" in commands

    before = digest(data_dir)
    plan = run.json("wal", "repair", "--dry-run", "--json")
    assert digest(data_dir) == before
    all_recs = list(wal.read_records(wal_dir, mode="salvage"))
    dropped = [r for r in all_recs if r.lsn > lsn]
    assert plan["dropped_records"] == len(dropped) and plan["lost_records"] == 1
    ids = {orjson.loads(r.payload[1 : r.payload.index(b"\n")])[0] if r.payload[:1] == b"\x01" else orjson.loads(r.payload)["id"] for r in dropped}
    assert set(plan["dropped_executions"]) == ids | {eid} or set(plan["dropped_executions"]) == ids
    text = run("wal", "repair", "--dry-run").stdout
    assert f"{seg} at offset {off}" in text and "nothing was changed" in text

    cut = run("wal", "repair")
    assert cut.exit_code == 0 and ".broken" in cut.stdout
    for command in hinted_commands(cut.stdout):  # `tracedb recover`, then `tracedb wal repair --salvage`
        r = follow(run, command)
        assert r.exit_code == 0, (command, r.stdout, r.stderr)
    rows = run.json("inspect", "--list", "--all", "--json")
    assert len(rows) == 60
    bad = [r["execution_id"] for r in rows if not r["replayable"]]
    assert bad == [eid]
    assert run.json("inspect", eid)["missing_seqs"] == [seq]
    assert run("verify").exit_code == 0


def test_a_cut_below_the_applied_lsn_leaves_a_directory_that_opens(recorded, cli):
    """Damage in the live segment after compaction ran: the cut is below the applied LSN; the
    records up to it are in the database, and the log continues after it (it bricked before:
    `recover` and `serve` exited 4, "applied LSN ... beyond the end of the WAL")."""
    data_dir, durable = recorded("compacted", 100, 5, 64 << 20)
    wal_dir = os.path.join(data_dir, "wal")
    lsn, seg, off, eid, seq = event_record_in_the_middle(wal_dir)
    flip_bit(os.path.join(wal_dir, seg), off + 30, 1)
    run = cli(data_dir)
    plan = run.json("wal", "repair", "--dry-run", "--json")
    assert plan["below_applied"] is True and plan["dropped_records"] == 0 and plan["dropped_executions"] == []
    assert plan["lost_records"] == 0  # the damaged record is in the database
    text = run("wal", "repair", "--dry-run").stdout
    assert "in the database already" in text
    repaired = run("wal", "repair")
    assert repaired.exit_code == 0, repaired.stderr
    assert run("recover").exit_code == 0  # the help's own example: tracedb wal repair && tracedb recover
    assert run("verify").exit_code == 0
    # `tracedb serve` opens it too (a real recorder process, stopped with SIGTERM).
    serve = subprocess.Popen(
        [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "serve"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        lines = []
        for line in serve.stdout:
            lines.append(line)
            if '"listening"' in line:
                break
        assert any('"listening"' in x for x in lines), lines
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(30)
        serve.stdout.close()
    assert len(run.json("inspect", "--list", "--all", "--json")) == 100
    with tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
        assert store.durable_lsn >= durable
        ex = store.start("After", {"n": 1}, "exec-after")
        ex.finish({"ok": True})
    assert run.json("inspect", "exec-after")["replayable"] is True
    assert any(name.endswith(".broken") for name in os.listdir(wal_dir))


def test_salvage_with_the_recorder_running_is_refused(tmp_path, cli):
    data_dir = str(tmp_path / "d")
    with tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0}):
        for args in (("wal", "repair", "--salvage"), ("wal", "repair")):
            r = cli(data_dir)(*args)
            assert r.exit_code == 5 and "stop the recorder" in r.stderr


def _files(data_dir: str) -> dict:
    """Every file of the data directory: its bytes' digest and its modification time."""
    out = {}
    for root, _dirs, names in os.walk(data_dir):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, data_dir)] = (hashlib.sha256(f.read()).hexdigest(), os.stat(path).st_mtime_ns)
    return out


@pytest.mark.parametrize("salvage", [False, True], ids=["cut", "salvage"])
def test_a_dry_run_reads_next_to_a_running_recorder_and_writes_nothing(tmp_path, cli, salvage):
    data_dir = str(tmp_path / "d")
    settings = {"compact_interval_ms": 0, "idle_timeout_s": 0, "wal_segment_size_bytes": 4096,
                "wal_preallocate": False}
    with tracedb.open(data_dir, config=settings) as store:
        for i in range(40):
            ex = store.start("Bulk", {"i": i}, f"exec-{i:05d}")
            ex.event("tool.step", {"i": i, "pad": "p" * 40})
            ex.finish({"status": "success"})
        wal_dir = os.path.join(data_dir, "wal")
        segments = wal.list_segments(wal_dir)
        assert len(segments) >= 5
        # Damage in a sealed segment, well before the end the recorder writes at.
        victim = segments[1]
        rec = next(r for r in wal.read_records(wal_dir) if r.segment == victim.name)
        flip_bit(victim.path, rec.offset + 30, 1)
        ex = store.start("Bulk", {"i": 40}, "exec-00040")  # the recorder goes on writing its end
        ex.event("tool.step", {"i": 40})
        before = _files(data_dir)
        args = ("wal", "repair", "--dry-run", "--json") + (("--salvage",) if salvage else ())
        r = cli(data_dir)(*args)
        assert r.exit_code == 0, r.stderr
        plan = orjson.loads(r.stdout)
        assert plan["dry_run"] is True and plan["repaired"] is True
        assert [d["file"] for d in plan["damaged"]] == [victim.name]
        if not salvage:
            assert plan["truncated_segment"] == victim.name and plan["dropped_records"] > 0
        assert any("a recorder is running" in n for n in plan["notes"])
        assert _files(data_dir) == before  # not a byte, not a timestamp
        # No lock was left behind: the recorder appends, compacts and closes as before.
        ex = store.start("After", {"n": 1}, "exec-after")
        ex.finish({"status": "success"})


def test_a_damaged_segment_compaction_would_delete_unread_is_kept(tmp_path, cli):
    """A recorder killed between committing a compaction batch and deleting the segments it
    covered leaves sealed segments wholly applied; one of them is damaged (`wal scan` says so).
    The next recovery deletes such segments without reading them: a copy of the damaged one is
    kept first (it was deleted, evidence gone, before)."""
    from tests.damage.conftest import Recorder

    data_dir = str(tmp_path / "d")
    r = Recorder(data_dir, "compacted", 60, 5, 4096, pause="after_commit:1")
    r.ready("PAUSED")
    r.kill()
    wal_dir = os.path.join(data_dir, "wal")
    segs = wal.list_segments(wal_dir)
    assert len(segs) >= 3
    victim = segs[1]
    flip_bit(victim.path, 100, 2)
    run = cli(data_dir)
    assert run("wal", "scan").exit_code == 4
    rec = run.json("recover", "--json")
    assert rec["kept_copies"] == [victim.name + ".broken"]
    # The next compaction deletes the applied segment as usual; the copy of its damage stays.
    with tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
        for i in range(40):
            store.start("More", {"i": i}).finish({"i": i})
    assert not os.path.exists(victim.path)
    copies = [n for n in os.listdir(wal_dir) if n.startswith(victim.name + ".broken")]
    assert copies == [victim.name + ".broken"]  # one copy, however many opens saw it
    assert wal.salvage_file(os.path.join(wal_dir, copies[0])).damages
    assert len(run.json("inspect", "--list", "--all", "--json")) == 100
    assert run("verify").exit_code == 0



def test_a_sealed_segment_whose_seal_is_damaged_is_moved_aside_and_the_next_recover_says_where(recorded, cli):
    """A flipped byte in the SEAL of a sealed segment: compaction applies every record of the
    segment (they come before the SEAL), the log deletes applied segments, and only then does
    the reader reach the SEAL. The segment is moved aside as `.broken` instead of deleted, the
    recover that found it exits 4 saying so, and the next recover names the copy."""
    from wal import format as fmt

    data_dir, durable = recorded("bulk", 60, 5, 4096)
    wal_dir = os.path.join(data_dir, "wal")
    victim = wal.list_segments(wal_dir)[1]
    seal_size = len(fmt.encode_seal(0, 0, 0))
    flip_bit(victim.path, os.path.getsize(victim.path) - seal_size + 9, 3)  # its LSN field
    with open(victim.path, "rb") as f:
        damaged = f.read()
    run = cli(data_dir)
    first = run("recover")
    assert first.exit_code == 4, first.stderr
    assert f"WAL corruption in {victim.path}" in first.stderr
    assert f"moved out of the log as {victim.path}.broken" in first.stderr, first.stderr
    assert not os.path.exists(victim.path)
    with open(victim.path + ".broken", "rb") as f:
        assert f.read() == damaged
    second = run("recover")
    assert second.exit_code == 0, second.stderr
    assert f"kept {victim.path}.broken: a damaged WAL segment, moved out of the log" in second.stdout
    assert run.json("recover", "--json")["kept_copies"] == [victim.name + ".broken"]
    assert len(run.json("inspect", "--list", "--all", "--json")) == 60  # every record was applied
    salvage = run.json("wal", "repair", "--salvage", "--dry-run", "--json")
    assert salvage["relogged_records"] == 0, salvage

def test_salvage_of_a_zeroed_sector_over_a_middle_segments_header(recorded, cli):
    """Many sealed segments; the first 512 bytes of one in the middle (its header, and the
    records under it) are zeros. Salvage finds the segment's salt from its records, keeps every
    record outside the sector, including all the later segments a plain cut removes, and marks
    only the executions whose records were under it."""
    data_dir, durable = recorded("bulk", 150, 5, 16 << 10)
    wal_dir = os.path.join(data_dir, "wal")
    segs = wal.list_segments(wal_dir)
    assert len(segs) >= 5
    victim = segs[len(segs) // 2]
    under = [r for r in wal.read_records(wal_dir) if r.segment == victim.name and r.offset < 512]
    assert under
    with open(victim.path, "r+b") as f:
        f.write(bytes(512))
    lost_ids = {}
    for r in under:
        if r.payload[:1] == b"\x01":
            eid, seq = orjson.loads(r.payload[1 : r.payload.index(b"\n")])[:2]
            lost_ids.setdefault(eid, []).append(seq)
        else:
            doc = orjson.loads(r.payload)
            lost_ids.setdefault(doc["id"], []).append(doc.get("seq"))
    run = cli(data_dir)
    plan = run.json("wal", "repair", "--salvage", "--dry-run", "--json")
    assert {c["execution_id"] for c in plan["corrupted_executions"]} == set(lost_ids)
    done = run.json("wal", "repair", "--salvage", "--json")
    lost = sorted(r.lsn for r in under)
    ranges = [d for d in done["damaged"] if d["first_lost_lsn"] is not None]
    assert [(d["first_lost_lsn"], d["last_lost_lsn"]) for d in ranges] == [(lost[0], lost[-1])]
    assert {c["execution_id"] for c in done["corrupted_executions"]} == set(lost_ids)
    rows = run.json("inspect", "--list", "--all", "--json")
    assert len(rows) == 150
    for row in rows:
        assert row["replayable"] == (row["execution_id"] not in lost_ids), row
    for eid in lost_ids:
        view = run.json("inspect", eid)
        assert view["replayable_reason"] == "record_corrupted" and "WAL damage" in view["note"], view
    assert run("verify").exit_code == 0
