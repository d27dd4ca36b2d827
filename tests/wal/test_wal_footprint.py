"""The WAL's footprint on disk: preallocated zeros follow the recording rate and the configured
segment size (wal/FORMAT.md, "Preallocation"); a log that records little holds little more than
what it wrote.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest

import wal
from wal import format as fmt
from wal import writer as wal_writer
from wal.spares import SPARE_FILE
from helpers import record_spans
from tests.conftest import FakeClock

SEAL_BYTES = fmt.RECORD_HEADER_SIZE + 16 + (-(fmt.RECORD_HEADER_SIZE + 16) % 8)
MIB = 1 << 20


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock(1000.0, per_second=1)  # the writer's monotonic clock, in seconds
    monkeypatch.setattr(wal_writer, "_monotonic", c)
    return c


def disk_bytes(d: str) -> int:
    """Bytes the directory's files take on disk (allocated blocks, not apparent sizes)."""
    return sum(os.stat(os.path.join(d, n)).st_blocks * 512 for n in os.listdir(d))


def file_bytes(d: str, *, skip=("LOCK",)) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n not in skip)


def record_bytes(payload_len: int) -> int:
    return fmt.RECORD_HEADER_SIZE + payload_len + (-(fmt.RECORD_HEADER_SIZE + payload_len) % 8)


def test_a_log_with_a_few_records_holds_what_it_wrote_and_no_zeros(tmp_path):
    d = str(tmp_path / "wal")
    payload = b"e" * 200
    with wal.Wal(d, preallocate=True) as w:  # the recorder's settings: 64 MiB segments
        for _ in range(100):
            w.append(payload)
        written = fmt.SEGMENT_HEADER_SIZE + 100 * record_bytes(len(payload))
        assert file_bytes(d) == written
        assert disk_bytes(d) <= written + 3 * 4096  # the segment, LOCK, block rounding
        assert not os.path.exists(os.path.join(d, SPARE_FILE))
    assert file_bytes(d) == written


def test_a_slow_recorder_keeps_small_segments_and_at_most_one_small_spare(tmp_path, clock):
    """8 MiB recorded at about 100 KB/s (a clock moved by hand): segments and spares stay at
    the smallest size, and the zeros on disk never exceed two of them."""
    d = str(tmp_path / "wal")
    payload = b"s" * 1000
    batch = [payload] * 100  # ~100 KB per call, one call per simulated second
    written = 0
    with wal.Wal(d, preallocate=True) as w:
        for _ in range(80):
            clock.now += 1.0
            w.append_many(batch)
            written += len(batch) * record_bytes(len(payload))
            if w._spare_asked:
                assert w._spare_event.wait(30)  # a spare asked for is made before the next call
            segs = wal.list_segments(d)
            holding = file_bytes(d)
            data = written + len(segs) * (fmt.SEGMENT_HEADER_SIZE + SEAL_BYTES)
            # Zeros: the open segment's and the spare's, at most 1 MiB each.
            assert holding <= data + 2 * MIB, (holding, data)
            for s in segs:
                assert os.path.getsize(s.path) <= MIB + len(batch) * record_bytes(len(payload)) + SEAL_BYTES
        spare = os.path.join(d, SPARE_FILE)
        assert not os.path.exists(spare) or os.path.getsize(spare) == MIB
        assert len(wal.list_segments(d)) >= 5, "segments of 1 MiB, not 64"
    assert not os.path.exists(spare), "closing removes the unused spare"
    assert [r.lsn for r in wal.read_records(d, mode="absolute")] == list(range(1, 8001))


@contextmanager
def _spared_at_1_mb_s(d: str, clock, size: int):
    """A preallocating WAL in `d` that took 530 KB (past the 512 KiB a plain segment waits for)
    in half a second: 1 MB/s, so its spare is 2 MB for 2 seconds, rounded up to 4 MiB."""
    with wal.Wal(d, segment_size_bytes=size, preallocate=True) as w:
        clock.now += 0.5
        w.append_many([b"f" * 4000] * 132)
        assert w._spare_event.wait(30)
        yield w


def test_spares_are_sized_by_the_fill_rate_up_to_the_segment_size(tmp_path, clock):
    size = 8 * MIB
    d = str(tmp_path / "wal")
    with _spared_at_1_mb_s(d, clock, size) as w:
        spare = os.path.join(d, SPARE_FILE)
        assert os.path.getsize(spare) == 4 * MIB
        # The plain first segment is left for it after the next group (the rotation ends before
        # the group after it is written). At half of it (2 MiB, in no time: measured over 0.25 s,
        # 8 MiB/s) the next spare is asked for, and would be 16 MiB: it is capped.
        w.append(b"x")
        w.append(b"y")
        assert os.path.getsize(wal.list_segments(d)[-1].path) == 4 * MIB
        w.append_many([b"f" * 4000] * 530)
        assert w._spare_event.wait(30)
        assert os.path.getsize(spare) == size
        # Everything on disk within the configured size, but for the data of one group.
        for s in wal.list_segments(d):
            assert os.path.getsize(s.path) <= size
    assert wal.scan(d, mode="absolute").damages == []


