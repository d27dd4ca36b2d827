"""The attached event loop: it writes each group and runs its fdatasync in the background.

`Wal.attach_loop` (which `wal.open_async` calls) hands the group commit to the running loop:
Linux native AIO on a real file system (wal/aio.py), the fault layer's own fdatasync in a helper
thread under FaultFS. These tests check the kernel interface itself, that the loop really does
the flushing, that blocking callers, rotations, a stopped loop and closes from anywhere all still
work, and, under simulated power loss at every call, acknowledged <= recovered <= attempted.
"""

from __future__ import annotations

import asyncio
import errno
import os
import platform
import random
import select
import shutil
import sys
import threading

import pytest

import wal
from wal.aio import PENDING, LinuxAioSyncer, ThreadSyncer, outcome_of
from wal.fs import OsFileSystem
from wal.group_commit import Owner
from faultfs import DATA_MODES, FaultFS
from helpers import read_all
from test_wal_crash import Trace, check_recovery, payload
from tests.waiting import wait_until_async

HAS_AIO = sys.platform.startswith("linux") and platform.machine() in ("x86_64", "aarch64")
needs_aio = pytest.mark.skipif(not HAS_AIO, reason="Linux native AIO on x86_64 or aarch64")


class CountingFS(OsFileSystem):
    """The real file system, counting the flusher thread's fdatasyncs and the loop's submits.
    `hold`: while it is clear, completions are not handed to the writer (it sees PENDING);
    `withheld` counts the looks at a completion that had arrived and was held back."""

    def __init__(self, syncer_fd=None):
        self.fdatasyncs = 0
        self.submits = 0
        self.withheld = 0
        self._syncer_fd = syncer_fd  # when set, the syncer is pointed at this fd instead
        self.hold = threading.Event()
        self.hold.set()

    def fdatasync(self, fd: int) -> None:
        self.fdatasyncs += 1
        super().fdatasync(fd)

    def async_syncer(self, directory):
        fs = self

        class Counting(LinuxAioSyncer):
            def submit(self, fd: int) -> None:
                fs.submits += 1
                super().submit(fd if fs._syncer_fd is None else fs._syncer_fd)

            def reap(self, block: bool = False):
                if not fs.hold.is_set():
                    if not block:
                        if select.select([self.fileno()], [], [], 0)[0]:
                            fs.withheld += 1
                        return PENDING
                    fs.hold.wait()
                return super().reap(block)

        return Counting()


class CountingFaultFS(FaultFS):
    """FaultFS whose background syncer counts its submits."""

    submits = 0

    def async_syncer(self, directory):
        fs = self

        class Counting(ThreadSyncer):
            def submit(self, fd: int) -> None:
                fs.submits += 1
                super().submit(fd)

        return Counting(self)


def check_the_thread_flushes(wal_dir: str, fs=None) -> None:
    """open_async leaves the loop unattached, and the log still works (the thread flushes)."""

    async def main():
        aw = await wal.open_async(wal_dir, fs=fs)
        try:
            assert not aw.wal.loop_attached
            assert await aw.append(b"a") == 1
        finally:
            await aw.close()

    asyncio.run(main())
    assert [r.payload for r in read_all(wal_dir)] == [b"a"]


# -- the kernel interface ------------------------------------------------------------------
@needs_aio
def test_linux_aio_fdatasync_completes_on_its_eventfd_and_reports_errors(tmp_path):
    s = LinuxAioSyncer()
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert s.reap() is PENDING, "nothing in flight"
        for _ in range(3):
            os.write(fd, b"x" * 4096)
            s.submit(fd)
            with pytest.raises(RuntimeError):
                s.submit(fd)  # one at a time
            ready, _, _ = select.select([s.fileno()], [], [], 10)
            assert ready == [s.fileno()], "the completion turns the eventfd readable"
            assert s.reap() is None
            assert select.select([s.fileno()], [], [], 0)[0] == [], "reaping clears the eventfd"
        r, w = os.pipe()
        try:
            with pytest.raises(OSError) as e:
                s.submit(r)  # a pipe cannot be fsynced: the kernel refuses the request
            assert e.value.errno == errno.EINVAL
            os.write(fd, b"y")
            s.submit(fd)  # refused requests leave nothing in flight
            assert s.reap(block=True) is None
        finally:
            os.close(r)
            os.close(w)
    finally:
        s.close()
        os.close(fd)


