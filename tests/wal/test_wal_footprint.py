"""The WAL's footprint on disk: preallocated zeros follow the configured segment size
(wal/FORMAT.md, "Preallocation"); a log that records little holds little more than what it wrote.
"""

from __future__ import annotations

import os

import pytest

import wal
from wal import format as fmt
from wal.spares import SPARE_FILE
from helpers import record_spans

SEAL_BYTES = fmt.RECORD_HEADER_SIZE + 16 + (-(fmt.RECORD_HEADER_SIZE + 16) % 8)
MIB = 1 << 20


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
            if i % 3:
                assert w._spare_event.wait(30)  # else the next segment may be a plain one
            for name in os.listdir(d):
                if name.endswith(".wal") or name == SPARE_FILE:
                    assert os.path.getsize(os.path.join(d, name)) <= size + one + SEAL_BYTES, name
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
