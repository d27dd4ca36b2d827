"""The end of the log, and LSNs after a cut, through real recorder processes and the CLI run as
subprocesses:

- a flipped bit in the last acknowledged record fails closed (exit 4 naming the file and the
  offset) instead of being cut as a torn tail;
- a torn tail the writer cuts is kept, byte for byte, in `<segment>.tail-<offset>`; `verify`
  names it; `wal repair --salvage` applies the whole records in it; compaction never deletes it;
- `wal repair`, `recover`, then `wal repair --salvage` ends in the same state as
  `wal repair --salvage` alone: the records `recover` appends after the cut never reuse the LSNs
  of the records the cut removed."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys

import orjson
import pytest

import tracedb
import wal
from tests.conftest import REPO
from tests.damage.conftest import flip_bit
from wal import format as fmt

pytestmark = pytest.mark.timeout(300)


def tdb(data_dir: str, *args: str) -> subprocess.CompletedProcess:
    """`tracedb --data-dir DATA_DIR ARGS...` in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "tracedb", "--data-dir", data_dir, *args],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )


def tdb_json(data_dir: str, *args: str, code: int = 0):
    r = tdb(data_dir, *args, "--json")
    assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
    return orjson.loads(r.stdout)


def last_record(wal_dir: str) -> wal.Record:
    return list(wal.read_records(wal_dir))[-1]


