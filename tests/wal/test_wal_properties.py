"""Property tests: round trips, torn tails at every offset, bit flips, random bytes."""

from __future__ import annotations

import asyncio
import os
import tempfile
from contextlib import nullcontext

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import wal
from wal import format as fmt
from helpers import (
    append_bytes,
    read_all,
    read_bytes,
    record_spans,
    segment_paths,
    write_bytes,
    write_log,
)

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
MODES = ["tolerate_tail", "absolute", "point_in_time", "salvage"]


def fresh_dir(tmp_path) -> str:
    return tempfile.mkdtemp(dir=tmp_path)


@settings(max_examples=40, **SETTINGS)
@given(
    payloads=st.lists(st.binary(max_size=200), max_size=40),
    segment_size=st.sampled_from([64, 200, 1000, 1 << 20]),
    batch=st.integers(1, 5),
)
def test_any_payload_list_round_trips_through_append_and_read(tmp_path, payloads, segment_size, batch):
    d = fresh_dir(tmp_path)
    lsns = write_log(d, payloads, segment_size_bytes=segment_size, batch=batch)
    assert lsns == list(range(1, len(payloads) + 1))
    assert [(r.lsn, r.payload) for r in read_all(d)] == list(zip(lsns, payloads))
    assert [(r.lsn, r.payload) for r in read_all(d, mode="absolute")] == list(zip(lsns, payloads))
    # Reading from any LSN yields exactly the suffix.
    if payloads:
        mid = len(payloads) // 2 + 1
        assert [r.payload for r in read_all(d, from_lsn=mid)] == payloads[mid - 1 :]


@settings(max_examples=15, **SETTINGS)
@given(payloads=st.lists(st.binary(max_size=100), min_size=1, max_size=30))
def test_concurrent_async_appends_round_trip_in_call_order(tmp_path, payloads):
    d = fresh_dir(tmp_path)

    async def main():
        aw = await wal.open_async(d, segment_size_bytes=300)
        try:
            return await asyncio.gather(*(aw.append(p) for p in payloads))
        finally:
            await aw.close()

    lsns = asyncio.run(main())
    assert lsns == list(range(1, len(payloads) + 1))
    assert [r.payload for r in read_all(d)] == payloads


def _reopen_offsets(size: int, spans) -> list[int]:
    """The offsets at which the writer is also reopened: all of the last record, and a sample."""
    last_start = spans[-1].offset if spans else fmt.SEGMENT_HEADER_SIZE
    picked = set(range(max(0, last_start - 1), size + 1))
    picked |= set(range(0, size + 1, 11))
    picked |= {s.end for s in spans} | {s.end - 1 for s in spans}
    return sorted(o for o in picked if 0 <= o <= size)


