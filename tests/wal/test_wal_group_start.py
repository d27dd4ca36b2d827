"""The group-start flag: the writer flags the first record of every group, and the reader uses
it to tell a lost write in the last group (a torn tail) from one in a group that was synced
before a later group was written (corruption). See wal/FORMAT.md, rule 3."""

from __future__ import annotations

import asyncio
import os
import random

import pytest

import wal
from wal import format as fmt

from helpers import build_segment, data_records, put, read_all, read_bytes, record_spans, segment_paths, write_log


def flags_of(path) -> list[tuple[int, int, int]]:
    """(lsn, type, reserved field) of every record of a segment, in file order."""
    data = read_bytes(path)
    return [(s.lsn, s.rtype, fmt.REC_HEAD.unpack_from(data, s.offset)[5]) for s in record_spans(path)]


def test_the_writer_flags_the_first_record_of_every_group_and_never_a_seal(wal_dir):
    with wal.Wal(wal_dir, segment_size_bytes=300) as w:
        w.append_many([b"a" * 40, b"b" * 40, b"c" * 40])  # one group of three
        w.append(b"d" * 40)
        w.append_many([b"e" * 40, b"f" * 40])  # fills the first segment: sealed after it
        w.append_many([b"g" * 40, b"h" * 40])
    first, second = segment_paths(wal_dir)
    starts = fmt.FLAG_GROUP_START
    assert flags_of(first) == [
        (1, 1, starts), (2, 1, 0), (3, 1, 0), (4, 1, starts), (5, 1, starts), (6, 1, 0), (6, 2, 0),
    ]
    assert flags_of(second) == [(7, 1, starts), (8, 1, 0)]
    assert [r.payload[:1] for r in read_all(wal_dir)] == [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"]


def test_groups_the_event_loop_writes_are_flagged_too(wal_dir):
    async def main():
        w = await wal.open_async(wal_dir)
        try:
            await w.append_many([b"x" * 30, b"y" * 30])
            await w.append(b"z" * 30)
        finally:
            await w.close()

    asyncio.run(main())
    (path,) = segment_paths(wal_dir)
    assert flags_of(path) == [(1, 1, fmt.FLAG_GROUP_START), (2, 1, 0), (3, 1, fmt.FLAG_GROUP_START)]


@pytest.mark.parametrize("reserved, seal", [(2, False), (0x100, False), (fmt.FLAG_GROUP_START, True)])
def test_any_other_reserved_value_is_corruption(wal_dir, reserved, seal):
    # A record whose CRC is valid, but whose reserved field holds what no writer sets (a SEAL
    # never carries the group-start flag), with a valid record after it.
    os.makedirs(wal_dir)
    seed = fmt.salt_seed(0x5A17_5A17)
    path = build_segment(wal_dir, 1, 1, data_records(1, [b"one", b"two"]))
    rec = bytearray(fmt.encode_seal(seed, 2, 2) if seal else fmt.encode_record(seed, 3, fmt.TYPE_DATA, b"three"))
    rec[18:20] = reserved.to_bytes(2, "little")
    rec[0:4] = fmt.mask(fmt.crc32c(bytes(rec[4:]), seed)).to_bytes(4, "little")
    with open(path, "ab") as f:
        f.write(bytes(rec) + fmt.encode_record(seed, 3 if seal else 4, fmt.TYPE_DATA, b"after"))
    with pytest.raises(wal.WalCorruptionError) as e:
        read_all(wal_dir)
    assert "group-start flag" in e.value.expected


def single_record_groups(wal_dir, n: int, seed: int) -> list[bytes]:
    """A log of `n` groups of one record each, written by the real writer; payloads of varied
    sizes with no zero byte, so any zeroed sector inside one is a whole zero sector."""
    rnd = random.Random(seed)
    payloads = [bytes(rnd.randrange(1, 256) for _ in range(rnd.randrange(30, 900))) for _ in range(n)]
    write_log(wal_dir, payloads, segment_size_bytes=1 << 20)
    return payloads


def zero_sector(path: str, start: int) -> None:
    size = os.path.getsize(path)
    put(path, start, bytes(min(512, size - start)))


def test_a_zeroed_sector_is_corruption_unless_it_lies_in_the_last_group(wal_dir, tmp_path):
    # Every sector of a log of single-record groups, one at a time: the last group is the last
    # record; zeros anywhere before it were synced before a later group was written.
    single_record_groups(wal_dir, 24, seed=7)
    (path,) = segment_paths(wal_dir)
    pristine = read_bytes(path)
    last = record_spans(path)[-1]
    seen = {True: 0, False: 0}
    for start in range(512, len(pristine), 512):  # sector 0 holds the segment header
        with open(path, "wb") as f:
            f.write(pristine)
        zero_sector(path, start)
        damage = wal.scan(wal_dir, mode="point_in_time").damages[0]
        in_last_group = start + 512 > last.offset
        assert damage.torn_tail is in_last_group, (start, damage)
        seen[in_last_group] += 1
        if not in_last_group:
            with pytest.raises(wal.WalCorruptionError):
                wal.Wal(wal_dir, segment_size_bytes=1 << 20)
            assert read_bytes(path) == pristine[:start] + bytes(512) + pristine[start + 512 :]  # nothing cut
    assert seen[True] >= 1 and seen[False] >= 15


def test_a_zeroed_first_record_of_the_last_group_is_still_a_torn_tail(wal_dir):
    # The flagged header itself never landed: the records after it carry no flag.
    write_log(wal_dir, [b"one", b"two"], segment_size_bytes=1 << 20)
    with wal.Wal(wal_dir, segment_size_bytes=1 << 20) as w:
        w.append_many([b"three" * 10, b"four" * 10, b"five" * 10])
    (path,) = segment_paths(wal_dir)
    third = record_spans(path)[2]
    put(path, third.offset, bytes(third.end - third.offset))
    damage = wal.scan(wal_dir, mode="point_in_time").damages[0]
    assert damage.torn_tail and damage.offset == third.offset


def test_a_log_written_without_flags_keeps_the_old_rule(wal_dir):
    # Logs written before groups were flagged: a lost write followed by valid records and no
    # SEAL reads as a torn tail, as it did (no record shows a later group).
    os.makedirs(wal_dir)
    path = build_segment(wal_dir, 1, 1, data_records(1, [b"one" * 10, b"two" * 10, b"three" * 10]))
    second = record_spans(path)[1]
    put(path, second.offset, bytes(20))
    damage = wal.scan(wal_dir, mode="point_in_time").damages[0]
    assert damage.torn_tail and damage.offset == second.offset
    # The same log once a flagging writer appended a group after it: corruption.
    os.remove(path)
    path = build_segment(wal_dir, 1, 1, data_records(1, [b"one" * 10, b"two" * 10, b"three" * 10]))
    with wal.Wal(wal_dir, segment_size_bytes=1 << 20) as w:
        w.append(b"four" * 10)
    put(path, second.offset, bytes(20))
    damage = wal.scan(wal_dir, mode="point_in_time").damages[0]
    assert not damage.torn_tail and damage.offset == second.offset
    assert "later group" in damage.found