def test_a_failed_completion_becomes_the_errno_it_carries():
    assert outcome_of(0) is None
    err = outcome_of(-errno.EIO)
    assert isinstance(err, OSError) and err.errno == errno.EIO and "fdatasync" in str(err)
    assert outcome_of(-errno.ENOSPC).errno == errno.ENOSPC


def test_the_thread_syncer_runs_the_file_systems_fdatasync(tmp_path):
    calls = []

    class FS(OsFileSystem):
        def fdatasync(self, fd):
            calls.append(fd)
            if len(calls) == 2:
                raise OSError(errno.EIO, "injected")

    s = ThreadSyncer(FS())
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert s.reap() is PENDING
        s.submit(fd)
        assert select.select([s.fileno()], [], [], 10)[0] == [s.fileno()]
        assert s.reap() is None, "readable only once the outcome is there"
        assert select.select([s.fileno()], [], [], 0)[0] == [], "reaping cleared it"
        s.submit(fd)
        err = s.reap(block=True)
        assert isinstance(err, OSError) and err.errno == errno.EIO
        assert calls == [fd, fd]
        assert s.reap() is PENDING
    finally:
        s.close()
        os.close(fd)


# -- the loop does the flushing --------------------------------------------------------------
@needs_aio
def test_the_attached_loop_flushes_every_group_and_everything_reads_back(wal_dir):
    fs = CountingFS()

    async def main():
        aw = await wal.open_async(wal_dir, fs=fs)
        assert aw.wal.loop_attached
        try:

            async def producer(k: int) -> list:
                return [(await aw.append(b"%d-%d" % (k, i)), b"%d-%d" % (k, i)) for i in range(40)]

            got = await asyncio.gather(*(producer(k) for k in range(32)))
            got.append(list(zip(await aw.append_many([b"m1", b"m2", b"m3"]), [b"m1", b"m2", b"m3"])))
            return [x for part in got for x in part], aw.stats()
        finally:
            await aw.close()

    acked, stats = asyncio.run(main())
    assert sorted(lsn for lsn, _ in acked) == list(range(1, 32 * 40 + 4))
    assert stats.groups == fs.submits > 0, "each group is one fdatasync, started by the loop"
    assert stats.groups < len(acked) / 4, "groups are shared by the producers"
    assert fs.fdatasyncs == 0, "the flusher thread synced nothing"
    assert {r.lsn: r.payload for r in read_all(wal_dir, mode="absolute")} == dict(acked)


@needs_aio
def test_nothing_is_acknowledged_before_its_completion_is_reaped(wal_dir):
    """The kernel's completion is held back from the writer: the futures stay pending (and
    durable_lsn stays put) however long the loop runs, and resolve once it is handed over."""
    fs = CountingFS()

    async def main():
        aw = await wal.open_async(wal_dir, fs=fs)
        try:
            assert await aw.append(b"first") == 1
            fs.hold.clear()
            futs = [aw.append(b"held %d" % i) for i in range(10)]
            # The fdatasync finishes and the loop is handed its completion again and again.
            await wait_until_async(lambda: fs.withheld >= 3, 10, "the loop to look at the held completion 3 times")
            assert fs.submits == 2
            assert not any(f.done() for f in futs)
            assert aw.durable_lsn == 1
            fs.hold.set()
            os.eventfd_write(aw.wal._loop_flusher.syncer.fileno(), 1)  # the signal the held reap swallowed
            assert await asyncio.wait_for(asyncio.gather(*futs), 10) == list(range(2, 12))
            assert aw.durable_lsn == 11
        finally:
            fs.hold.set()
            await aw.close()

    asyncio.run(main())