@settings(max_examples=12, **SETTINGS)
@given(
    payloads=st.lists(st.binary(max_size=40), min_size=1, max_size=10),
    segment_size=st.sampled_from([150, 400, 1 << 20]),
)
def test_truncating_the_last_segment_at_every_offset_leaves_exactly_a_prefix(
    tmp_path, payloads, segment_size
):
    d = fresh_dir(tmp_path)
    write_log(d, payloads, segment_size_bytes=segment_size)
    last_seg = wal.list_segments(d)[-1]
    original = read_bytes(last_seg.path)
    spans = record_spans(last_seg.path)
    assert all(s.rtype == fmt.TYPE_DATA for s in spans), "the last segment is never sealed"
    before = last_seg.first_lsn - 1  # records of earlier (sealed) segments
    reopen_at = set(_reopen_offsets(len(original), spans))
    written = set(os.listdir(d))
    for cut in range(len(original) + 1):
        # A reopen below may have moved on to a new segment (rotation when the cut segment was a
        # full preallocated spare) and kept tails: each cut starts from the log as written.
        for name in set(os.listdir(d)) - written:
            os.unlink(os.path.join(d, name))
        write_bytes(last_seg.path, original[:cut])
        if cut < fmt.SEGMENT_HEADER_SIZE:
            with pytest.raises(wal.WalCorruptionError) as e:
                read_all(d)
            assert e.value.path == last_seg.path and e.value.offset == 0
            continue
        whole = [s for s in spans if s.end <= cut]
        expected = payloads[: before + len(whole)]
        reader = wal.WalReader(d)
        got = [r.payload for r in reader.records()]
        assert got == expected, f"cut at {cut}"
        tail = original[(whole[-1].end if whole else fmt.SEGMENT_HEADER_SIZE) : cut]
        # Fewer zero bytes than a record header at the end of the file are the end of the data
        # (no record fits there): a cut whose partial header happens to be all zeros reads so.
        at_boundary = not tail or (len(tail) < fmt.RECORD_HEADER_SIZE and not any(tail))
        assert (not reader.damages) == at_boundary
        assert all(dmg.torn_tail for dmg in reader.damages)
        with pytest.raises(wal.WalCorruptionError) if not at_boundary else nullcontext():
            read_all(d, mode="absolute")
        if cut in reopen_at:
            with wal.Wal(d, segment_size_bytes=1 << 20) as w:
                assert w.open_result.last_lsn == len(expected)
                # A zero tail shorter than a header is the end of the data: nothing to cut.
                assert w.open_result.truncated_bytes == (0 if at_boundary else len(tail))
                assert w.append(b"after the cut") == len(expected) + 1
            got = [(r.lsn, r.payload) for r in read_all(d, mode="absolute")]
            assert got == list(enumerate(expected + [b"after the cut"], start=1)), f"cut at {cut}"


