"""Group commit, the asyncio rules, locking, close, rotation, mark_applied, recovery modes, repair."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

import wal
from wal import format as fmt
from faultfs import FaultFS
from helpers import (
    append_bytes,
    flip_bit,
    payload_for,
    read_all,
    read_bytes,
    record_spans,
    segment_paths,
    truncate,
    write_log,
)
from tests.waiting import wait_until


# -- group commit --------------------------------------------------------------------------
def _appends_from_threads(w: wal.Wal, threads: int, per_thread: int) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def producer(t: int) -> None:
        try:
            for i in range(per_thread):
                p = b"t%d-%d" % (t, i)
                lsn = w.append(p)
                with lock:
                    got.append((lsn, p))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    workers = [threading.Thread(target=producer, args=(t,)) for t in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in workers)
    return got


def test_one_producer_needs_an_fdatasync_per_append_and_many_producers_share_them(tmp_path):
    one = str(tmp_path / "one")
    fs1 = FaultFS(one)
    with wal.Wal(one, fs=fs1) as w:
        _appends_from_threads(w, 1, 50)
        s1 = w.stats()
    assert s1.appends == s1.groups == fs1.calls["fdatasync"] == 50

    many = str(tmp_path / "many")
    fs8 = FaultFS(many)
    with wal.Wal(many, fs=fs8) as w:
        got = _appends_from_threads(w, 8, 50)
        s8 = w.stats()
    assert s8.appends == 400 and s8.durable_lsn == 400
    assert s8.groups == fs8.calls["fdatasync"] < s8.appends
    assert sorted(lsn for lsn, _ in got) == list(range(1, 401))
    assert {(r.lsn, r.payload) for r in read_all(many)} == set(got)


def test_appends_queued_during_an_fdatasync_are_committed_together_by_the_next_one(wal_dir):
    entered, release = threading.Event(), threading.Event()

    def before(kind, n):
        if kind == "fdatasync" and n == 1:
            entered.set()
            assert release.wait(30)

    fs = FaultFS(wal_dir, before=before)

    async def main():
        aw = await wal.open_async(wal_dir, fs=fs)
        try:
            first = asyncio.ensure_future(aw.append(b"first"))
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, entered.wait, 30)
            rest = [asyncio.ensure_future(aw.append(b"r%d" % i)) for i in range(30)]
            loop.call_soon(release.set)
            lsns = await asyncio.wait_for(asyncio.gather(first, *rest), timeout=30)
            return lsns, aw.stats()
        finally:
            await aw.close()

    lsns, stats = asyncio.run(main())
    assert lsns == list(range(1, 32))
    assert stats.groups == fs.calls["fdatasync"] == 2 and stats.last_group_size == 30


def test_an_async_append_after_a_large_group_is_still_acknowledged(wal_dir):
    async def main():
        aw = await wal.open_async(wal_dir)
        try:
            for burst in (40, 1, 25, 1, 1, 3):
                futs = [aw.append(b"b%d" % i) for i in range(burst)]
                await asyncio.wait_for(asyncio.gather(*futs), timeout=10)
            return aw.stats()
        finally:
            await aw.close()

    stats = asyncio.run(main())
    assert stats.durable_lsn == stats.appends == 71


def test_async_appends_made_by_one_pass_of_the_loop_share_one_fdatasync(wal_dir):
    # 64 producers woken by the same acknowledgment append in one pass of the loop; the flusher
    # is rung after that pass, so each round is one group, not a record and then the rest.
    async def main():
        aw = await wal.open_async(wal_dir)
        try:
            async def producer(k):
                for i in range(20):
                    await asyncio.wait_for(aw.append(b"%d-%d" % (k, i)), timeout=10)

            await asyncio.gather(*(producer(k) for k in range(64)))
            return aw.stats()
        finally:
            await aw.close()

    stats = asyncio.run(main())
    assert stats.appends == stats.durable_lsn == 64 * 20
    assert stats.groups <= 25, f"{stats.groups} groups for 20 rounds of 64 producers"


def test_an_event_loop_closed_before_it_rang_does_not_strand_later_appends(wal_dir):
    w = wal.Wal(wal_dir)
    try:
        dead = asyncio.new_event_loop()
        orphan = w.append_one_future(b"queued by a loop that never runs again", dead)
        dead.close()

        async def main():
            return await asyncio.wait_for(wal.AsyncWal(w).append(b"from a live loop"), timeout=10)

        assert asyncio.run(main()) == 2
        assert w.durable_lsn == 2 and not orphan.done()
        # A sync append from a thread rings on its own too.
        dead2 = asyncio.new_event_loop()
        w.append_one_future(b"again", dead2)
        dead2.close()
        assert w.append(b"sync") == 4
    finally:
        w.close()


def test_appends_from_two_event_loops_in_two_threads_are_each_acknowledged(wal_dir):
    w = wal.Wal(wal_dir)
    results: dict = {}

    def run(name):
        async def main():
            aw = wal.AsyncWal(w)
            futs = [aw.append(b"%s-%d" % (name.encode(), i)) for i in range(200)]
            return await asyncio.wait_for(asyncio.gather(*futs), timeout=20)

        results[name] = asyncio.run(main())

    try:
        threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(results["a"] + results["b"]) == list(range(1, 401))
        assert all(x < y for x, y in zip(results["a"], results["a"][1:]))
    finally:
        w.close()


# -- the asyncio rules ---------------------------------------------------------------------
def test_a_sync_append_inside_a_running_event_loop_raises_usage_error_naming_asyncwal(wal_dir):
    w = wal.Wal(wal_dir)
    try:
        async def inside():
            with pytest.raises(wal.WalUsageError) as e1:
                w.append(b"x")
            with pytest.raises(wal.WalUsageError) as e2:
                w.append_many([b"x"])
            return str(e1.value), str(e2.value)

        m1, m2 = asyncio.run(inside())
        assert "AsyncWal.append" in m1 and "AsyncWal.append_many" in m2
        assert w.stats().appends == 0, "the refused append was queued"
        assert w.append(b"outside the loop") == 1
    finally:
        w.close()


def test_async_wal_has_the_same_names_awaited(wal_dir):
    async def main():
        aw = await wal.open_async(wal_dir, segment_size_bytes=128)
        try:
            assert await aw.append(b"a") == 1
            assert await aw.append_many([b"b", b"c"]) == [2, 3]
            assert await aw.append_many([]) == []
            for i in range(10):
                await aw.append(payload_for(i))
            deleted = await aw.mark_applied(aw.durable_lsn + 1)
            return deleted, aw.stats()
        finally:
            await aw.close()

    deleted, stats = asyncio.run(main())
    assert deleted >= 1 and stats.appends == 13
    # What mark_applied kept: the open segment, and the one a last rotation may have added.
    assert len(wal.list_segments(wal_dir)) <= 2


# -- the lock ------------------------------------------------------------------------------
def test_a_second_writer_on_the_same_directory_gets_locked_error_naming_the_holder(wal_dir):
    with wal.Wal(wal_dir):
        with pytest.raises(wal.WalLockedError) as e:
            wal.Wal(wal_dir)
        assert f"pid={os.getpid()}" in e.value.holder and f"pid={os.getpid()}" in str(e.value)
        with pytest.raises(wal.WalLockedError):
            wal.repair(wal_dir)
    with wal.Wal(wal_dir) as w:  # released on close
        assert w.append(b"x") == 1


# -- close ---------------------------------------------------------------------------------
def test_close_is_idempotent_and_later_appends_raise_closed_error(wal_dir):
    w = wal.Wal(wal_dir)
    assert w.append(b"a") == 1
    w.close()
    w.close()
    with pytest.raises(wal.WalClosedError):
        w.append(b"b")
    with pytest.raises(wal.WalClosedError):
        w.append_many([b"b"])
    assert [r.payload for r in read_all(wal_dir)] == [b"a"]


def test_close_commits_appends_queued_before_it(wal_dir):
    async def main():
        aw = await wal.open_async(wal_dir)
        futs = [aw.append(b"q%d" % i) for i in range(20)]
        await aw.close()
        return await asyncio.wait_for(asyncio.gather(*futs), timeout=10)

    assert asyncio.run(main()) == list(range(1, 21))
    assert len(read_all(wal_dir)) == 20


# -- rotation and the reader ---------------------------------------------------------------
def test_rotation_creates_sealed_segments_and_a_live_reader_crosses_them(wal_dir):
    with wal.Wal(wal_dir, segment_size_bytes=160) as w:
        reader = wal.WalReader(wal_dir)
        seen = []
        for i in range(60):
            w.append(payload_for(i))
            if i % 7 == 0:
                seen += [r.payload for r in reader.records(to_lsn=w.durable_lsn)]
        seen += [r.payload for r in reader.records(to_lsn=w.durable_lsn)]
    assert seen == [payload_for(i) for i in range(60)]
    segs = wal.list_segments(wal_dir)
    assert len(segs) >= 5
    assert [s.number for s in segs] == list(range(1, len(segs) + 1))
    for s in segs[:-1]:
        assert record_spans(s.path)[-1].rtype == fmt.TYPE_SEAL
    result = wal.scan(wal_dir)
    assert (result.records, result.first_lsn, result.last_lsn) == (60, 1, 60)
    assert not result.damages and not result.sealed_last


def test_a_non_last_segment_without_a_seal_is_corruption(wal_dir):
    write_log(wal_dir, [payload_for(i) for i in range(30)], segment_size_bytes=160)
    paths = segment_paths(wal_dir)
    seal = record_spans(paths[1])[-1]
    truncate(paths[1], seal.offset)  # a record boundary: only the SEAL is gone
    with pytest.raises(wal.WalCorruptionError) as e:
        read_all(wal_dir)
    assert (e.value.path, e.value.offset) == (paths[1], seal.offset)
    reader = wal.WalReader(wal_dir, mode="point_in_time")
    got = [r.lsn for r in reader.records()]
    assert got == list(range(1, seal.lsn + 1)) and not reader.damages[0].torn_tail
    result = wal.repair(wal_dir)
    assert result.truncated_segment == paths[1] and set(result.removed_segments) == set(paths[2:])
    # The segments removed held LSNs up to 30 (kept in their .broken copies): the log goes on
    # above them, never giving one of their LSNs to another record.
    assert result.continues_at == 31
    with wal.Wal(wal_dir, segment_size_bytes=160) as w:
        assert w.append(b"after") == 31
    assert [r.lsn for r in read_all(wal_dir, mode="absolute")] == [*range(1, seal.lsn + 1), 31]


# -- mark_applied --------------------------------------------------------------------------
def _segmented(wal_dir, fs=None) -> wal.Wal:
    w = wal.Wal(wal_dir, segment_size_bytes=160, fs=fs)
    for i in range(40):
        w.append(payload_for(i))
    assert len(wal.list_segments(wal_dir)) >= 5
    return w


def test_mark_applied_deletes_only_sealed_segments_wholly_below_the_lsn(wal_dir):
    with _segmented(wal_dir) as w:
        segs = wal.list_segments(wal_dir)
        s2, s3 = segs[1], segs[2]
        assert w.mark_applied(1) == 0
        assert w.mark_applied(s2.first_lsn) == 1  # segment 1 ends at s2.first_lsn - 1
        assert w.mark_applied(s3.first_lsn - 1) == 0  # segment 2's last record is not applied
        assert [s.number for s in wal.list_segments(wal_dir)][0] == 2
        assert w.mark_applied(s3.first_lsn) == 1
        assert w.applied_lsn == s3.first_lsn
        remaining = wal.list_segments(wal_dir)
        last = remaining[-1]
        assert w.mark_applied(w.durable_lsn + 1) == len(remaining) - 1
        assert wal.list_segments(wal_dir) == [last], "the open segment is never deleted"
        with pytest.raises(wal.WalUsageError):
            w.mark_applied(w.durable_lsn + 2)
        assert w.append(b"still open") == 41
    assert [r.lsn for r in read_all(wal_dir)] == list(range(last.first_lsn, 42))


def test_mark_applied_never_moves_the_applied_lsn_backwards(wal_dir):
    with _segmented(wal_dir) as w:
        third = wal.list_segments(wal_dir)[2]
        assert w.mark_applied(third.first_lsn) == 2
        assert w.mark_applied(1) == 0
        assert w.applied_lsn == third.first_lsn
    assert read_all(wal_dir)[0].lsn == third.first_lsn
    with wal.Wal(wal_dir, segment_size_bytes=160) as w:
        assert w.append(b"reopened") == 41


def test_concurrent_mark_applied_calls_keep_the_highest_lsn(wal_dir):
    with _segmented(wal_dir) as w:
        lsns = list(range(1, w.durable_lsn + 2))
        errors: list[BaseException] = []

        def mark(chunk):
            try:
                for lsn in chunk:
                    w.mark_applied(lsn)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=mark, args=(lsns[i::4][::-1],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        assert w.applied_lsn == lsns[-1]
        assert len(wal.list_segments(wal_dir)) == 1
    assert [r.lsn for r in read_all(wal_dir)] == list(range(wal.list_segments(wal_dir)[0].first_lsn, 41))


def test_mark_applied_makes_applied_durable_before_deleting_and_fsyncs_the_directory(wal_dir):
    fs = FaultFS(wal_dir)
    with _segmented(wal_dir, fs) as w:
        segs = wal.list_segments(wal_dir)
        third = segs[2]
        start = len(fs.ops)
        assert w.mark_applied(third.first_lsn) == 2
        ops = fs.ops[start:]
    kinds = [k for k, _ in ops]
    unlinks = [i for i, k in enumerate(kinds) if k == "unlink"]
    rename = kinds.index("rename")
    assert ops[rename][1] == "APPLIED.tmp -> APPLIED"
    assert "fsync" in kinds[:rename], "APPLIED's bytes are synced before the rename"
    assert "fsync_dir" in kinds[rename:unlinks[0]], "the rename is durable before any delete"
    assert kinds[unlinks[-1] + 1 :] == ["fsync_dir"], "the deletes are made durable"
    assert [d for k, d in ops if k == "unlink"] == [s.name for s in segs[:2]]


def test_after_mark_applied_the_reader_starts_at_the_first_remaining_segment(wal_dir):
    with _segmented(wal_dir) as w:
        third = wal.list_segments(wal_dir)[2]
        w.mark_applied(third.first_lsn + 1)
    assert wal.read_applied_lsn(wal_dir) == third.first_lsn + 1
    recs = read_all(wal_dir)
    assert recs[0].lsn == third.first_lsn and recs[-1].lsn == 40
    assert [r.payload for r in recs] == [payload_for(i - 1) for i in range(third.first_lsn, 41)]
    assert [r.lsn for r in read_all(wal_dir, from_lsn=third.first_lsn + 3)][0] == third.first_lsn + 3
    with wal.Wal(wal_dir, segment_size_bytes=160) as w:
        assert w.append(b"next") == 41
    assert read_all(wal_dir, mode="absolute")[-1].payload == b"next"


def test_segments_left_below_a_gap_by_an_interrupted_mark_applied_are_not_corruption(wal_dir):
    with _segmented(wal_dir) as w:
        segs = wal.list_segments(wal_dir)
        kept = {s.path: read_bytes(s.path) for s in segs[:3]}
        w.mark_applied(segs[3].first_lsn)
    # A crash before the directory fsync brought segment 1 back but not segments 2 and 3.
    for path in list(kept)[:1]:
        with open(path, "wb") as f:
            f.write(kept[path])
    assert [s.number for s in wal.list_segments(wal_dir)][:2] == [1, 4]
    assert read_all(wal_dir)[0].lsn == segs[3].first_lsn
    with wal.Wal(wal_dir, segment_size_bytes=160) as w:
        w.append(b"more")
        assert w.mark_applied(w.durable_lsn + 1) >= 1
    assert wal.list_segments(wal_dir)[0].number > 4


# -- missing segments ----------------------------------------------------------------------
def test_a_missing_middle_segment_is_corruption(wal_dir):
    write_log(wal_dir, [payload_for(i) for i in range(40)], segment_size_bytes=160)
    segs = wal.list_segments(wal_dir)
    os.remove(segs[2].path)
    for mode in ("tolerate_tail", "absolute"):
        with pytest.raises(wal.WalCorruptionError) as e:
            read_all(wal_dir, mode=mode)
        assert e.value.path == segs[3].path and "segment number 3" in e.value.expected
    reader = wal.WalReader(wal_dir, mode="point_in_time")
    assert [r.lsn for r in reader.records()] == list(range(1, segs[2].first_lsn))
    assert [d.path for d in reader.damages] == [segs[3].path]
    result = wal.repair(wal_dir)
    assert result.last_lsn == segs[2].first_lsn - 1
    assert set(result.removed_segments) == {s.path for s in segs[3:]}
    assert all(read_bytes(s.path + ".broken") for s in segs[3:])
    # The segments removed (kept as .broken copies) held LSNs up to 40: the log goes on above.
    assert result.continues_at == 41
    with wal.Wal(wal_dir, segment_size_bytes=160) as w:
        assert w.append(b"after") == 41
    assert [r.lsn for r in read_all(wal_dir, mode="absolute")] == [*range(1, segs[2].first_lsn), 41]


def test_a_missing_first_segment_not_declared_applied_is_corruption(wal_dir):
    write_log(wal_dir, [payload_for(i) for i in range(20)], segment_size_bytes=160)
    segs = wal.list_segments(wal_dir)
    os.remove(segs[0].path)
    with pytest.raises(wal.WalCorruptionError) as e:
        read_all(wal_dir)
    assert e.value.path == segs[1].path and "not declared applied" in e.value.expected
    reader = wal.WalReader(wal_dir, mode="point_in_time")
    assert list(reader.records()) == [] and len(reader.damages) == 1
    # Repair would keep nothing and delete every intact segment after the gap: it refuses.
    with pytest.raises(wal.WalCorruptionError) as e:
        wal.repair(wal_dir)
    assert "missing" in e.value.hint
    assert [s.path for s in wal.list_segments(wal_dir)] == [s.path for s in segs[1:]]


# -- recovery modes ------------------------------------------------------------------------
def _log_with_a_torn_tail(wal_dir) -> tuple[str, int]:
    """30 records whose last one lost its final bytes; returns the segment and that record's offset."""
    write_log(wal_dir, [payload_for(i) for i in range(30)], segment_size_bytes=160)
    last = segment_paths(wal_dir)[-1]
    span = record_spans(last)[-1]
    truncate(last, span.end - 3)
    return last, span.offset


