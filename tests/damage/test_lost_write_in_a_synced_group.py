"""A zeroed sector inside a group that a later group followed on disk: those bytes were synced
(acknowledged) before the later group was written, so it is corruption, never a torn tail to cut.

An embedded store on one thread makes every event its own group, fdatasynced and acknowledged
before the next; the process exits without closing, and one 512-byte sector in the middle of
the log is zeroed. `recover` and `serve` used to cut everything from there on as a torn tail
(kept in a `.tail-` file, out of the store until a salvage)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import orjson
import pytest

import wal
from tests.damage.test_last_record_and_lsn_gaps import REPO, database_state, tdb, tdb_json

pytestmark = pytest.mark.timeout(300)

WRITER = """
import os, sys
import tracedb
store = tracedb.open(sys.argv[1], config={"compact_interval_ms": 0})
for i in range(20):
    ex = store.start("Bulk", {"i": i}, f"exec-{i:05d}")
    for j in range(4):
        ex.event("tool.step", {"i": i, "j": j, "pad": "p" * 1200})
    ex.finish({"status": "success", "i": i})
os._exit(0)
"""


def write_and_exit(data_dir: str) -> None:
    done = subprocess.run([sys.executable, "-c", WRITER, data_dir], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def sector_inside_an_event(wal_dir: str, from_lsn: int) -> tuple[wal.Record, int]:
    """The first event record from `from_lsn` on with a whole 512-byte sector inside it, and
    that sector's offset."""
    for rec in wal.read_records(wal_dir, from_lsn=from_lsn):
        start = -(-(rec.offset + 20) // 512) * 512
        if rec.payload[:1] == b"\x01" and start + 512 <= rec.offset + 20 + len(rec.payload):
            return rec, start
    raise AssertionError("no record holds a whole sector")


def test_a_zeroed_sector_before_later_groups_fails_closed_and_salvage_keeps_the_rest(tmp_path):
    data_dir = str(tmp_path / "data")
    write_and_exit(data_dir)
    wal_dir = os.path.join(data_dir, "wal")
    pristine = str(tmp_path / "pristine")
    shutil.copytree(data_dir, pristine)
    victim, sector = sector_inside_an_event(wal_dir, from_lsn=25)  # in exec-00004, of 20
    seg = os.path.join(wal_dir, victim.segment)
    with open(seg, "r+b") as f:
        f.seek(sector)
        f.write(bytes(512))
    with open(seg, "rb") as f:
        damaged = f.read()

    where = f"CORRUPTION: {victim.segment} at {victim.offset}:"
    scanned = tdb(data_dir, "wal", "scan")
    assert scanned.returncode == 4 and where in scanned.stdout + scanned.stderr, scanned
    for args in (("recover",), ("serve",)):
        r = tdb(data_dir, *args)
        assert r.returncode == 4, (args, r.returncode, r.stdout, r.stderr)
        assert f"{seg} at offset {victim.offset}" in r.stderr and "later group" in r.stderr
    with open(seg, "rb") as f:
        assert f.read() == damaged  # nothing cut
    assert not [n for n in os.listdir(wal_dir) if ".tail-" in n]

    done = tdb_json(data_dir, "wal", "repair", "--salvage")
    assert [(d["offset"], d["first_lost_lsn"], d["last_lost_lsn"], d["torn_tail"]) for d in done["damaged"]] == [
        (victim.offset, victim.lsn, victim.lsn, False)
    ]
    assert tdb(pristine, "recover").returncode == 0
    lost = tuple(orjson.loads(victim.payload[1 : victim.payload.index(b"\n")])[:2])  # (execution, seq)
    kept = database_state(data_dir)["steps"]
    assert [s for s in database_state(pristine)["steps"] if tuple(s[:2]) != lost] == kept
    assert len({s[0] for s in kept}) == 20
    assert tdb(data_dir, "verify").returncode == 0