@settings(max_examples=5, **SETTINGS)
@given(
    payloads=st.lists(st.binary(max_size=30), min_size=6, max_size=14),
    which=st.integers(0, 10),
)
def test_every_single_bit_flip_in_a_sealed_segment_is_detected(tmp_path, payloads, which):
    d = fresh_dir(tmp_path)
    write_log(d, payloads, segment_size_bytes=120)
    segs = wal.list_segments(d)
    assume(len(segs) >= 2)
    target = segs[which % (len(segs) - 1)]  # never the last one
    original = read_bytes(target.path)
    spans = record_spans(target.path)
    assert spans[-1].rtype == fmt.TYPE_SEAL
    starts = [0] * fmt.SEGMENT_HEADER_SIZE
    for s in spans:
        starts += [s.offset] * (s.end - s.offset)
    assert len(starts) == len(original)
    lsn_at = {s.offset: s.lsn for s in spans}
    for bit in range(len(original) * 8):
        flipped = bytearray(original)
        flipped[bit // 8] ^= 1 << (bit % 8)
        write_bytes(target.path, bytes(flipped))
        where = starts[bit // 8]
        with pytest.raises(wal.WalCorruptionError) as e:
            read_all(d)
        assert (e.value.path, e.value.offset) == (target.path, where), f"bit {bit}"
        reader = wal.WalReader(d, mode="salvage")
        list(reader.records())
        first = reader.damages[0]
        assert (first.path, first.offset, first.torn_tail) == (target.path, where, False)
        # point_in_time stops right before the damaged record
        good = [r.lsn for r in wal.read_records(d, mode="point_in_time")]
        upto = target.first_lsn - 1 if where == 0 else lsn_at[where] - 1
        if where and spans[-1].offset == where:
            upto = spans[-1].lsn  # the SEAL is damaged: every DATA record before it is good
        assert good == list(range(1, upto + 1)), f"bit {bit}"
    write_bytes(target.path, original)


def _read_every_way(d):
    """Read `d` in every mode; only clean ends and WalCorruptionError are allowed."""
    outcomes = {}
    for mode in MODES:
        try:
            outcomes[mode] = [(r.lsn, r.payload) for r in wal.read_records(d, mode=mode)]
        except wal.WalCorruptionError as e:
            assert e.path and e.offset >= 0
            outcomes[mode] = e
    try:
        wal.scan(d)
    except wal.WalCorruptionError:
        pass
    return outcomes


@settings(max_examples=60, **SETTINGS)
@given(
    garbage=st.one_of(
        st.binary(min_size=1, max_size=400),
        st.binary(min_size=1, max_size=4).map(lambda b: b * 60),
    ),
    where=st.sampled_from(
        ["append_last", "append_sealed", "replace_body", "replace_whole", "new_segment", "applied"]
    ),
    which=st.integers(0, 10),
)
def test_random_bytes_never_crash_the_reader(tmp_path, garbage, where, which):
    d = fresh_dir(tmp_path)
    payloads = [b"rec%02d" % i * (i % 5) for i in range(12)]
    write_log(d, payloads, segment_size_bytes=120)
    segs = segment_paths(d)
    target = segs[which % len(segs)]
    if where == "append_last":
        append_bytes(segs[-1], garbage)
    elif where == "append_sealed":
        append_bytes(segs[which % (len(segs) - 1)], garbage)
    elif where == "replace_body":
        write_bytes(target, read_bytes(target)[: fmt.SEGMENT_HEADER_SIZE] + garbage)
    elif where == "replace_whole":
        write_bytes(target, garbage)
    elif where == "new_segment":
        n = len(segs) + 1
        write_bytes(os.path.join(d, fmt.segment_name(n, 1000)), garbage)
    else:
        write_bytes(os.path.join(d, "APPLIED"), garbage)

    outcomes = _read_every_way(d)
    expected = list(enumerate(payloads, start=1))
    if where == "append_last":
        assert outcomes["tolerate_tail"] == expected, "garbage after the last record is a torn tail"
    if where == "append_sealed":
        assert isinstance(outcomes["tolerate_tail"], wal.WalCorruptionError)
        assert outcomes["point_in_time"] == expected[: len(outcomes["point_in_time"])]
    for mode in ("point_in_time", "salvage"):
        assert not isinstance(outcomes[mode], Exception) or where == "applied", mode

    # The writer either opens or refuses with WalCorruptionError; repair makes it open again.
    try:
        with wal.Wal(d, segment_size_bytes=120) as w:
            w.append(b"opened")
    except wal.WalCorruptionError:
        if where == "applied":
            return
        wal.repair(d)
        with wal.Wal(d, segment_size_bytes=120) as w:
            lsn = w.append(b"after repair")
        recs = read_all(d, mode="absolute")
        assert recs[-1].lsn == lsn and recs[-1].payload == b"after repair"
        assert [(r.lsn, r.payload) for r in recs[:-1]] == expected[recs[0].lsn - 1 : lsn - 1]


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.one_of(st.binary(max_size=64), st.binary(min_size=100, max_size=3000)), max_size=20),
    seed=st.integers(0, 2**32 - 1),
    first_lsn=st.integers(1, 2**63 - 100),
    prefix=st.binary(max_size=16),
)
def test_batch_framing_is_byte_for_byte_the_framing_of_each_record(payloads, seed, first_lsn, prefix):
    out = bytearray(prefix)
    nxt = fmt.frame_data_records(out, seed, first_lsn, payloads)
    assert nxt == first_lsn + len(payloads)
    expected = prefix + b"".join(
        fmt.encode_record(seed, first_lsn + i, fmt.TYPE_DATA, p) for i, p in enumerate(payloads)
    )
    assert bytes(out) == expected