def test_absolute_raises_on_a_torn_tail_that_tolerate_tail_accepts(wal_dir):
    last, span = _log_with_a_torn_tail(wal_dir)
    with pytest.raises(wal.WalCorruptionError) as e:
        read_all(wal_dir, mode="absolute")
    assert (e.value.path, e.value.offset) == (last, span)
    assert [r.lsn for r in read_all(wal_dir)] == list(range(1, 30))
    result = wal.scan(wal_dir)
    assert result.torn_tail is not None and result.torn_tail.offset == span
    assert result.end_offset == span


def test_point_in_time_stops_at_the_first_damage_without_raising_or_writing(wal_dir):
    write_log(wal_dir, [payload_for(i) for i in range(40)], segment_size_bytes=160)
    segs = wal.list_segments(wal_dir)
    victim = record_spans(segs[1].path)[1]
    flip_bit(segs[1].path, victim.offset + 9)
    before = {s.path: read_bytes(s.path) for s in segs}
    reader = wal.WalReader(wal_dir, mode="point_in_time")
    assert [r.lsn for r in reader.records()] == list(range(1, victim.lsn))
    (damage,) = reader.damages
    assert (damage.path, damage.offset, damage.torn_tail) == (segs[1].path, victim.offset, False)
    result = wal.scan(wal_dir, mode="point_in_time")
    assert result.records == victim.lsn - 1 and len(result.damages) == 1
    assert {s.path: read_bytes(s.path) for s in segs} == before