@needs_aio
def test_a_kernel_error_from_the_background_fdatasync_fails_the_log_closed(wal_dir):
    """io_submit refuses the request (a pipe's fd stands in for a failing disk): the group's
    appends fail, nothing is retried, later appends are refused, and a reopen keeps the acked."""
    r, w = os.pipe()
    fs = CountingFS()

    async def main():
        aw = await wal.open_async(wal_dir, fs=fs)
        try:
            assert await aw.append(b"acked") == 1
            fs._syncer_fd = r
            pending = [aw.append(b"lost %d" % i) for i in range(5)]
            results = await asyncio.gather(*pending, return_exceptions=True)
            assert all(isinstance(x, wal.WalFailedError) for x in results), results
            assert results[0].errno == errno.EINVAL
            submits = fs.submits
            with pytest.raises(wal.WalFailedError):
                await aw.append(b"refused")
            await asyncio.sleep(0.1)  # time for a retry to show, if there were one: nothing to wait for
            assert fs.submits == submits == 2, "a failed fdatasync is never retried"
        finally:
            await aw.close()

    try:
        asyncio.run(main())
    finally:
        os.close(r)
        os.close(w)
    with wal.Wal(wal_dir) as w2:
        recs = read_all(wal_dir)
        assert recs[0].payload == b"acked"
        assert w2.append(b"after") == recs[-1].lsn + 1


@needs_aio
def test_a_kernel_that_refuses_an_aio_fdatasync_keeps_the_thread(wal_dir, monkeypatch):
    """Before Linux 4.18 io_submit answers EINVAL for IOCB_CMD_FDSYNC. The probe sees it on a
    scratch file, so the log is never attached (it would fail closed on its first group)."""

    def refuse(self, fd):
        raise OSError(errno.EINVAL, "io_submit of fdatasync: Invalid argument")

    monkeypatch.setattr(LinuxAioSyncer, "submit", refuse)
    check_the_thread_flushes(wal_dir)
    assert [n for n in os.listdir(wal_dir) if "probe" in n] == [], "the scratch file is gone"


def test_detaching_while_the_thread_rotates_for_the_loop_waits_for_the_rotation(wal_dir):
    held = threading.Event()
    release = threading.Event()

    def before(kind: str, n: int) -> None:
        if kind == "rename" and n == 2:  # the first rotation (rename 1 made the first segment)
            held.set()
            assert release.wait(30)

    fs = FaultFS(wal_dir, before=before)

    async def main():
        aw = await wal.open_async(wal_dir, fs=fs, segment_size_bytes=256)
        assert aw.wal.loop_attached
        loop = asyncio.get_running_loop()
        acked = []
        try:
            later = None
            while not held.is_set():
                later = aw.append(b"x" * 40)
                await wait_until_async(lambda: later.done() or held.is_set(), 10,
                                       "the append to be acknowledged or the rotation to begin", interval_s=0.002)
                if later.done():
                    acked.append(later.result())
                    later = None
            assert aw.wal._commit.owner is Owner.ROTATING
            later = later or aw.append(b"queued behind the rotation")
            threading.Timer(0.2, release.set).start()
            aw.wal.detach_loop()  # blocks until the rotation is done
            assert release.is_set() and not aw.wal.loop_attached
            assert aw.wal._commit.owner in (Owner.IDLE, Owner.THREAD)
            acked.append(await asyncio.wait_for(later, 10))
            acked.append(await asyncio.wait_for(aw.append(b"after"), 10))
            assert len(wal.list_segments(wal_dir)) >= 2
        finally:
            release.set()
            await aw.close()
        return acked

    acked = asyncio.run(main())
    assert acked == list(range(1, len(acked) + 1))
    assert [r.lsn for r in read_all(wal_dir, mode="absolute")] == acked