def test_a_slower_rate_shrinks_the_next_spare(tmp_path, clock):
    d = str(tmp_path / "wal")
    with _spared_at_1_mb_s(d, clock, 8 * MIB) as w:
        w.append(b"x")
        w.append(b"y")  # in the 4 MiB spare
        assert os.path.getsize(wal.list_segments(d)[-1].path) == 4 * MIB
        clock.now += 600.0  # 2 MiB over ten minutes: the smallest spare
        w.append_many([b"f" * 4000] * 530)
        assert w._spare_event.wait(30)
        assert os.path.getsize(os.path.join(d, SPARE_FILE)) == MIB


def test_no_spare_is_made_before_the_open_segment_is_half_full(tmp_path):
    size = 8192
    d = str(tmp_path / "wal")
    spare = os.path.join(d, SPARE_FILE)
    payload = b"h" * 100  # 120 bytes a record
    one = record_bytes(len(payload))
    with wal.Wal(d, segment_size_bytes=size, preallocate=True, preallocate_after_bytes=0) as w:
        assert w._spare_event.wait(30)
        w.append(payload)  # the plain first segment is left for the spare after this group
        w.append(payload)
        assert not os.path.exists(spare)
        assert os.path.getsize(wal.list_segments(d)[-1].path) == size
        while not w._spare_asked:
            assert not os.path.exists(spare) and not w._spare_event.is_set()
            w.append(payload)
        assert size // 2 - fmt.RECORD_HEADER_SIZE <= w._segment_bytes < size // 2 + one
        assert w._spare_event.wait(30) and os.path.getsize(spare) == size


@pytest.mark.parametrize("payload_len", range(60, 124, 4))
def test_segment_files_never_exceed_the_segment_size_by_more_than_one_record(tmp_path, payload_len):
    """One record at a time, through preallocated segments: every segment file ends within one
    record (and the SEAL) of the configured size, no spare is larger than it, and however the
    last record falls against the end of the zeros, the log reads back with no damage."""
    size = 2048
    d = str(tmp_path / "wal")
    one = record_bytes(payload_len)
    payloads = [bytes([65 + i % 26]) * payload_len for i in range(120)]
    with wal.Wal(d, segment_size_bytes=size, preallocate=True, preallocate_after_bytes=0) as w:
        assert w._spare_event.wait(30)
        for i, p in enumerate(payloads):
            w.append(p)
            if i % 3 and w._spare_asked:
                assert w._spare_event.wait(30)  # else the next segment may be a plain one
            for name in os.listdir(d):
                if name.endswith(".wal") or name == SPARE_FILE:
                    try:
                        got = os.path.getsize(os.path.join(d, name))
                    except FileNotFoundError:  # the spare, taken or replaced by the background thread
                        assert name == SPARE_FILE
                        continue
                    assert got <= size + one + SEAL_BYTES, name
            assert wal.scan(d, mode="absolute").damages == []
        segs = wal.list_segments(d)
        assert len(segs) >= 4
        for s in segs[:-1]:
            spans = record_spans(s.path)
            assert spans[-1].rtype == fmt.TYPE_SEAL and spans[-1].end == os.path.getsize(s.path)
    assert [r.payload for r in wal.read_records(d, mode="absolute")] == payloads
    with wal.Wal(d, segment_size_bytes=size, preallocate=True) as w:  # reopened in the zeros
        assert w.open_result.truncated_bytes == 0
        w.append_many(payloads[:30])
    assert [r.payload for r in wal.read_records(d, mode="absolute")] == payloads + payloads[:30]


def test_a_group_crossing_the_bound_is_the_only_overshoot(tmp_path):
    """A segment exceeds its bound by at most the group that crossed it, and its SEAL."""
    size = 4096
    d = str(tmp_path / "wal")
    group = [b"g" * 200] * 30  # 6,600 bytes in one group
    with wal.Wal(d, segment_size_bytes=size, preallocate=True, preallocate_after_bytes=0) as w:
        assert w._spare_event.wait(30)
        w.append(b"first")  # the plain first segment is left for the spare after this group
        w.append_many([b"a" * 200] * 10)
        w.append_many(group)
        w.append(b"last")  # the rotation ends before this group is written
        sealed = wal.list_segments(d)[-2]
        assert size < os.path.getsize(sealed.path) <= size + len(group) * record_bytes(200) + SEAL_BYTES
    assert wal.scan(d, mode="absolute").damages == []
