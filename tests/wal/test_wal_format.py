"""Framing: segment headers, records, CRCs, padding, salt, LSN chain, SEAL, limits, file names."""

from __future__ import annotations

import os
import struct

import pytest

import wal
from wal import format as fmt
from helpers import (
    append_bytes,
    build_segment,
    data_records,
    fix_header_crc,
    fix_record_crc,
    flip_bit,
    put,
    put_u32,
    put_u64,
    read_all,
    read_bytes,
    record_spans,
    segment_paths,
    shrink_length,
    write_log,
)
from faultfs import FaultFS


# -- segment header ------------------------------------------------------------------------
def test_segment_header_round_trips():
    raw = fmt.encode_segment_header(0xDEADBEEF, 7, 1234567)
    assert len(raw) == fmt.SEGMENT_HEADER_SIZE == 40
    assert raw[:8] == b"TDBWAL\x00\x01"
    assert fmt.decode_segment_header(raw) == fmt.SegmentHeader(0xDEADBEEF, 7, 1234567)


def test_segment_header_fields_sit_at_their_documented_offsets():
    raw = fmt.encode_segment_header(0x01020304, 9, 77)
    assert struct.unpack_from("<H", raw, 8) == (1,)
    assert struct.unpack_from("<H", raw, 10) == (0,)
    assert struct.unpack_from("<I", raw, 12) == (0x01020304,)
    assert struct.unpack_from("<Q", raw, 16) == (9,)
    assert struct.unpack_from("<Q", raw, 24) == (77,)
    assert struct.unpack_from("<I", raw, 32) == (0,)
    assert struct.unpack_from("<I", raw, 36) == (fmt.mask(fmt.crc32c(raw[:36])),)


@pytest.mark.parametrize("size", [0, 1, 20, 39])
def test_segment_header_shorter_than_40_bytes_is_rejected(size):
    raw = fmt.encode_segment_header(1, 1, 1)[:size]
    assert fmt.decode_segment_header(raw) == f"a 40-byte segment header, found {size} bytes"


