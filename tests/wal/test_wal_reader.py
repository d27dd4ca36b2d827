"""The reader hands records over in lists: what a consumer sees when it stops early, when two
iterations share one reader, when reading fails half-way, and how far it reads ahead."""

from __future__ import annotations

import errno
import os
import tracemalloc

import pytest

import wal
from helpers import append_bytes, segment_paths, write_log


def test_reading_ahead_is_bounded_in_bytes_as_well_as_records(wal_dir):
    # 48 records of 1 MiB in one segment: a read-ahead of 512 records would hold all of them.
    with wal.Wal(wal_dir, segment_size_bytes=1 << 30) as w:
        w.append_many([bytes([i]) * (1 << 20) for i in range(48)])
    tracemalloc.start()
    try:
        total = 0
        for rec in wal.WalReader(wal_dir).records():
            total += len(rec.payload)  # the consumer keeps nothing
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == 48 << 20
    # One 8 MiB piece of the segment, its bytes copied, and a few records ahead.
    assert peak < 24 << 20, f"peak {peak >> 20} MiB while streaming 48 MiB"


def test_a_new_iteration_closes_one_left_suspended_and_starts_after_what_it_gave(wal_dir):
    with wal.Wal(wal_dir, segment_size_bytes=1 << 20) as w:
        for i in range(1, 11):
            w.append(b"p%d" % i)
        reader = wal.WalReader(wal_dir)
        first = reader.records(to_lsn=w.durable_lsn)
        taken = [next(first).lsn for _ in range(3)]
        for i in range(11, 16):
            w.append(b"p%d" % i)
        second = [r.lsn for r in reader.records(to_lsn=w.durable_lsn)]
        assert list(first) == []  # closed by the second call
        third = [r.lsn for r in reader.records(to_lsn=w.durable_lsn)]
    assert (taken, second, third) == ([1, 2, 3], list(range(4, 16)), [])
    assert reader.records_read == 15 and reader.last_lsn == 15


@pytest.mark.parametrize("chunk", [64, None], ids=["small pieces", "one piece"])
def test_records_before_damage_found_past_a_seal_are_given_before_the_error(wal_dir, monkeypatch, chunk):
    if chunk is not None:
        monkeypatch.setattr(wal.reader, "_CHUNK_BYTES", chunk)
    write_log(wal_dir, [b"p%d" % i for i in range(1, 13)], segment_size_bytes=100)
    segs = segment_paths(wal_dir)
    assert len(segs) >= 4
    reader = wal.WalReader(wal_dir)
    assert [r.lsn for r in reader.records(to_lsn=1)] == [1]
    first_segment_lsns = wal.list_segments(wal_dir)[1].first_lsn - 1
    os.unlink(segs[2])  # a gap in the segment numbers ...
    append_bytes(segs[0], b"\x00")  # ... found while checking the byte after the first SEAL
    got = []
    with pytest.raises(wal.WalCorruptionError):
        for rec in reader.records():
            got.append(rec.lsn)
    assert got == list(range(2, first_segment_lsns + 1))
    assert reader.records_read == first_segment_lsns and reader.last_lsn == first_segment_lsns


def test_records_checked_but_not_given_are_read_again_after_a_failed_read(wal_dir, monkeypatch):
    monkeypatch.setattr(wal.reader, "_CHUNK_BYTES", 64)
    payloads = [b"p%03d" % i for i in range(1, 31)]
    write_log(wal_dir, payloads, segment_size_bytes=1 << 20)
    (path,) = segment_paths(wal_dir)
    append_bytes(path, bytes(4096))  # preallocated space after the last record
    real = wal.reader._zeros_from
    calls = []

    def failing(path_, offset):
        calls.append(offset)
        raise OSError(errno.EIO, "injected read error")

    monkeypatch.setattr(wal.reader, "_zeros_from", failing)
    reader = wal.WalReader(wal_dir)
    got = []
    with pytest.raises(OSError):
        for rec in reader.records():
            got.append(rec.payload)
    assert calls, "the read error was never injected"
    monkeypatch.setattr(wal.reader, "_zeros_from", real)
    got += [rec.payload for rec in reader.records()]
    assert got == payloads
    assert reader.records_read == 30 and reader.last_lsn == 30 and not reader.damages


def test_a_reader_that_stopped_at_the_last_seal_goes_on_once_the_next_segment_exists(wal_dir):
    # The writer seals a segment, then creates the next one: a reader in between ends at the
    # SEAL with no successor, and its next call must go on into that successor, not report
    # the sealed segment as corrupt.
    write_log(wal_dir, [b"p%d" % i for i in range(1, 11)], segment_size_bytes=100)
    last = wal.list_segments(wal_dir)[-1]
    held = last.path + ".held"
    os.rename(last.path, held)
    reader = wal.WalReader(wal_dir)
    before = [r.lsn for r in reader.records()]
    assert before == list(range(1, last.first_lsn)) and reader.sealed_last
    assert [r.lsn for r in reader.records()] == [] and reader.sealed_last  # still no successor
    os.rename(held, last.path)
    assert [r.lsn for r in reader.records()] == list(range(last.first_lsn, 11))
    assert not reader.damages and reader.last_lsn == 10


def test_records_after_a_suspended_batches_iteration_neither_repeats_nor_skips(wal_dir):
    write_log(wal_dir, [b"p%d" % i for i in range(1, 21)], segment_size_bytes=1 << 20)
    reader = wal.WalReader(wal_dir)
    lists = reader.batches(4)
    first = [r.lsn for r in next(lists)]
    rest = [r.lsn for r in reader.records()]
    assert list(lists) == []  # closed by records()
    assert (first, rest) == ([1, 2, 3, 4], list(range(5, 21)))


@pytest.mark.parametrize("zeros", [1, 8, 16, 19])
def test_fewer_zero_bytes_than_a_header_at_the_end_are_the_end_of_the_data(tmp_path, zeros):
    # A preallocated segment is sealed once fewer than a header's worth of zeros would be left;
    # a writer stopped after acknowledging the group that filled it, before the SEAL, leaves
    # those zeros at the end of the file. Nothing acknowledged is torn: no damage, nothing cut.
    d = str(tmp_path / "wal")
    w = wal.open_wal(d, preallocate=False)
    for i in range(3):
        w.append(b"x" * (20 + i))
    w.close()
    with open(wal.list_segments(d)[-1].path, "ab") as f:
        f.write(bytes(zeros))
    report = wal.scan(d, mode="absolute")
    assert report.damages == [] and report.last_lsn == 3
    w = wal.open_wal(d, preallocate=False)
    assert w.open_result.truncated_bytes == 0 and w.open_result.torn_tail_offset is None
    assert w.append(b"after") == 4
    w.close()
    assert [r.payload for r in wal.read_records(d, mode="absolute")][-1] == b"after"
