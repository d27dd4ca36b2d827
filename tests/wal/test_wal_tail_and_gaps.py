"""The end of the log (wal/FORMAT.md, rule 4 and the kept torn tails) and the LSN gaps a repair
leaves, on real segment files written by the real writer."""

from __future__ import annotations

import os

import pytest

import wal
from faultfs import FaultFS, SimulatedCrash
from helpers import append_bytes, flip_bit, payload_for, put, read_all, read_bytes, record_spans, segment_paths, truncate, write_log
from wal import format as fmt


def test_a_flipped_bit_in_the_last_record_is_corruption_and_nothing_is_cut(wal_dir):
    write_log(wal_dir, [payload_for(i) for i in range(5)])
    (path,) = segment_paths(wal_dir)
    last = record_spans(path)[-1]
    flip_bit(path, last.offset + 24, 2)
    size = os.path.getsize(path)
    with pytest.raises(wal.WalCorruptionError) as e:
        wal.Wal(wal_dir)
    assert (e.value.path, e.value.offset) == (path, last.offset)
    assert "not a torn write" in e.value.found
    assert os.path.getsize(path) == size and sorted(os.listdir(wal_dir)) == [os.path.basename(path), "LOCK"]
    # The same damage read in salvage mode: the record is lost, not a torn tail.
    reader = wal.WalReader(wal_dir, mode="salvage")
    assert [r.lsn for r in reader.records()] == [1, 2, 3, 4]
    assert [(d.offset, d.torn_tail) for d in reader.damages] == [(last.offset, False)]


def test_a_record_torn_inside_a_sector_is_a_torn_tail_and_its_bytes_are_kept(wal_dir):
    """Whole by its length, but its last bytes zeros (a write torn inside a sector): a torn
    tail. It is cut on open, after its bytes were copied to `<segment>.tail-<offset>`."""
    write_log(wal_dir, [payload_for(i) for i in range(3)])
    (path,) = segment_paths(wal_dir)
    end = os.path.getsize(path)
    with open(path, "rb") as f:
        salt = fmt.decode_segment_header(f.read(fmt.SEGMENT_HEADER_SIZE)).salt
    rec = fmt.encode_record(fmt.salt_seed(salt), 4, fmt.TYPE_DATA, b"x" * 60)
    torn = rec[:50] + bytes(len(rec) - 50)
    append_bytes(path, torn)
    with wal.Wal(wal_dir) as w:
        assert (w.open_result.torn_tail_offset, w.open_result.truncated_bytes) == (end, len(torn))
        assert w.append(b"after") == 4  # nothing of the tail was acknowledged: its LSN is free
    kept = f"{path}.tail-{end}"
    assert read_bytes(kept)[fmt.SEGMENT_HEADER_SIZE:] == torn[:56]  # to its last non-zero byte, in 8-byte words
    salvaged = wal.salvage_tail(kept)
    assert salvaged.records == () and [(d.offset, d.first_lost_lsn) for d in salvaged.damages] == [(end, 4)]
    assert [r.payload for r in read_all(wal_dir, mode="absolute")][-1] == b"after"


def test_a_kept_tail_is_written_once_however_often_the_open_stops_before_the_cut(wal_dir):
    write_log(wal_dir, [payload_for(i) for i in range(3)])
    (path,) = segment_paths(wal_dir)
    end = os.path.getsize(path)
    append_bytes(path, b"\x07" * 40)
    crashes = []
    for crash_at in range(1, 50):  # stop the open at each of its calls in turn, then let it finish
        fs = FaultFS(wal_dir, crash_at=crash_at)
        try:
            w = wal.Wal(wal_dir, fs=fs)
        except SimulatedCrash as e:
            crashes.append(e.op.split()[1])
            if "ftruncate" not in crashes:
                assert os.path.getsize(path) == end + 40  # nothing cut before the copy is whole
            continue
        assert w.open_result.truncated_bytes in (0, 40)
        w.close()
        break
    assert {"write", "fsync", "rename", "fsync_dir"} <= set(crashes)
    assert os.path.getsize(path) == end
    assert [n for n in os.listdir(wal_dir) if ".tail-" in n] == [os.path.basename(path) + f".tail-{end}"]
    assert read_bytes(f"{path}.tail-{end}")[fmt.SEGMENT_HEADER_SIZE:] == b"\x07" * 40


def test_a_repair_whose_gap_was_recorded_before_a_crash_is_finished_by_the_next_open(wal_dir):
    """A repair records the gap first, then seals and starts the next segment: stopped in
    between, the next writer continues at the recorded LSN all the same."""
    write_log(wal_dir, [payload_for(i) for i in range(30)], segment_size_bytes=160)
    segs = wal.list_segments(wal_dir)
    victim = record_spans(segs[1].path)[0]
    put(segs[1].path, victim.offset + 25, b"\xff")
    fs = FaultFS(wal_dir, crash_at=None)
    result = wal.repair(wal_dir, fs=fs)
    assert result.continues_at == 31
    gap_write = next(i for i, (k, d) in enumerate(fs.ops) if k == "rename" and "LSN_GAPS" in d)
    # Undo what followed the gap's record: the SEAL and the new segment.
    new = wal.list_segments(wal_dir)[-1]
    os.remove(new.path)
    truncate(segs[1].path, victim.offset)
    assert gap_write < len(fs.ops)
    with wal.Wal(wal_dir, segment_size_bytes=160) as w:
        assert w.append(b"after") == 31
    assert [r.lsn for r in read_all(wal_dir, mode="absolute")] == [*range(1, victim.lsn), 31]
    # A gap nobody recorded is still corruption.
    os.remove(os.path.join(wal_dir, "LSN_GAPS"))
    with pytest.raises(wal.WalCorruptionError):
        read_all(wal_dir)