def test_a_flipped_bit_in_the_last_acknowledged_record_fails_closed(recorded):
    """exec-cut's last event is the last record of the log, acknowledged (durable) when the
    recorder was killed. One bit of its payload flips: opening the data directory refuses, with
    the file and the offset (it was cut as a torn tail, without a trace, before); salvage then
    reports the record lost and marks exec-cut."""
    data_dir, durable = recorded("crash")
    wal_dir = os.path.join(data_dir, "wal")
    rec = last_record(wal_dir)
    assert rec.lsn == durable
    seg_path = os.path.join(wal_dir, rec.segment)
    flip_bit(seg_path, rec.offset + 20 + len(rec.payload) // 2, 4)
    size = os.path.getsize(seg_path)

    for args in (("recover",), ("serve",)):
        r = tdb(data_dir, *args)
        assert r.returncode == 4, (args, r.stdout, r.stderr)
        assert f"{seg_path} at offset {rec.offset}" in r.stderr, r.stderr
        assert "not a torn write" in r.stderr
    assert os.path.getsize(seg_path) == size  # nothing was cut
    assert not [n for n in os.listdir(wal_dir) if ".tail-" in n]

    done = tdb_json(data_dir, "wal", "repair", "--salvage")
    [d] = done["damaged"]
    assert (d["file"], d["offset"], d["first_lost_lsn"], d["torn_tail"]) == (rec.segment, rec.offset, rec.lsn, False)
    assert done["corrupted_executions"] == [{"execution_id": "exec-cut", "missing_seqs": []}]
    view = tdb_json(data_dir, "inspect", "exec-cut")
    assert view["replayable_reason"] == "record_corrupted"
    assert [e["seq"] for e in tdb_json(data_dir, "trace", "get", "exec-cut")["events"]] == [1]
    assert tdb_json(data_dir, "inspect", "exec-done")["replayable"] is True
    assert tdb(data_dir, "verify").returncode == 0


def torn_group(seg_path: str, lsn: int, t: int) -> tuple[bytes, int]:
    """A group of two records of exec-cut (events 3 and 4) as a power loss may leave it: a
    512-byte sector of the first never landed (zeros), the second landed whole. Returns the
    bytes and the offset in the first record of the zeroed sector."""
    with open(seg_path, "rb") as f:
        salt = fmt.decode_segment_header(f.read(fmt.SEGMENT_HEADER_SIZE)).salt
    seed = fmt.salt_seed(salt)

    def event(seq: int, payload: dict) -> bytes:
        head = orjson.dumps(["exec-cut", seq, "tool.result", t + seq])
        return b"\x01" + head + b"\n" + orjson.dumps(payload)

    end = os.path.getsize(seg_path)
    first = fmt.encode_record(seed, lsn, fmt.TYPE_DATA, event(3, {"text": "x" * 1500}))
    second = fmt.encode_record(seed, lsn + 1, fmt.TYPE_DATA, event(4, {"text": "landed"}))
    sector = -end % 512 + 512  # a whole sector inside the first record
    assert sector + 512 < len(first)
    first = first[:sector] + bytes(512) + first[sector + 512:]
    return first + second, sector


def test_a_torn_tail_is_kept_named_by_verify_salvaged_and_never_deleted(recorded):
    data_dir, durable = recorded("crash")
    wal_dir = os.path.join(data_dir, "wal")
    rec = last_record(wal_dir)
    seg_path = os.path.join(wal_dir, rec.segment)
    t = orjson.loads(rec.payload[1 : rec.payload.index(b"\n")])[3]
    end = os.path.getsize(seg_path)
    group, _ = torn_group(seg_path, durable + 1, t)
    with open(seg_path, "ab") as f:
        f.write(group)

    r = tdb(data_dir, "recover")
    assert r.returncode == 0, r.stderr
    kept = os.path.join(wal_dir, f"{rec.segment}.tail-{end}")
    with open(seg_path, "rb") as f:
        assert group[:64] not in f.read()  # the torn group is cut (recover marked exec-cut after it) ...
    mark = orjson.loads(last_record(wal_dir).payload)
    assert (mark["op"], mark["id"]) == ("incomplete", "exec-cut")
    with open(kept, "rb") as f:
        body = f.read()
    assert body[fmt.SEGMENT_HEADER_SIZE:] == group  # ... and kept byte for byte
    assert os.path.basename(kept) in r.stderr  # the warning names the copy
    tail = wal.salvage_tail(kept)
    assert [x.lsn for x in tail.records] == [durable + 2]
    assert [(d.offset, d.first_lost_lsn) for d in tail.damages] == [(end, durable + 1)]

    # The tail holds a whole record the database lacks: verify says so, and how to apply it.
    checked = tdb_json(data_dir, "verify", code=4)
    assert checked["wal"]["kept_tails"] == [{"file": os.path.basename(kept), "records": 1, "not_in_database": 1}]
    assert any(os.path.basename(kept) in p and "--salvage" in p for p in checked["problems"])

    done = tdb_json(data_dir, "wal", "repair", "--salvage")
    assert {(d["file"], d["offset"], d["torn_tail"]) for d in done["damaged"]} == {(os.path.basename(kept), end, True)}
    assert done["corrupted_executions"] == [{"execution_id": "exec-cut", "missing_seqs": [3]}]
    events = tdb_json(data_dir, "trace", "get", "exec-cut")["events"]
    assert [(e["seq"], e["payload"]) for e in events][2:] == [(4, {"text": "landed"})]
    checked = tdb_json(data_dir, "verify")
    assert checked["ok"] and any(os.path.basename(kept) in n for n in checked["notes"])

    # Compaction deletes sealed segments as it goes; the kept tail stays.
    settings = {"compact_interval_ms": 0, "idle_timeout_s": 0, "wal_segment_size_bytes": 4096, "wal_preallocate": False}
    with tracedb.open(data_dir, config=settings) as store:
        for i in range(60):
            store.start("More", {"i": i, "pad": "p" * 200}).finish({"i": i})
        store.compact()
    assert not os.path.exists(seg_path)
    assert os.path.exists(kept)


def database_state(data_dir: str) -> dict:
    """Every trace and step of the database, without LSNs or times."""
    with sqlite3.connect(os.path.join(data_dir, "traces.db")) as conn:
        traces = conn.execute(
            "SELECT execution_id, intent, status, replayable, replayable_reason, status_note FROM traces"
        ).fetchall()
        steps = conn.execute("SELECT execution_id, seq, type, payload FROM trace_steps").fetchall()
    return {"traces": sorted(traces), "steps": sorted(steps)}


def test_repair_recover_then_salvage_ends_as_salvage_alone(recorded, tmp_path):
    """exec-early recorded one event and was left running; 12 more ran interleaved, half left
    running. One bit flips in the middle of the log. Salvage alone, and a plain repair followed
    by `recover` and then salvage, leave the same executions, events, statuses and
    record_corrupted marks. `recover` used to append its marks at the LSNs the cut records had
    (in the .broken copy): salvage then took the damaged range for one the database holds and
    left exec-early merely incomplete."""
    data_dir, _durable = recorded("interleaved", 12, 3, 64 << 20)
    wal_dir = os.path.join(data_dir, "wal")
    recs = list(wal.read_records(wal_dir))
    victim = recs[len(recs) // 2]
    flip_bit(os.path.join(wal_dir, victim.segment), victim.offset + 30, 3)
    other = str(tmp_path / "other")
    shutil.copytree(data_dir, other)

    alone = tdb_json(data_dir, "wal", "repair", "--salvage")
    cut = tdb_json(other, "wal", "repair")
    assert cut["dropped_records"] > 0
    assert any("continue at LSN" in n for n in cut["notes"]), cut["notes"]
    recovered = tdb_json(other, "recover")
    assert recovered["marked_incomplete"] > 0
    after = tdb_json(other, "wal", "repair", "--salvage")

    assert database_state(other) == database_state(data_dir)
    assert after["corrupted_executions"] == alone["corrupted_executions"]
    assert {"execution_id": "exec-early", "missing_seqs": []} in alone["corrupted_executions"]
    lost = [(d["offset"], d["first_lost_lsn"], d["last_lost_lsn"]) for d in alone["damaged"]]
    assert lost == [(victim.offset, victim.lsn, victim.lsn)]
    assert [(d["offset"], d["first_lost_lsn"], d["last_lost_lsn"]) for d in after["damaged"]] == lost
    assert after["lost_records"] == alone["lost_records"] == 1
    assert after["kept_records"] == alone["kept_records"]
    for d in (data_dir, other):
        assert tdb(d, "verify").returncode == 0
        assert tdb_json(d, "inspect", "exec-early")["replayable_reason"] == "record_corrupted"


def test_a_backup_after_a_repair_keeps_the_lsn_gaps_and_the_evidence(recorded, tmp_path):
    """A repair that cut the log leaves LSN_GAPS (the log above the cut does not read without it)
    and `.broken` copies (what salvage reads): a backup carries both, so the restored directory
    opens, and salvages to the same state as the original."""
    data_dir, _durable = recorded("interleaved", 12, 3, 64 << 20)
    wal_dir = os.path.join(data_dir, "wal")
    recs = list(wal.read_records(wal_dir))
    victim = recs[len(recs) // 2]
    flip_bit(os.path.join(wal_dir, victim.segment), victim.offset + 30, 3)
    assert tdb_json(data_dir, "wal", "repair")["dropped_records"] > 0
    assert tdb(data_dir, "recover").returncode == 0
    kept = sorted(n for n in os.listdir(wal_dir) if n == "LSN_GAPS" or ".broken" in n)
    assert "LSN_GAPS" in kept and len(kept) >= 2

    backup, restored = str(tmp_path / "backup"), str(tmp_path / "restored")
    assert tdb(data_dir, "backup", backup).returncode == 0
    r = tdb(restored, "restore", backup)
    assert r.returncode == 0, r.stderr
    assert sorted(n for n in os.listdir(os.path.join(restored, "wal")) if n == "LSN_GAPS" or ".broken" in n) == kept
    r = tdb(restored, "recover")
    assert r.returncode == 0, r.stderr
    tdb_json(data_dir, "wal", "repair", "--salvage")
    tdb_json(restored, "wal", "repair", "--salvage")
    assert database_state(restored) == database_state(data_dir)
