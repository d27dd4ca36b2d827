"""The log's files and directories: private whatever the umask, a new directory durable in its
parent, and a sealed segment with a damaged SEAL kept rather than deleted as applied."""

from __future__ import annotations

import os
import random
import stat
import subprocess
import sys

import pytest

import wal
from faultfs import FaultFS
from helpers import flip_bit, read_all, read_bytes, record_spans, write_log

HERE = os.path.dirname(os.path.abspath(__file__))

# Every kind of file the log writes: segments made plain and from spares, their SEALs, APPLIED,
# LOCK, a torn tail kept when the log opens, and a repair's .broken copies and LSN_GAPS.
_EVERY_FILE = r"""
import os, sys
sys.path.insert(0, sys.argv[2])
import wal
from helpers import append_bytes, flip_bit, record_spans

d = sys.argv[1]
with wal.Wal(d, segment_size_bytes=4096, preallocate=True, preallocate_after_bytes=0) as w:
    assert w._spare_event.wait(30), "no spare made"
    for i in range(200):
        w.append(b"secret prompt %d " % i + b"x" * 100)
    w.mark_applied(40)
segs = wal.list_segments(d)
append_bytes(segs[-1].path, b"\x01" * 30)  # a torn tail: kept when the log opens
with wal.Wal(d, segment_size_bytes=4096) as w:
    w.append(b"after the tail")
segs = wal.list_segments(d)
span = record_spans(segs[-3].path)[2]
flip_bit(segs[-3].path, span.offset + 30)
result = wal.repair(d)
assert result.broken_copies and result.continues_at, result
print(oct(os.umask(0)))
"""


def _modes(root: str) -> dict[str, int]:
    out = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(base, name)
            out[os.path.relpath(path, root)] = os.lstat(path).st_mode
    return out


@pytest.mark.parametrize("umask", [0o000, 0o022], ids=["umask000", "umask022"])
def test_every_file_and_directory_the_log_makes_is_private_whatever_the_umask(tmp_path, umask):
    d = str(tmp_path / "a" / "b" / "wal")
    out = subprocess.run(
        ["sh", "-c", f'umask {umask:03o}; exec "$0" -c "$1" "$2" "$3"', sys.executable, _EVERY_FILE, d, HERE],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [oct(umask)], "the log changed the process's umask"
    modes = _modes(str(tmp_path / "a"))
    names = set(modes)
    assert any(n.endswith(".wal.broken") for n in names) and any(".tail-" in n for n in names), names
    assert {"b", "b/wal", "b/wal/LOCK", "b/wal/APPLIED", "b/wal/LSN_GAPS"} <= names
    wrong = {n: oct(m) for n, m in modes.items() if not (
        (stat.S_ISDIR(m) and stat.S_IMODE(m) == 0o700) or (stat.S_ISREG(m) and stat.S_IMODE(m) == 0o600)
    )}
    assert not wrong, f"not private: {wrong}"
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700


def test_a_new_log_directory_is_durable_once_a_record_is_acknowledged(tmp_path):
    """Power is cut after appends were acknowledged in a log whose directory the writer made.
    Unless the writer fsynced the directory's parent, the directory entry, and with it every
    record, may be gone."""
    d = str(tmp_path / "wal")
    fs = FaultFS(d, create=False)
    with wal.Wal(d, fs=fs, segment_size_bytes=256) as w:
        lsns = [w.append(b"acknowledged %d" % i) for i in range(12)]
    how = fs.materialize_crash(random.Random(1), dir_mode="undo", data_mode="drop")
    assert os.path.isdir(d), how
    with wal.Wal(d, segment_size_bytes=256):
        pass
    assert [r.lsn for r in read_all(d)] == lsns, how


def test_each_new_directory_level_is_fsynced_into_its_parent_before_the_next(tmp_path):
    d = str(tmp_path / "x" / "y" / "wal")
    fs = FaultFS(d, create=False)
    with wal.Wal(d, fs=fs):
        pass
    made = [(k, name) for k, name in fs.ops if k in ("mkdir", "fsync_dir")][:6]
    assert made == [
        ("mkdir", "x"), ("fsync_dir", tmp_path.name), ("mkdir", "y"), ("fsync_dir", "x"),
        ("mkdir", "wal"), ("fsync_dir", "y"),
    ]
    # An existing directory is neither made nor synced again, and keeps its mode.
    os.chmod(d, 0o750)
    fs = FaultFS(d)
    with wal.Wal(d, fs=fs):
        pass
    assert not [op for op in fs.ops if op[0] == "mkdir"]
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o750



def test_reopening_a_log_makes_the_files_it_goes_on_writing_private(wal_dir):
    """A log an older version wrote (0644): the segment appended to from now on and LOCK become
    0600; sealed segments, never written again and deleted once applied, keep their mode."""
    write_log(wal_dir, [b"old %d" % i for i in range(30)], segment_size_bytes=256)
    segs = wal.list_segments(wal_dir)
    for path in [s.path for s in segs] + [os.path.join(wal_dir, "LOCK")]:
        os.chmod(path, 0o644)
    with wal.Wal(wal_dir, segment_size_bytes=256) as w:
        w.append(b"new")
    mode = lambda path: stat.S_IMODE(os.stat(path).st_mode)  # noqa: E731
    assert mode(segs[-1].path) == 0o600 and mode(os.path.join(wal_dir, "LOCK")) == 0o600
    assert {mode(s.path) for s in segs[:-1]} == {0o644}


def test_a_sealed_segment_with_a_damaged_seal_is_moved_aside_not_deleted_as_applied(wal_dir, caplog):
    """Its records all read back (a reader hands them over before it reaches the SEAL), so the
    consumer applies them and marks them applied; the damage must not go with the segment."""
    write_log(wal_dir, [b"record %d" % i + b"y" * 40 for i in range(40)], segment_size_bytes=512)
    segs = wal.list_segments(wal_dir)
    assert len(segs) >= 4
    victim, intact = segs[1], segs[0]
    seal = record_spans(victim.path)[-1]
    flip_bit(victim.path, seal.offset + 9)  # the SEAL's LSN field
    damaged = read_bytes(victim.path)
    with wal.Wal(wal_dir, segment_size_bytes=512) as w:
        deleted = w.mark_applied(segs[2].first_lsn)
    assert deleted == 2
    assert not os.path.exists(intact.path) and not os.path.exists(intact.path + ".broken")
    assert not os.path.exists(victim.path)
    assert read_bytes(victim.path + ".broken") == damaged
    assert [r.levelname for r in caplog.records if victim.name in r.getMessage()] == ["ERROR"]
    # What is left of the log reads on from the next segment.
    assert [r.lsn for r in read_all(wal_dir, from_lsn=segs[2].first_lsn)][0] == segs[2].first_lsn