def test_without_a_background_fdatasync_the_thread_keeps_flushing(wal_dir):
    class Plain(OsFileSystem):
        def async_syncer(self, directory):
            return None

    check_the_thread_flushes(wal_dir, fs=Plain())


@pytest.mark.parametrize("use_fault_fs", [False, True], ids=["os", "faultfs"])
def test_rotations_and_blocking_appends_from_threads_next_to_the_attached_loop(tmp_path, use_fault_fs):
    """1 KiB segments: a rotation every few groups, run by the flusher thread for the loop,
    while threads append with the blocking API into the same log."""
    if not use_fault_fs and not HAS_AIO:
        pytest.skip("Linux native AIO on x86_64 or aarch64")
    d = str(tmp_path / "wal")
    fs = CountingFaultFS(d) if use_fault_fs else CountingFS()
    acked: dict[int, bytes] = {}
    lock = threading.Lock()

    def blocking(w: wal.Wal, t: int) -> None:
        for i in range(60):
            p = b"t%d-%d" % (t, i)
            lsn = w.append(p)
            with lock:
                assert acked.setdefault(lsn, p) == p

    async def main():
        aw = await wal.open_async(d, fs=fs, segment_size_bytes=1024)
        assert aw.wal.loop_attached
        loop = asyncio.get_running_loop()
        try:
            threads = [loop.run_in_executor(None, blocking, aw.wal, t) for t in range(3)]

            async def producer(k: int) -> None:
                for i in range(60):
                    p = b"a%d-%d" % (k, i)
                    lsn = await aw.append(p)
                    assert acked.setdefault(lsn, p) == p

            await asyncio.gather(*threads, *(producer(k) for k in range(8)))
        finally:
            await aw.close()

    asyncio.run(main())
    assert sorted(acked) == list(range(1, 11 * 60 + 1))
    records = read_all(d, mode="absolute")
    assert {r.lsn: r.payload for r in records} == acked
    assert len(wal.list_segments(d)) > 10, "the log rotated many times"
    assert fs.submits > 20, "the loop flushed groups itself"


def test_a_loop_that_stops_with_a_flush_in_flight_is_finished_by_the_thread(wal_dir):
    """The loop's fdatasync is held; the loop stops. A blocking append from another thread
    still completes: the flusher thread finishes the loop's flush, then flushes its own."""
    held = threading.Event()
    release = threading.Event()

    def before(kind: str, n: int) -> None:
        if kind == "fdatasync" and n == 1:
            held.set()
            assert release.wait(30)

    fs = FaultFS(wal_dir, before=before)
    w = wal.Wal(wal_dir, fs=fs)
    loop = asyncio.new_event_loop()
    try:

        async def start():
            assert w.attach_loop()
            fut = w.append_one_future(b"from the loop", asyncio.get_running_loop())
            assert await asyncio.get_running_loop().run_in_executor(None, held.wait, 30)
            return fut

        fut = loop.run_until_complete(start())
        assert not loop.is_running() and w.loop_attached and not fut.done()
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("lsn", w.append(b"from a thread")))
        t.start()
        t.join(0.3)
        assert t.is_alive(), "the blocking append waits for the held fdatasync"
        release.set()
        t.join(30)
        assert out == {"lsn": 2}
        assert w.durable_lsn == 2
        assert loop.run_until_complete(asyncio.wait_for(fut, 10)) == 1
    finally:
        release.set()
        w.close()  # the loop is not running: close detaches it here
        loop.close()
    assert not w.loop_attached
    assert [r.payload for r in read_all(wal_dir)] == [b"from the loop", b"from a thread"]