def test_every_bit_flip_in_a_segment_header_is_rejected():
    raw = fmt.encode_segment_header(0xCAFEF00D, 3, 1000)
    for bit in range(len(raw) * 8):
        bad = bytearray(raw)
        bad[bit // 8] ^= 1 << (bit % 8)
        assert isinstance(fmt.decode_segment_header(bytes(bad)), str), f"bit {bit} not detected"


def _with_fixed_crc(raw: bytes, offset: int, value: bytes) -> bytes:
    body = bytearray(raw[:36])
    body[offset : offset + len(value)] = value
    return bytes(body) + struct.pack("<I", fmt.mask(fmt.crc32c(bytes(body))))


@pytest.mark.parametrize(
    "offset, value, complaint",
    [
        (0, b"TDBWAL\x00\x02", "magic"),
        (0, b"XXXXXXXX", "magic"),
        (8, struct.pack("<H", 2), "format version 1, found 2"),
        (10, struct.pack("<H", 1), "zero reserved"),
        (32, struct.pack("<I", 1), "zero reserved"),
    ],
)
def test_segment_header_with_a_valid_crc_but_a_wrong_field_is_rejected(offset, value, complaint):
    raw = _with_fixed_crc(fmt.encode_segment_header(5, 1, 1), offset, value)
    got = fmt.decode_segment_header(raw)
    assert isinstance(got, str) and complaint in got


def test_segment_header_with_a_bad_crc_is_rejected():
    raw = bytearray(fmt.encode_segment_header(5, 1, 1))
    raw[36] ^= 0xFF
    assert fmt.decode_segment_header(bytes(raw)) == "a segment header with a valid CRC"


def test_damaged_header_of_the_last_segment_is_corruption_not_a_torn_tail(wal_dir):
    write_log(wal_dir, [b"a", b"b"])
    (path,) = segment_paths(wal_dir)
    flip_bit(path, 20)
    with pytest.raises(wal.WalCorruptionError) as e:
        read_all(wal_dir)
    assert e.value.path == path and e.value.offset == 0
    before = read_bytes(path)
    with pytest.raises(wal.WalCorruptionError):
        wal.Wal(wal_dir)
    assert read_bytes(path) == before, "opening the writer changed a corrupt segment"
    # point_in_time reports it and returns nothing, without raising
    reader = wal.WalReader(wal_dir, mode="point_in_time")
    assert list(reader.records()) == []
    assert [(d.path, d.offset, d.torn_tail) for d in reader.damages] == [(path, 0, False)]


def test_segment_header_that_disagrees_with_its_file_name_is_corruption(wal_dir):
    write_log(wal_dir, [b"a", b"b"])
    (path,) = segment_paths(wal_dir)
    put_u64(path, 16, 2)  # the header of segment file 1 claims segment number 2
    fix_header_crc(path)
    with pytest.raises(wal.WalCorruptionError) as e:
        read_all(wal_dir)
    assert (e.value.path, e.value.offset) == (path, 0)
    assert e.value.expected == "header for segment 1 first LSN 1"
    assert e.value.found.startswith("segment 2 first LSN 1")


# -- records -------------------------------------------------------------------------------
def test_crc32c_is_castagnoli_and_the_mask_round_trips():
    assert fmt.crc32c(b"123456789") == 0xE3069283
    for crc in (0, 1, 0xE3069283, 0xFFFFFFFF, 0x80000000, 12345):
        assert fmt.unmask(fmt.mask(crc)) == crc
        assert fmt.mask(crc) != crc
    c = fmt.crc32c(b"payload")
    assert fmt.mask(c) == ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def test_record_fields_sit_at_their_documented_offsets():
    seed = fmt.salt_seed(0x11223344)
    rec = fmt.encode_record(seed, 42, fmt.TYPE_DATA, b"hello")
    crc, n, lsn, rtype, pad, reserved = struct.unpack_from("<IIQBBH", rec)
    assert (n, lsn, rtype, pad, reserved) == (5, 42, fmt.TYPE_DATA, 7, 0)
    assert rec[20:25] == b"hello" and rec[25:] == bytes(7) and len(rec) == 32
    expected = fmt.crc32c(struct.pack("<I", 0x11223344) + rec[4:20] + b"hello")
    assert fmt.unmask(crc) == expected


@pytest.mark.parametrize("n", range(0, 17))
def test_padding_aligns_every_record_to_8_bytes(n):
    rec = fmt.encode_record(fmt.salt_seed(1), 1, fmt.TYPE_DATA, b"z" * n)
    assert len(rec) % 8 == 0
    assert len(rec) - 20 - n == fmt.padding_for(n) == rec[17] <= 7
    assert rec[20 + n :] == bytes(fmt.padding_for(n))


def test_records_of_a_written_log_start_on_8_byte_boundaries_and_round_trip(wal_dir):
    payloads = [b"", b"a", b"\x00" * 7, os.urandom(100), b"\xff" * 4, b"json" * 33]
    lsns = write_log(wal_dir, payloads, segment_size_bytes=1 << 20)
    assert lsns == list(range(1, len(payloads) + 1))
    recs = read_all(wal_dir)
    assert [(r.lsn, r.payload) for r in recs] == list(zip(lsns, payloads))
    assert all(r.offset % 8 == 0 for r in recs)
    assert recs[0].offset == 40


def _one_segment_log(wal_dir, payloads, *, then=()):
    """Segment 1 with `payloads` at LSN 1.., followed by DATA records `then` (valid)."""
    os.makedirs(wal_dir, exist_ok=True)
    return build_segment(wal_dir, 1, 1, data_records(1, list(payloads) + list(then)))


def _damage_of(wal_dir, mode="point_in_time"):
    reader = wal.WalReader(wal_dir, mode=mode)
    recs = list(reader.records())
    return recs, reader.damages


def _second_header_changed(wal_dir, at: int, data: bytes):
    """Records abc, def and later, the second's header changed at byte `at` to `data`, its CRC
    made to match: the read stops after abc. The second's span, and the damages found."""
    path = _one_segment_log(wal_dir, [b"abc", b"def"], then=[b"later"])
    second = record_spans(path)[1]
    put(path, second.offset + at, data)
    fix_record_crc(path, second.offset)
    recs, damages = _damage_of(wal_dir)
    assert [r.payload for r in recs] == [b"abc"]
    return second, damages


def test_nonzero_padding_is_damage(wal_dir):
    path = _one_segment_log(wal_dir, [b"abc", b"defgh"], then=[b"later"])
    second = record_spans(path)[1]
    put(path, second.end - 1, b"\x01")
    recs, damages = _damage_of(wal_dir)
    assert [r.payload for r in recs] == [b"abc"]
    assert damages[0].offset == second.offset and damages[0].expected == "zero padding"
    with pytest.raises(wal.WalCorruptionError, match="zero padding"):
        read_all(wal_dir)


def test_nonzero_reserved_bytes_are_damage_even_with_a_valid_crc(wal_dir):
    _, damages = _second_header_changed(wal_dir, 18, b"\x02\x00")  # 1 is the group-start flag
    assert "zero reserved" in damages[0].expected


def test_a_padding_length_that_does_not_align_is_damage(wal_dir):
    second, damages = _second_header_changed(wal_dir, 17, b"\x02")
    assert damages[0].offset == second.offset


def test_a_record_of_type_zero_is_damage(wal_dir):
    _, damages = _second_header_changed(wal_dir, 16, b"\x00")
    assert damages[0].expected == "record type 1 or 2, found 0"


def test_zero_filled_space_at_the_end_of_the_last_segment_is_preallocated_space(wal_dir):
    # Zeros to the end of the file are where the writer has not written yet (FORMAT.md,
    # "Preallocation"): the end of the data, not damage; the writer keeps and writes over them.
    write_log(wal_dir, [b"one", b"two"])
    (path,) = segment_paths(wal_dir)
    append_bytes(path, bytes(4096))
    size = os.path.getsize(path)
    assert [r.payload for r in read_all(wal_dir)] == [b"one", b"two"]
    assert wal.scan(wal_dir).damages == []
    with wal.Wal(wal_dir) as w:
        assert w.open_result.truncated_bytes == 0
        assert w.append(b"three") == 3
    assert os.path.getsize(path) == size
    assert [r.payload for r in read_all(wal_dir)] == [b"one", b"two", b"three"]


def test_garbage_before_preallocated_zeros_is_a_torn_tail_and_is_cut(wal_dir):
    write_log(wal_dir, [b"one", b"two"])
    (path,) = segment_paths(wal_dir)
    end = os.path.getsize(path)
    append_bytes(path, b"\x07" * 13 + bytes(4096))
    damage = wal.scan(wal_dir, mode="point_in_time").torn_tail
    assert damage is not None and damage.offset == end
    with wal.Wal(wal_dir) as w:
        assert w.open_result.truncated_bytes == 13 + 4096
        assert w.append(b"three") == 3
    assert [r.payload for r in read_all(wal_dir)] == [b"one", b"two", b"three"]


def test_a_lost_write_before_later_records_of_the_last_group_is_a_torn_tail(wal_dir):
    # Power loss while the last group was being synced: its pages may land in any order, so a
    # page of zeros (never written) can come before records of the same group that did land.
    # None of that group was acknowledged: the log ends before the hole.
    write_log(wal_dir, [b"one"])
    write_log(wal_dir, [b"two", b"three", b"four"], batch=3)  # the last group
    (path,) = segment_paths(wal_dir)
    second = record_spans(path)[1]
    put(path, second.offset, bytes(second.end - second.offset))
    damage = wal.scan(wal_dir, mode="point_in_time").damages[0]
    assert damage.torn_tail and damage.offset == second.offset
    with wal.Wal(wal_dir) as w:
        assert w.open_result.last_lsn == 1 and w.open_result.torn_tail_offset == second.offset
        assert w.append(b"again") == 2
    assert [r.payload for r in read_all(wal_dir, mode="absolute")] == [b"one", b"again"]


def test_zeros_before_records_of_a_sealed_segment_are_corruption(wal_dir):
    # A SEAL is written only after the records before it were synced: zeros there are durable
    # bytes that were lost, not a torn write.
    write_log(wal_dir, [payload for payload in (b"a" * 50, b"b" * 50, b"c" * 50, b"d" * 50)],
              segment_size_bytes=160)
    first = segment_paths(wal_dir)[0]
    spans = record_spans(first)
    assert spans[-1].rtype == fmt.TYPE_SEAL and len(spans) >= 3
    put(first, spans[0].offset, bytes(spans[0].end - spans[0].offset))
    with pytest.raises(wal.WalCorruptionError) as e:
        read_all(wal_dir)
    assert e.value.offset == spans[0].offset


def test_a_bit_flip_before_later_records_of_the_last_segment_is_corruption(wal_dir):
    # Not a lost write (no zeros): bytes that were durable are damaged; never cut silently.
    write_log(wal_dir, [b"one" * 10, b"two" * 10, b"three" * 10])
    (path,) = segment_paths(wal_dir)
    second = record_spans(path)[1]
    flip_bit(path, second.offset + 25)
    with pytest.raises(wal.WalCorruptionError) as e:
        read_all(wal_dir)
    assert e.value.offset == second.offset
    with pytest.raises(wal.WalCorruptionError):
        wal.Wal(wal_dir)


@pytest.mark.parametrize("by", [1, 8, 30])
def test_a_shortened_record_is_damage_even_with_a_recomputed_crc(wal_dir, by):
    path = _one_segment_log(wal_dir, [b"a" * 30, b"b" * 30], then=[b"c"])
    first = record_spans(path)[0]
    shrink_length(path, first.offset, by)
    fix_record_crc(path, first.offset)
    recs, damages = _damage_of(wal_dir)
    assert recs == []
    assert (damages[0].offset, damages[0].torn_tail) == (first.offset, False)
    with pytest.raises(wal.WalCorruptionError):
        wal.Wal(wal_dir)


def test_a_payload_length_over_the_maximum_is_damage(wal_dir):
    path = _one_segment_log(wal_dir, [b"abc", b"def"], then=[b"later"])
    second = record_spans(path)[1]
    put_u32(path, second.offset + 4, fmt.MAX_PAYLOAD_BYTES + 1)
    recs, damages = _damage_of(wal_dir)
    assert [r.payload for r in recs] == [b"abc"]
    assert f"at most {fmt.MAX_PAYLOAD_BYTES}" in damages[0].expected
    assert damages[0].offset == second.offset and not damages[0].torn_tail


def test_salt_is_part_of_the_crc_so_a_record_copied_from_another_segment_fails(wal_dir):
    os.makedirs(wal_dir)
    a = fmt.encode_record(fmt.salt_seed(111), 3, fmt.TYPE_DATA, b"third")
    path = build_segment(wal_dir, 1, 1, data_records(1, [b"first", b"second"]), salt=222)
    good_tail = fmt.encode_record(fmt.salt_seed(222), 4, fmt.TYPE_DATA, b"fourth")
    append_bytes(path, a + good_tail)
    recs, damages = _damage_of(wal_dir)
    assert [r.payload for r in recs] == [b"first", b"second"]
    assert damages[0].expected == "a record with a valid CRC"
    assert not damages[0].torn_tail, "a valid record follows: this is corruption"
    # The same bytes framed with the right salt read fine.
    os.remove(path)
    path = build_segment(wal_dir, 1, 1, data_records(1, [b"first", b"second"]), salt=111)
    append_bytes(path, a)
    assert [r.payload for r in read_all(wal_dir)] == [b"first", b"second", b"third"]


def test_a_gap_in_the_lsn_chain_inside_a_segment_is_corruption(wal_dir):
    os.makedirs(wal_dir)
    recs = [(1, 1, b"a"), (2, 1, b"b"), (4, 1, b"d"), (5, 1, b"e")]
    path = build_segment(wal_dir, 1, 1, recs)
    third = record_spans(path)[2]
    with pytest.raises(wal.WalCorruptionError) as e:
        read_all(wal_dir)
    assert e.value.offset == third.offset and e.value.expected.startswith("LSN 3 (the record carries LSN 4)")


def test_the_lsn_chain_continues_across_segments(wal_dir):
    os.makedirs(wal_dir)
    build_segment(wal_dir, 1, 1, data_records(1, [b"a", b"b"]), seal=(2, 2))
    build_segment(wal_dir, 2, 3, data_records(3, [b"c"]))
    assert [(r.lsn, r.payload) for r in read_all(wal_dir)] == [(1, b"a"), (2, b"b"), (3, b"c")]
    os.remove(os.path.join(wal_dir, fmt.segment_name(2, 3)))
    p = build_segment(wal_dir, 2, 4, data_records(4, [b"d"]))
    with pytest.raises(wal.WalCorruptionError) as e:
        read_all(wal_dir)
    assert e.value.path == p and e.value.expected == "first LSN 3"


# -- SEAL ----------------------------------------------------------------------------------
def test_seal_record_carries_the_last_lsn_and_the_data_record_count():
    seed = fmt.salt_seed(9)
    rec = fmt.encode_seal(seed, 41, 17)
    _crc, n, lsn, rtype, _pad, _res = struct.unpack_from("<IIQBBH", rec)
    assert (n, lsn, rtype) == (16, 41, fmt.TYPE_SEAL)
    assert fmt.decode_seal(rec[20:36]) == (41, 17)


def test_segments_rotated_by_the_writer_end_with_a_seal_and_the_next_starts_after_it(wal_dir):
    payloads = [b"r%03d" % i for i in range(40)]
    write_log(wal_dir, payloads, segment_size_bytes=200)
    paths = segment_paths(wal_dir)
    assert len(paths) > 2
    for path, nxt in zip(paths, paths[1:]):
        spans = record_spans(path)
        seal = spans[-1]
        assert seal.rtype == fmt.TYPE_SEAL and seal.end == os.path.getsize(path)
        data = [s for s in spans if s.rtype == fmt.TYPE_DATA]
        last_lsn, count = fmt.decode_seal(read_bytes(path)[seal.offset + 20 : seal.offset + 36])
        assert (last_lsn, count) == (data[-1].lsn, len(data)) and seal.lsn == last_lsn
        assert wal.list_segments(wal_dir)[paths.index(nxt)].first_lsn == last_lsn + 1
    assert all(s.rtype == fmt.TYPE_DATA for s in record_spans(paths[-1]))
    assert [r.payload for r in read_all(wal_dir)] == payloads


def test_bytes_after_a_seal_are_corruption(wal_dir):
    os.makedirs(wal_dir)
    seg1 = build_segment(wal_dir, 1, 1, data_records(1, [b"a"]), seal=(1, 1))
    build_segment(wal_dir, 2, 2, data_records(2, [b"b"]))
    append_bytes(seg1, bytes(8))
    with pytest.raises(wal.WalCorruptionError) as e:
        read_all(wal_dir)
    assert e.value.path == seg1 and "after its SEAL" in e.value.expected


def test_a_sealed_last_segment_ends_the_log_and_the_writer_opens_a_new_segment(wal_dir):
    os.makedirs(wal_dir)
    build_segment(wal_dir, 1, 1, data_records(1, [b"a", b"b"]), seal=(2, 2))
    result = wal.scan(wal_dir)
    assert result.records == 2 and result.sealed_last and not result.damages
    with wal.Wal(wal_dir) as w:
        assert w.open_result.last_lsn == 2
        assert w.append(b"c") == 3
    segs = wal.list_segments(wal_dir)
    assert [(s.number, s.first_lsn) for s in segs] == [(1, 1), (2, 3)]
    assert [r.payload for r in read_all(wal_dir)] == [b"a", b"b", b"c"]


# -- limits --------------------------------------------------------------------------------
def test_a_payload_over_64_mib_is_refused_before_anything_is_written(wal_dir):
    fs = FaultFS(wal_dir)
    big = b"\0" * (fmt.MAX_PAYLOAD_BYTES + 1)
    with wal.Wal(wal_dir, fs=fs) as w:
        assert w.append(b"first") == 1
        (seg,) = segment_paths(wal_dir)
        size, writes = os.path.getsize(seg), fs.calls["write"]
        with pytest.raises(wal.PayloadTooLargeError) as e:
            w.append(big)
        assert (e.value.size, e.value.limit) == (len(big), 64 << 20)
        with pytest.raises(wal.PayloadTooLargeError):
            w.append_many([b"ok", big])
        assert fs.calls["write"] == writes and os.path.getsize(seg) == size
        assert w.stats().appends == 1
        assert w.append(b"second") == 2
    assert [r.payload for r in read_all(wal_dir)] == [b"first", b"second"]


def test_a_payload_of_exactly_64_mib_is_accepted_and_reads_back(wal_dir):
    assert wal.MAX_PAYLOAD_BYTES == 64 << 20
    assert issubclass(wal.PayloadTooLargeError, wal.WalUsageError)
    biggest = b"\x07" * wal.MAX_PAYLOAD_BYTES
    with wal.Wal(wal_dir) as w:
        assert w.append(biggest) == 1
        assert w.append(b"after") == 2
    recs = read_all(wal_dir)
    assert [r.lsn for r in recs] == [1, 2]
    assert recs[0].payload == biggest and recs[1].payload == b"after"


# -- file names ----------------------------------------------------------------------------
def test_segment_file_names_sort_by_number():
    numbers = [1, 2, 9, 10, 15, 16, 255, 256, 4096, 2**40, 2**63]
    names = [fmt.segment_name(n, min(n * 1000 + 1, 2**64 - 1)) for n in numbers]
    assert sorted(names) == names
    assert sorted(reversed(names)) == names
    for n, name in zip(numbers, names):
        assert fmt.parse_segment_name(name) == (n, min(n * 1000 + 1, 2**64 - 1))
    assert fmt.segment_name(2, 1000001) == "0000000000000002-00000000000f4241.wal"


@pytest.mark.parametrize(
    "name",
    [
        "LOCK",
        "APPLIED",
        "0000000000000001-0000000000000001.wal.broken",
        "0000000000000001-0000000000000001.wal.tmp",
        "000000000000001-0000000000000001.wal",
        "000000000000000g-0000000000000001.wal",
        "0000000000000001_0000000000000001.wal",
    ],
)
def test_names_that_are_not_segments_are_ignored(name):
    assert fmt.parse_segment_name(name) is None


def test_list_segments_ignores_broken_copies_and_temp_files(wal_dir):
    write_log(wal_dir, [b"a"] * 10, segment_size_bytes=100)
    paths = segment_paths(wal_dir)
    for p in paths:
        with open(p + ".broken", "wb"), open(p + ".tmp", "wb"):
            pass
    assert segment_paths(wal_dir) == paths
    assert [s.number for s in wal.list_segments(wal_dir)] == list(range(1, len(paths) + 1))


def test_a_whole_record_with_a_wrong_lsn_at_the_very_end_is_corruption_not_a_torn_tail(wal_dir):
    # A torn write cannot produce a complete record with a valid CRC, so this one was durable
    # once: opening a writer must refuse rather than truncate it away.
    os.makedirs(wal_dir)
    build_segment(wal_dir, 1, 1, [(1, 1, b"a"), (2, 1, b"b"), (7, 1, b"g")])
    with pytest.raises(wal.WalCorruptionError) as e:
        read_all(wal_dir)
    assert "carries LSN 7" in e.value.expected
    with pytest.raises(wal.WalCorruptionError):
        wal.open_wal(wal_dir)


def test_a_lost_sector_inside_a_record_of_the_last_group_is_a_torn_tail(wal_dir):
    # The record's first sector landed, a later one did not (it reads as zeros), and a record
    # after it landed: the same torn group, judged by the zero sector.
    big = bytes(range(256)) * 8  # 2 KiB, no zero run of 512 bytes in it
    write_log(wal_dir, [b"one"], segment_size_bytes=1 << 20)
    write_log(wal_dir, [big, b"three"], segment_size_bytes=1 << 20, batch=2)  # the last group
    (path,) = segment_paths(wal_dir)
    second = record_spans(path)[1]
    sector = (second.offset + 20 + 511) // 512 * 512
    assert sector + 512 <= second.end
    put(path, sector, bytes(512))
    damage = wal.scan(wal_dir, mode="point_in_time").damages[0]
    assert damage.torn_tail and damage.offset == second.offset
    with wal.Wal(wal_dir, segment_size_bytes=1 << 20) as w:
        assert w.open_result.last_lsn == 1
    assert os.path.getsize(path) == second.offset  # cut, and kept: the record after the hole too
    assert [r.lsn for r in wal.salvage_tail(f"{path}.tail-{second.offset}").records] == [3]


def test_crc32c_is_the_packages_c_function_loaded_without_the_package_init():
    # The package's __init__ reads its own version through importlib.metadata (~20 ms of every
    # read command's start-up); the WAL loads the extension module by itself.
    from tests.fresh_python import run_fresh

    code = (
        "import sys, os, wal.format as f\n"
        "print(type(f.crc32c).__name__, 'crc32c' in sys.modules, 'importlib.metadata' in sys.modules)\n"
        "import crc32c\n"
        "data = os.urandom(4096)\n"
        "print(all(f.crc32c(data[:n], 7) == crc32c.crc32c(data[:n], 7) for n in range(0, 4096, 37)))\n"
    )
    assert run_fresh(code) == ["builtin_function_or_method", "False", "False", "True"]
