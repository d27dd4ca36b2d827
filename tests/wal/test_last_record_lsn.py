"""`wal.last_record_lsn`: the log's last LSN read back from the end of its last segment, or None
whenever the end does not prove it (then a reader reads forward, as before)."""

from __future__ import annotations

import os

import pytest

import wal
from wal import format as fmt
from helpers import append_bytes, flip_bit, payload_for, read_all, record_spans, segment_paths, truncate, write_log


@pytest.mark.parametrize("count", [1, 2, 7, 40, 300])
@pytest.mark.parametrize("segment_size_bytes", [256, 4096, 1 << 20])
def test_it_is_the_last_lsn_a_forward_read_finds(tmp_path, count, segment_size_bytes):
    lsns = write_log(tmp_path, [payload_for(i) for i in range(count)], segment_size_bytes=segment_size_bytes)
    assert wal.last_record_lsn(str(tmp_path)) == lsns[-1] == read_all(tmp_path)[-1].lsn


def test_payloads_that_end_in_zero_bytes_and_every_padding(tmp_path):
    payloads = [b"a" * n + b"\x00" * z for n in range(1, 9) for z in (0, 1, 5, 8)]
    for i in range(1, len(payloads) + 1):
        d = tmp_path / f"log{i}"
        lsns = write_log(d, payloads[:i], segment_size_bytes=1 << 20)
        assert wal.last_record_lsn(str(d)) == lsns[-1], payloads[i - 1]


def test_a_preallocated_segment_reads_back_over_its_zeros(tmp_path):
    """A preallocated segment is zero-filled past its data (the writer renames a zeroed spare
    in): the end of the data is found through megabytes of zeros."""
    lsns = write_log(tmp_path, [payload_for(i) for i in range(50)], segment_size_bytes=64 << 20)
    seg = segment_paths(tmp_path)[-1]
    os.truncate(seg, 8 << 20)
    assert wal.last_record_lsn(str(tmp_path)) == lsns[-1]
    assert read_all(tmp_path)[-1].lsn == lsns[-1]


def test_a_sealed_last_segment_answers_the_lsn_it_seals(tmp_path):
    lsns = write_log(tmp_path, [payload_for(i) for i in range(5)], segment_size_bytes=1 << 20)
    seg = segment_paths(tmp_path)[-1]
    with open(seg, "rb") as f:
        seed = fmt.salt_seed(fmt.decode_segment_header(f.read(fmt.SEGMENT_HEADER_SIZE)).salt)
    append_bytes(seg, fmt.encode_seal(seed, lsns[-1], 5))  # its payload ends in seven zero bytes
    assert record_spans(seg)[-1].rtype == fmt.TYPE_SEAL
    assert wal.last_record_lsn(str(tmp_path)) == lsns[-1]


def test_a_torn_or_damaged_end_is_not_answered(tmp_path):
    write_log(tmp_path, [payload_for(i) for i in range(20)], segment_size_bytes=1 << 20)
    seg = segment_paths(tmp_path)[-1]
    spans = record_spans(seg)
    # A partly written group after the last record: garbage the end does not vouch for.
    append_bytes(seg, b"\x01" * 13)
    assert wal.last_record_lsn(str(tmp_path)) is None
    truncate(seg, spans[-1].end)
    assert wal.last_record_lsn(str(tmp_path)) == spans[-1].lsn
    # The last record cut short, or one bit of it flipped.
    truncate(seg, spans[-1].end - 3)
    assert wal.last_record_lsn(str(tmp_path)) is None
    truncate(seg, spans[-2].end)
    flip_bit(seg, spans[-2].offset + fmt.RECORD_HEADER_SIZE)
    assert wal.last_record_lsn(str(tmp_path)) is None


def test_no_answer_without_a_segment_or_with_a_bad_header(tmp_path):
    assert wal.last_record_lsn(str(tmp_path)) is None
    write_log(tmp_path, [payload_for(1)], segment_size_bytes=1 << 20)
    flip_bit(segment_paths(tmp_path)[-1], 20)
    assert wal.last_record_lsn(str(tmp_path)) is None


def test_a_last_record_longer_than_the_window_is_not_answered(tmp_path):
    lsns = write_log(tmp_path, [b"x" * 5000], segment_size_bytes=1 << 20)
    assert wal.last_record_lsn(str(tmp_path), window_bytes=1024) is None
    assert wal.last_record_lsn(str(tmp_path)) == lsns[-1]