@needs_aio
def test_close_from_another_thread_while_the_loop_appends(wal_dir):
    """Every append either was acknowledged (and is in the log) or was refused as closed."""
    outcomes = []

    async def main():
        aw = await wal.open_async(wal_dir)
        loop = asyncio.get_running_loop()
        fd = aw.wal._loop_flusher.syncer.fileno()

        async def producer(k: int) -> None:
            i = 0
            while True:
                p = b"%d-%d" % (k, i)
                try:
                    outcomes.append((await aw.append(p), p))
                except wal.WalClosedError:
                    return
                i += 1

        tasks = [asyncio.ensure_future(producer(k)) for k in range(16)]
        await wait_until_async(lambda: len(outcomes) >= 64, 10, "64 acknowledged appends")
        await loop.run_in_executor(None, aw.wal.close)  # the blocking close, from a worker
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert not aw.wal.loop_attached
        assert fd not in loop._selector.get_map(), "the loop no longer watches the syncer"

    asyncio.run(main())
    assert len(outcomes) > 16
    assert {r.lsn: r.payload for r in read_all(wal_dir, mode="absolute")} == dict(outcomes)
    with wal.Wal(wal_dir) as w:  # the lock was released
        assert w.append(b"next") == len(outcomes) + 1


def test_a_kick_left_in_a_loop_that_was_closed_does_not_stall_the_next_loop(wal_dir):
    """A flush request queued in loop A, which stops and is closed without running it; the log
    is detached and attached to loop B. Blocking appends from threads still get flushed."""
    w = wal.Wal(wal_dir, fs=FaultFS(wal_dir))
    a = asyncio.new_event_loop()
    try:
        async def attach():
            return w.attach_loop()

        assert a.run_until_complete(attach())
        with w._lock:
            assert w._loop_flusher.request_locked()  # queued in A, never run
        w.detach_loop()
        a.close()

        async def in_b():
            assert w.attach_loop()
            out = {}
            t = threading.Thread(target=lambda: out.setdefault("lsn", w.append(b"from a thread")), daemon=True)
            t.start()
            # The loop runs meanwhile.
            await wait_until_async(lambda: not t.is_alive(), 10, "the blocking append to be flushed")
            w.detach_loop()
            return out["lsn"]

        assert asyncio.run(in_b()) == 1
    finally:
        w.close()


@needs_aio
def test_a_blocking_close_racing_the_loops_own_close_releases_everything(wal_dir):
    for round_no in range(5):

        async def main():
            aw = await wal.open_async(wal_dir)
            futs = [aw.append(b"r%d-%d" % (round_no, i)) for i in range(50)]
            loop = asyncio.get_running_loop()
            other = loop.run_in_executor(None, aw.wal.close)
            await aw.close()
            await asyncio.wait_for(other, 10)
            return await asyncio.gather(*futs, return_exceptions=True)

        results = asyncio.run(main())
        assert all(isinstance(r, (int, wal.WalClosedError)) for r in results), results
        with wal.Wal(wal_dir) as w:  # the lock, the fds and the syncer are released
            assert w.open_result.last_lsn >= sum(isinstance(r, int) for r in results)


def test_a_loop_that_runs_again_while_it_is_being_detached_starts_no_flush(wal_dir):
    """detach_loop from another thread while the loop is stopped; the loop runs a burst in the
    middle of it. The burst's append must not start a flush the detach would then abandon
    (its future would never resolve and the fd would stay owned): the thread flushes it."""
    w = wal.Wal(wal_dir, fs=FaultFS(wal_dir))
    loop = asyncio.new_event_loop()
    try:

        async def attach():
            return w.attach_loop()

        assert loop.run_until_complete(attach())
        with w._lock:
            w._loop_flusher.detaching = True  # what detach_loop sets first, under the lock

        async def burst():
            fut = w.append_one_future(b"in the burst", asyncio.get_running_loop())
            await asyncio.sleep(0.05)  # the burst runs on: a flush its append started would show
            return fut

        fut = loop.run_until_complete(burst())
        assert w._commit.owner is Owner.IDLE and w._loop_flusher.job is None and not fut.done()
        w.detach_loop()
        assert not w.loop_attached
        assert loop.run_until_complete(asyncio.wait_for(fut, 10)) == 1
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("lsn", w.append(b"blocking")), daemon=True)
        t.start()
        t.join(10)
        assert out == {"lsn": 2}
    finally:
        w.close()
        loop.close()
    assert [r.payload for r in read_all(wal_dir)] == [b"in the burst", b"blocking"]