def test_salvage_skips_damaged_records_and_reports_each_skip(wal_dir):
    write_log(wal_dir, [payload_for(i) for i in range(40)], segment_size_bytes=160)
    segs = wal.list_segments(wal_dir)
    a = record_spans(segs[1].path)[1]
    b = record_spans(segs[3].path)[0]
    flip_bit(segs[1].path, a.offset + 25)
    flip_bit(segs[3].path, b.offset + 2)
    before = {s.path: read_bytes(s.path) for s in segs}
    reader = wal.WalReader(wal_dir, mode="salvage")
    got = [r.lsn for r in reader.records()]
    assert got == [lsn for lsn in range(1, 41) if lsn not in (a.lsn, b.lsn)]
    assert [(d.path, d.offset) for d in reader.damages] == [(segs[1].path, a.offset), (segs[3].path, b.offset)]
    assert all(d.skipped_bytes == s.end - s.offset for d, s in zip(reader.damages, (a, b)))
    assert {s.path: read_bytes(s.path) for s in segs} == before


def test_salvage_continues_past_a_damaged_record_right_before_a_seal(wal_dir):
    write_log(wal_dir, [payload_for(i) for i in range(40)], segment_size_bytes=160)
    segs = wal.list_segments(wal_dir)
    spans = record_spans(segs[1].path)
    victim = spans[-2]  # the last DATA record; the SEAL follows it
    assert spans[-1].rtype == fmt.TYPE_SEAL
    flip_bit(segs[1].path, victim.offset + 21)
    reader = wal.WalReader(wal_dir, mode="salvage")
    got = [r.lsn for r in reader.records()]
    assert got == [lsn for lsn in range(1, 41) if lsn != victim.lsn]
    assert [(d.path, d.offset) for d in reader.damages] == [(segs[1].path, victim.offset)]