@settings(max_examples=60, **SETTINGS)
@given(payloads=st.lists(st.binary(max_size=40), min_size=1, max_size=24), attach=st.booleans())
def test_single_async_appends_write_byte_for_byte_the_framing_of_each_record(tmp_path, payloads, attach):
    """AsyncWal.append frames each record in place (its own hot path): the segment on disk is
    exactly its header followed by `encode_record` of every payload, whoever flushes it, the
    first record of each group flagged as such (`mark_group_start`)."""
    d = fresh_dir(tmp_path)

    async def main():
        aw = await wal.open_async(d, attach_loop=attach)
        try:
            return await asyncio.gather(*(aw.append(p) for p in payloads))
        finally:
            await aw.close()

    assert asyncio.run(main()) == list(range(1, len(payloads) + 1))
    (path,) = segment_paths(d)
    data = read_bytes(path)
    header = fmt.decode_segment_header(data)
    seed = fmt.salt_seed(header.salt)
    expected = bytearray()
    for i, p in enumerate(payloads):
        record = bytearray(fmt.encode_record(seed, i + 1, fmt.TYPE_DATA, p))
        at = fmt.SEGMENT_HEADER_SIZE + len(expected)
        if i == 0 or data[at + 18] == fmt.FLAG_GROUP_START:  # the group's first record
            fmt.mark_group_start(record, seed)
        expected += record
    assert data[: fmt.SEGMENT_HEADER_SIZE + len(expected)] == data[: fmt.SEGMENT_HEADER_SIZE] + expected
    assert not any(data[fmt.SEGMENT_HEADER_SIZE + len(expected) :])


@settings(max_examples=60, **SETTINGS)
@given(
    payloads=st.lists(st.binary(max_size=60), min_size=1, max_size=60),
    segment_size=st.sampled_from([100, 300, 1 << 20]),
    read_ahead=st.sampled_from([1, 2, 3, 7, 512]),
    stops=st.lists(st.integers(0, 9), min_size=1, max_size=12),
    drop=st.booleans(),
    from_lsn=st.integers(1, 10),
)
# Stopping right after the last record of a sealed segment: the SEAL is read again next time.
@example(payloads=[b"", b"", b""], segment_size=100, read_ahead=2, stops=[3], drop=False, from_lsn=1)
def test_a_consumer_that_stops_early_resumes_just_after_the_last_record_it_was_given(
    tmp_path, monkeypatch, payloads, segment_size, read_ahead, stops, drop, from_lsn
):
    """records() reads ahead of its consumer in batches; stopping mid-batch (closing the
    generator, or dropping it) steps the reader back, so every record comes once, in order."""
    d = fresh_dir(tmp_path)
    write_log(d, payloads, segment_size_bytes=segment_size)
    monkeypatch.setattr(wal.reader, "_RECORDS_AHEAD", read_ahead)
    reader = wal.WalReader(d, from_lsn=from_lsn)
    got = []
    for take in stops:
        gen = reader.records()
        for rec in gen:
            got.append(rec)
            if len(got) % 10 == take:
                break
        if drop:
            del gen  # CPython closes a dropped generator at once
        else:
            gen.close()
        assert reader.records_read == len(got)
        if got:
            assert reader.last_lsn == got[-1].lsn
    got += list(reader.records())
    expected = [(i + 1, p) for i, p in enumerate(payloads)][from_lsn - 1 :]
    assert [(r.lsn, r.payload) for r in got] == expected
    assert reader.records_read == len(expected)
    if expected:
        assert reader.last_lsn == len(payloads)


@settings(max_examples=40, **SETTINGS)
@given(
    payloads=st.lists(st.binary(max_size=60), max_size=60),
    segment_size=st.sampled_from([100, 300, 1 << 20]),
    max_records=st.integers(1, 9),
    from_lsn=st.integers(1, 10),
)
def test_batches_hold_the_records_in_order_within_one_segment_each(
    tmp_path, payloads, segment_size, max_records, from_lsn
):
    d = fresh_dir(tmp_path)
    write_log(d, payloads, segment_size_bytes=segment_size)
    batches = list(wal.WalReader(d, from_lsn=from_lsn).batches(max_records))
    assert all(0 < len(b) <= max_records for b in batches)
    assert all(len({r.segment for r in b}) == 1 for b in batches)
    flat = [r for b in batches for r in b]
    assert flat == read_all(d, from_lsn=from_lsn)
    result = wal.scan(d)
    assert (result.records, result.first_lsn, result.last_lsn) == (
        len(payloads), 1 if payloads else None, len(payloads)
    )
    skipper = wal.WalReader(d, from_lsn=from_lsn)
    assert skipper.skip_to_end() == len(flat) == skipper.records_read
    if flat:
        assert skipper.last_lsn == len(payloads)