def test_attach_and_detach_are_checked(wal_dir):
    async def main():
        aw = await wal.open_async(wal_dir, fs=FaultFS(wal_dir))
        try:
            assert aw.wal.loop_attached
            with pytest.raises(wal.WalUsageError, match="already attached"):
                aw.wal.attach_loop()
            done = asyncio.get_running_loop().run_in_executor(None, aw.wal.detach_loop)
            with pytest.raises(wal.WalUsageError, match="attached event loop"):
                await done
            aw.wal.detach_loop()
            assert not aw.wal.loop_attached
            assert await aw.append(b"flushed by the thread") == 1
            with pytest.raises(wal.WalUsageError, match="AsyncWal.append"):
                aw.wal.append(b"blocking inside the loop")
        finally:
            await aw.close()
        with pytest.raises(wal.WalClosedError):
            aw.wal.attach_loop()

    asyncio.run(main())


# -- power loss at every call of a loop-driven workload --------------------------------------
def loop_workload(d: str, fs: FaultFS, trace: Trace) -> None:
    """Concurrent async appends and batches through the attached loop, 256-byte segments."""

    async def main():
        aw = await wal.open_async(d, fs=fs, segment_size_bytes=256)
        assert aw.wal.loop_attached
        trace.next_lsn = aw.wal.open_result.last_lsn + 1
        async def record(count: int) -> None:
            lsns = list(range(trace.next_lsn, trace.next_lsn + count))
            trace.next_lsn += count
            trace.attempted.update((x, payload(x)) for x in lsns)
            try:
                if count == 1:
                    got = [await aw.append(payload(lsns[0]))]
                else:
                    got = await aw.append_many([payload(x) for x in lsns])
            except (wal.WalFailedError, OSError):
                return
            assert got == lsns
            trace.acknowledged.update(got)

        try:
            for _ in range(4):
                # Started in this order in one pass: their LSNs are taken in this order.
                # A lost wake-up fails here instead of hanging the suite.
                await asyncio.wait_for(asyncio.gather(*(record(1) for _ in range(5)), record(3)), 30)
        finally:
            try:
                await aw.close()
            except OSError:
                pass

    try:
        asyncio.run(main())
    except OSError:  # the crash hit the open
        pass


def test_a_crash_at_every_call_of_a_loop_driven_workload_keeps_every_acknowledged_record(tmp_path):
    d = str(tmp_path / "dry-run")
    fs = FaultFS(d)
    trace = Trace()
    loop_workload(d, fs, trace)
    assert trace.acknowledged == set(trace.attempted), "no crash: everything is acknowledged"
    check_recovery(d, trace, "no crash")
    total = fs.total_ops
    assert total > 30 and fs.calls["rename"] >= 3, "the workload rotates"
    rng = random.Random(2026)
    crashed_in = set()
    for crash_at in range(1, total + 1):
        for data_mode in DATA_MODES:
            d = str(tmp_path / f"c{crash_at}-{data_mode}")
            fs = FaultFS(d, crash_at=crash_at)
            trace = Trace()
            loop_workload(d, fs, trace)
            assert fs.crash_op is not None, f"crash point {crash_at} never reached"
            crashed_in.add(fs.crash_op.split()[1])
            how = fs.materialize_crash(rng, dir_mode="random", data_mode=data_mode)
            check_recovery(d, trace, how)
            shutil.rmtree(d)
    # The loop's writes, the background fdatasyncs and the thread's rotations were all hit.
    assert {"write", "fdatasync", "rename", "fsync_dir"} <= crashed_in