# -- the writer on open --------------------------------------------------------------------
def test_opening_the_writer_truncates_only_a_torn_tail(wal_dir):
    last, cut = _log_with_a_torn_tail(wal_dir)
    size = os.path.getsize(last)
    with wal.Wal(wal_dir, segment_size_bytes=160) as w:
        assert w.open_result.last_lsn == 29
        assert (w.open_result.torn_tail_offset, w.open_result.truncated_bytes) == (cut, size - cut)
        assert w.append(b"thirty") == 30
    assert [r.lsn for r in read_all(wal_dir, mode="absolute")] == list(range(1, 31))


def test_opening_the_writer_on_corruption_raises_and_changes_nothing(wal_dir):
    write_log(wal_dir, [payload_for(i) for i in range(12)], segment_size_bytes=1 << 20)
    (path,) = segment_paths(wal_dir)
    victim = record_spans(path)[3]
    flip_bit(path, victim.offset + 22)
    before = read_bytes(path)
    with pytest.raises(wal.WalCorruptionError) as e:
        wal.Wal(wal_dir)
    assert (e.value.path, e.value.offset) == (path, victim.offset)
    assert read_bytes(path) == before
    # The failed open released the lock: repair, which takes it, runs.
    assert wal.repair(wal_dir).truncated_at == victim.offset


def test_temp_files_of_an_interrupted_segment_creation_are_removed_on_open(wal_dir):
    write_log(wal_dir, [b"a", b"b"])
    tmp = os.path.join(wal_dir, fmt.segment_name(2, 3) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(b"half a header")
    with wal.Wal(wal_dir) as w:
        assert not os.path.exists(tmp)
        assert w.append(b"c") == 3


# -- repair --------------------------------------------------------------------------------
def test_repair_keeps_a_broken_copy_then_truncates_and_the_log_appends_again(wal_dir):
    write_log(wal_dir, [payload_for(i) for i in range(40)], segment_size_bytes=160)
    segs = wal.list_segments(wal_dir)
    victim = record_spans(segs[2].path)[1]
    flip_bit(segs[2].path, victim.offset + 30)
    originals = {s.path: read_bytes(s.path) for s in segs}
    fs = FaultFS(wal_dir)
    result = wal.repair(wal_dir, fs=fs)
    assert (result.truncated_segment, result.truncated_at) == (segs[2].path, victim.offset)
    assert result.last_lsn == victim.lsn - 1
    assert set(result.removed_segments) == {s.path for s in segs[3:]}
    assert set(result.broken_copies) == {s.path + ".broken" for s in segs[2:]}
    for s in segs[2:]:
        assert read_bytes(s.path + ".broken") == originals[s.path]
    cut = read_bytes(segs[2].path)
    # Cut at the damage, then sealed: the log continues in a new segment (below).
    assert cut[: victim.offset] == originals[segs[2].path][: victim.offset]
    assert [sp.rtype for sp in record_spans(segs[2].path) if sp.offset >= victim.offset] == [fmt.TYPE_SEAL]
    for s in segs[:2]:
        assert read_bytes(s.path) == originals[s.path]
    # The copies are durable (data and directory entry) before anything is cut.
    kinds = [k for k, _ in fs.ops]
    first_cut = min(i for i, k in enumerate(kinds) if k in ("ftruncate", "unlink"))
    assert kinds[:first_cut].count("fsync") == len(result.broken_copies)
    assert "fsync_dir" in kinds[:first_cut]
    assert kinds[-1] == "fsync_dir"
    # The records cut held LSNs up to 40 (in the copies): the log goes on above them.
    assert result.continues_at == 41 and wal.reader.read_gaps(wal_dir) == {victim.lsn - 1: 41}
    with wal.Wal(wal_dir, segment_size_bytes=160) as w:
        assert w.append(b"after repair") == 41
    recs = read_all(wal_dir, mode="absolute")
    assert [r.lsn for r in recs] == [*range(1, victim.lsn), 41]
    assert wal.repair(wal_dir).damage is None, "a clean log is left alone"


def test_repair_of_a_damaged_segment_header_removes_that_segment(wal_dir):
    write_log(wal_dir, [payload_for(i) for i in range(30)], segment_size_bytes=160)
    segs = wal.list_segments(wal_dir)
    flip_bit(segs[1].path, 13)
    result = wal.repair(wal_dir)
    assert result.damage.offset == 0 and result.truncated_segment is None
    assert segs[1].path in result.removed_segments and not os.path.exists(segs[1].path)
    assert result.continues_at == 31  # above the LSNs of the records removed with it
    with wal.Wal(wal_dir, segment_size_bytes=160) as w:
        assert w.append(b"x") == 31
    assert [r.lsn for r in read_all(wal_dir, mode="absolute")] == [*range(1, segs[1].first_lsn), 31]


def test_repair_of_a_torn_tail_truncates_it(wal_dir):
    last, cut = _log_with_a_torn_tail(wal_dir)
    result = wal.repair(wal_dir)
    assert result.damage.torn_tail and result.truncated_at == cut
    assert os.path.getsize(last) == cut
    assert [r.lsn for r in read_all(wal_dir, mode="absolute")] == list(range(1, 30))


def test_appended_garbage_after_the_last_record_is_reported_as_a_torn_tail(wal_dir):
    write_log(wal_dir, [b"a", b"b"])
    (path,) = segment_paths(wal_dir)
    append_bytes(path, os.urandom(100))
    result = wal.scan(wal_dir)
    assert result.records == 2 and result.torn_tail is not None and len(result.damages) == 1


def test_preallocated_segments_are_zero_filled_ahead_sealed_at_their_seal_and_reopen_cleanly(tmp_path):
    d = str(tmp_path / "wal")
    size = 4096
    payloads = [b"p%04d" % i + b"x" * 100 for i in range(200)]
    with wal.Wal(d, segment_size_bytes=size, preallocate=True, preallocate_after_bytes=0) as w:
        assert w._spare_event.wait(30), "the first spare was never made"
        lsns = [w.append(p) for p in payloads[:100]]
        spare = os.path.join(d, "preallocated.tmp")
        segs = wal.list_segments(d)
        # The plain first segment was left early for the zero-filled one.
        assert len(segs) >= 3
        for s in segs[:-1]:
            # Sealed segments end exactly with their SEAL record: no zeros left behind.
            spans = record_spans(s.path)
            assert spans[-1].rtype == fmt.TYPE_SEAL and spans[-1].end == os.path.getsize(s.path)
        last = segs[-1]
        assert os.path.getsize(last.path) >= size  # written over preallocated zeros
        # The next spare is asked for once the open segment is half full; at this rate it is
        # the smallest one, here the segment size.
        while w._segment_bytes < size // 2:
            lsns.append(w.append(payloads[len(lsns)]))
        assert w._spare_event.wait(30) and os.path.getsize(spare) == size
    n = len(lsns)
    assert lsns == list(range(1, n + 1))
    assert wal.scan(d).damages == []
    assert [r.payload for r in wal.read_records(d)] == payloads[:n]
    assert not os.path.exists(spare), "closing removes an unused spare"
    with wal.Wal(d, segment_size_bytes=size) as w:
        assert w.open_result.truncated_bytes == 0 and w.open_result.last_lsn == n
        assert w.append_many(payloads[n:]) == list(range(n + 1, 201))
    assert not os.path.exists(os.path.join(d, "preallocated.tmp")), "a stale spare is removed on open"
    assert [r.payload for r in wal.read_records(d, mode="absolute")] == payloads
    assert wal.scan(d, mode="absolute").damages == []


def test_a_short_lived_writer_never_zero_fills_a_spare(tmp_path):
    d = str(tmp_path / "wal")
    with wal.Wal(d, segment_size_bytes=64 << 20, preallocate=True) as w:
        for i in range(10):
            w.append(b"small %d" % i)
        assert not w._spare_event.is_set()
    assert not os.path.exists(os.path.join(d, "preallocated.tmp"))


def test_an_incremental_reader_goes_on_after_its_segment_is_deleted_as_applied(tmp_path):
    # A compactor reads up to the durable LSN, applies, and marks it applied: the segment it
    # stopped in may then be deleted before its next read.
    d = str(tmp_path / "wal")
    with wal.Wal(d, segment_size_bytes=128) as w:
        reader = wal.WalReader(d)
        w.append(b"a" * 80)
        w.append(b"b" * 80)  # the first segment is now sealed and a second one open
        assert [r.lsn for r in reader.records(to_lsn=w.durable_lsn)] == [1, 2]
        w.append(b"c" * 10)
        w.mark_applied(w.durable_lsn)
        assert wal.list_segments(d)[0].number > 1
        assert [r.lsn for r in reader.records(to_lsn=w.durable_lsn)] == [3]


# -- records kept in memory for an in-process consumer -------------------------------------
def test_retained_records_come_back_in_order_with_their_hints_and_only_once_durable(wal_dir):
    w = wal.Wal(wal_dir)
    try:
        assert w.take_retained(1, 10, 10) is None, "nothing is kept until retain() is called"
        w.retain(100)
        assert w.append(b"a", ("hint", 1)) == 1
        assert w.append_many([b"b", b"c", b"d"], {1: "for c"}) == [2, 3, 4]
        assert w.take_retained(1, 2, 4) == [(1, b"a", ("hint", 1)), (2, b"b", None)]
        # Taken records are gone; a range past to_lsn is left for later.
        assert w.take_retained(1, 10, 4) is None
        assert w.take_retained(3, 10, 3) == [(3, b"c", "for c")]
        assert w.take_retained(4, 10, 4) == [(4, b"d", None)]
        assert w.take_retained(5, 10, 9) is None  # nothing kept at all any more
    finally:
        w.close()


def test_retained_records_are_never_handed_over_before_they_are_durable(wal_dir):
    held = threading.Event()
    release = threading.Event()

    def gate(kind, n):
        if kind == "fdatasync" and fs.calls["fdatasync"] == gated[0]:
            held.set()
            assert release.wait(30)

    fs = FaultFS(wal_dir, before=gate)
    gated = [-1]
    w = wal.Wal(wal_dir, fs=fs)
    try:
        w.retain(100)
        assert w.append(b"d") == 1
        gated[0] = fs.calls["fdatasync"] + 1  # hold the next group inside its fdatasync
        t = threading.Thread(target=w.append, args=(b"e", "e-hint"))
        t.start()
        assert held.wait(30)
        # "e" is framed, written and being synced, not durable: whatever to_lsn says, only 1.
        assert w.take_retained(1, 10, 99) == [(1, b"d", None)]
        assert w.take_retained(2, 10, 99) == []
        release.set()
        t.join(30)
        assert w.take_retained(2, 10, 99) == [(2, b"e", "e-hint")]
    finally:
        release.set()
        w.close()


def test_retained_records_skipped_by_a_consumer_reading_from_disk_are_dropped(wal_dir):
    w = wal.Wal(wal_dir)
    try:
        w.retain(100)
        w.append_many([b"%d" % i for i in range(10)])
        # The consumer applied 1..6 from the segments: asking for 7 drops 1..6 on the way.
        assert [r[0] for r in w.take_retained(7, 100, 10)] == [7, 8, 9, 10]
        assert w.take_retained(1, 100, 10) is None
    finally:
        w.close()


def test_a_full_retention_window_starts_over_and_earlier_records_come_from_disk(wal_dir):
    w = wal.Wal(wal_dir)
    try:
        w.retain(4)
        w.append_many([b"%d" % i for i in range(6)])  # 1..4 kept, then dropped for 5, 6
        assert w.take_retained(1, 10, 6) is None
        assert [r[0] for r in w.take_retained(5, 10, 6)] == [5, 6]
        w.retain(0)
        w.append(b"x")
        assert w.take_retained(7, 10, 7) is None
    finally:
        w.close()


def test_the_retention_window_is_bounded_in_bytes_too(wal_dir):
    from wal.retained_records import RECORD_OVERHEAD as OH  # what a kept record costs besides its payload

    w = wal.Wal(wal_dir)
    try:
        w.retain(100, max_bytes=2 * (4 + OH) + 3)
        w.append_many([b"aaaa", b"bbbb", b"cccc"])  # the third would pass the bound: start over
        assert w.take_retained(1, 10, 3) is None
        assert w.take_retained(3, 10, 3) == [(3, b"cccc", None)]
        w.append(b"x" * (2 * (4 + OH) + 4))  # larger than the whole window: never kept
        w.append(b"dd")
        assert w.take_retained(4, 10, 5) is None
        assert w.take_retained(5, 10, 5) == [(5, b"dd", None)]
    finally:
        w.close()


def test_a_failed_wal_keeps_nothing_in_memory(wal_dir):
    import errno

    fs = FaultFS(wal_dir)
    w = wal.Wal(wal_dir, fs=fs)
    try:
        w.retain(100)
        w.append(b"durable")
        fs.fail = {"fdatasync": (fs.calls["fdatasync"] + 1, errno.EIO)}
        with pytest.raises(wal.WalFailedError):
            w.append(b"lost")
        assert w.take_retained(1, 10, 10) is None
    finally:
        w.close()


@pytest.mark.parametrize("many", [False, True], ids=["append_one_future", "append_future"])
def test_an_async_append_handed_in_from_another_thread_is_flushed(wal_dir, many):
    # An async append called outside its loop's thread cannot defer the ring to that loop.
    w = wal.Wal(wal_dir)
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        if many:
            fut = w.append_future([b"from another thread"], loop)
        else:
            fut = w.append_one_future(b"from another thread", loop)
        wait_until(lambda: w.durable_lsn >= 1, 5, "the append handed in from another thread to be flushed")
        assert w.durable_lsn == 1
        got = asyncio.run_coroutine_threadsafe(asyncio.wait_for(asyncio.shield(fut), 5), loop).result(10)
        assert got == ([1] if many else 1)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
        loop.close()
        w.close()


@pytest.mark.parametrize("many", [False, True], ids=["append_one_future", "append_future"])
def test_async_appends_of_one_pass_of_the_loop_share_one_group(wal_dir, many):
    # The flusher is woken once the loop has run what was ready, not at the first append: a
    # server that reads many connections in one pass commits them with one fdatasync, and the
    # flusher does not take the GIL from the loop in the middle of that pass. The sleep between
    # the appends (it releases the GIL) gives a flusher woken at the first one every chance to
    # write it alone.
    groups: list[int] = []
    w = wal.Wal(wal_dir, on_group=lambda nbytes, dt: groups.append(nbytes))

    async def main():
        loop = asyncio.get_running_loop()
        futs = []
        for i in range(3):
            p = b"record %d" % i
            futs.append(w.append_future([p], loop) if many else w.append_one_future(p, loop))
            time.sleep(0.05)
        return await asyncio.gather(*futs)

    try:
        got = asyncio.run(main())
        assert got == ([[1], [2], [3]] if many else [1, 2, 3])
        assert w.stats().groups == 1
    finally:
        w.close()
    # on_group runs in the flusher, which may still be finishing the group when the futures
    # resolve: read it once close() joined it.
    assert len(groups) == 1


@pytest.mark.parametrize("call", ["append_many", "append_future"])
def test_a_batch_with_a_payload_that_is_not_bytes_frames_nothing(wal_dir, call):
    # All or nothing: the records before the bad one must not be framed (they would be written
    # with nobody told), and no LSN may be taken, or the next append would reuse it.
    w = wal.Wal(wal_dir)
    try:
        w.retain(100)
        assert w.append(b"first") == 1
        bad = [b"ok-1", b"ok-2", "not bytes", b"ok-3"]
        loop = asyncio.new_event_loop()
        try:
            with pytest.raises(TypeError):
                if call == "append_many":
                    w.append_many(bad)
                else:
                    w.append_future(bad, loop)
        finally:
            loop.close()
        assert w.append_many([b"second", b"third"]) == [2, 3]
        assert w.take_retained(1, 10, 3) == [(1, b"first", None), (2, b"second", None), (3, b"third", None)]
    finally:
        w.close()
    assert [r.payload for r in wal.WalReader(wal_dir).records()] == [b"first", b"second", b"third"]


def test_an_async_append_of_no_records_resolves_at_once(wal_dir):
    w = wal.Wal(wal_dir)

    async def main():
        return await asyncio.wait_for(w.append_future([], asyncio.get_running_loop()), 5)

    try:
        assert asyncio.run(main()) == []
        assert w.stats().appends == 0 and w.stats().groups == 0
    finally:
        w.close()


def test_retained_records_are_copies_of_what_was_framed(wal_dir):
    w = wal.Wal(wal_dir)
    try:
        w.retain(100)
        buf = bytearray(b"original")
        w.append(buf)
        buf[:] = b"changed!"
        assert w.take_retained(1, 10, 1) == [(1, b"original", None)]
    finally:
        w.close()


def test_hints_that_are_not_a_mapping_are_refused_before_anything_is_framed(wal_dir):
    w = wal.Wal(wal_dir)
    try:
        with pytest.raises(TypeError, match="mapping"):
            w.append_many([b"a", b"b"], ["hint-a", "hint-b"])
        assert w.stats().appends == 0
        assert w.append(b"c") == 1
    finally:
        w.close()


def test_a_group_gate_opened_once_lets_every_thread_of_the_group_through():
    # The flusher opens a group's gate once; each thread that gets through opens it for the next.
    from wal.futures import GroupGate, acknowledge

    gate = GroupGate()
    assert not gate.done() and not gate.wait(0)
    through: list = []
    workers = [threading.Thread(target=lambda: through.append(gate.wait(30))) for _ in range(16)]
    for t in workers:
        t.start()
    acknowledge([(None, gate, None)], None)
    gate.set_result(None)  # a second opening is a no-op
    for t in workers:
        t.join()
    assert through == [True] * 16 and gate.done() and gate.wait(0)


def test_a_loop_acknowledging_its_group_opens_the_gate_of_the_threads_in_it(wal_dir):
    # Blocking appends and the attached loop's own appends share a group: the loop opens the gate.
    async def main():
        aw = await wal.open_async(wal_dir)
        try:
            assert aw.wal.loop_attached
            loop = asyncio.get_running_loop()
            from_threads = [loop.run_in_executor(None, aw.wal.append, b"t%d" % i) for i in range(8)]
            mine = [aw.append(b"l%d" % i) for i in range(8)]
            return sorted(await asyncio.gather(*from_threads, *mine))
        finally:
            await aw.close()

    assert asyncio.run(main()) == list(range(1, 17))
