"""EIO and ENOSPC in write and fdatasync: fail closed, never fsync again, keep what was acked."""

from __future__ import annotations

import asyncio
import errno
import shutil
import threading

import pytest

import wal
from faultfs import FaultFS
from helpers import read_all

ERRNOS = [pytest.param(errno.EIO, id="EIO"), pytest.param(errno.ENOSPC, id="ENOSPC")]
# The writer's own calls before the first append: the new segment's header is one write and
# one fsync (not fdatasync). Each group is then one write and one fdatasync.
FIRST_GROUP_WRITE = 2


class Gate:
    """Holds the flusher inside a chosen file-system call until the test releases it."""

    def __init__(self, kind: str, n: int):
        self.kind, self.n = kind, n
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, kind: str, n: int) -> None:
        if kind == self.kind and n == self.n:
            self.entered.set()
            assert self.release.wait(30), "the test never released the gate"


def _run(results: dict, name: str, fn) -> None:
    try:
        results[name] = fn()
    except BaseException as e:  # noqa: BLE001 - recorded for the assertions
        results[name] = e


@pytest.mark.parametrize("err", ERRNOS)
@pytest.mark.parametrize("kind", ["write", "fdatasync"])
def test_a_failed_write_or_fdatasync_fails_every_pending_append_and_closes_the_log(
    wal_dir, kind, err
):
    failing = FIRST_GROUP_WRITE + 2 if kind == "write" else 3  # the third group
    gate = Gate(kind, failing)
    fs = FaultFS(wal_dir, fail={kind: (failing, err)}, before=gate)
    w = wal.Wal(wal_dir, fs=fs)
    try:
        assert w.append(b"acked-1") == 1
        assert w.append_many([b"acked-2"]) == [2]
        results: dict = {}
        batch = threading.Thread(
            target=_run, args=(results, "batch", lambda: w.append_many([b"c", b"d", b"e"]))
        )
        batch.start()
        assert gate.entered.wait(30)
        others = [
            threading.Thread(target=_run, args=(results, f"t{i}", lambda i=i: w.append(b"x%d" % i)))
            for i in range(6)
        ]
        for t in others:
            t.start()
        gate.release.set()
        for t in [batch, *others]:
            t.join(30)
            assert not t.is_alive(), "an append was left hanging"
        assert set(results) == {"batch"} | {f"t{i}" for i in range(6)}
        for name, got in results.items():
            assert isinstance(got, wal.WalFailedError), (name, got)
            assert got.errno == err, name
        assert w.failed is not None and w.failed.errno == err
        assert w.durable_lsn == 2

        calls_after_failure = fs.total_ops
        syncs_after_failure = fs.calls["fdatasync"]
        for attempt in (lambda: w.append(b"more"), lambda: w.append_many([b"more", b"again"])):
            with pytest.raises(wal.WalFailedError) as e:
                attempt()
            assert e.value.errno == err
        with pytest.raises(wal.WalFailedError):
            w.mark_applied(1)
        assert fs.total_ops == calls_after_failure, "a refused append touched the disk"
    finally:
        w.close()
    w.close()
    assert fs.calls["fdatasync"] == syncs_after_failure == (3 if kind == "fdatasync" else 2)

    with wal.Wal(wal_dir) as reopened:
        recs = read_all(wal_dir)
        payloads = [r.payload for r in recs]
        assert payloads[:2] == [b"acked-1", b"acked-2"]
        # Records of the failed group may survive (the bytes may have reached the disk), but only
        # as a prefix of what was attempted, in order.
        assert payloads[2:] == [b"c", b"d", b"e"][: len(payloads) - 2]
        assert reopened.append(b"next") == len(payloads) + 1


def test_a_full_disk_mid_group_leaves_a_torn_tail_that_reopen_truncates(wal_dir):
    probe = FaultFS(wal_dir)
    with wal.Wal(wal_dir, fs=probe) as w:
        w.append(b"one")
        w.append(b"two")
        used = probe.bytes_written
    shutil.rmtree(wal_dir)
    # Room for the header and two records, then half of the third group.
    fs = FaultFS(wal_dir, disk_full_after=used + 20)
    w = wal.Wal(wal_dir, fs=fs)
    try:
        assert w.append(b"one") == 1
        assert w.append(b"two") == 2
        with pytest.raises(wal.WalFailedError) as e:
            w.append_many([b"three" * 10, b"four" * 10])
        assert e.value.errno == errno.ENOSPC
        syncs = fs.calls["fdatasync"]
        with pytest.raises(wal.WalFailedError):
            w.append(b"five")
    finally:
        w.close()
    assert fs.calls["fdatasync"] == syncs == 2
    assert [r.payload for r in read_all(wal_dir)] == [b"one", b"two"]  # the half group is torn
    with pytest.raises(wal.WalCorruptionError):
        read_all(wal_dir, mode="absolute")
    with wal.Wal(wal_dir) as w:
        assert w.open_result.truncated_bytes == 20
        assert w.append(b"three") == 3
    assert [r.payload for r in read_all(wal_dir, mode="absolute")] == [b"one", b"two", b"three"]


@pytest.mark.parametrize("engine", ["loop", "thread"])
@pytest.mark.parametrize("err", ERRNOS)
@pytest.mark.parametrize("kind", ["write", "fdatasync"])
def test_async_appends_pending_on_a_failed_fdatasync_all_fail_and_none_hangs(wal_dir, kind, err, engine):
    """`engine` "loop": the event loop writes each group and its fdatasync runs in the
    background (Wal.attach_loop); "thread": the flusher thread does both."""
    failing = FIRST_GROUP_WRITE + 1 if kind == "write" else 2  # the second group
    # The attached loop writes the group itself: holding that write would hold the loop. The
    # appends below are all framed before the loop's next pass flushes them, in one group.
    gate = None if (engine, kind) == ("loop", "write") else Gate(kind, failing)
    fs = FaultFS(wal_dir, fail={kind: (failing, err)}, before=gate)

    async def main():
        aw = await wal.open_async(wal_dir, fs=fs, attach_loop=engine == "loop")
        assert aw.wal.loop_attached == (engine == "loop")
        try:
            assert await aw.append(b"acked") == 1
            first = asyncio.ensure_future(aw.append(b"in the failing group"))
            loop = asyncio.get_running_loop()
            if gate is not None:
                assert await loop.run_in_executor(None, gate.entered.wait, 30)
            tasks = [asyncio.ensure_future(aw.append(b"p%d" % i)) for i in range(20)]
            tasks.append(asyncio.ensure_future(aw.append_many([b"m1", b"m2", b"m3"])))
            # Runs after every task above has taken its first step (enqueued its records).
            if gate is not None:
                loop.call_soon(gate.release.set)
            results = await asyncio.wait_for(
                asyncio.gather(first, *tasks, return_exceptions=True), timeout=30
            )
            for got in results:
                assert isinstance(got, wal.WalFailedError), got
                assert got.errno == err
            syncs = fs.calls["fdatasync"]
            with pytest.raises(wal.WalFailedError):
                await aw.append(b"refused")
            with pytest.raises(wal.WalFailedError):
                await aw.append_many([b"refused"])
            assert aw.durable_lsn == 1
        finally:
            await aw.close()
        await aw.close()
        return syncs

    syncs = asyncio.run(main())
    assert fs.calls["fdatasync"] == syncs == (2 if kind == "fdatasync" else 1)
    with wal.Wal(wal_dir) as w:
        recs = read_all(wal_dir)
        assert recs[0].payload == b"acked"
        assert w.append(b"after") == recs[-1].lsn + 1


def test_a_failed_segment_rotation_keeps_the_durable_group_acknowledged_and_fails_closed(wal_dir):
    # The SEAL's fdatasync is the second one: the first group fills the tiny segment. That
    # group's own fdatasync succeeded, so its append is acknowledged; the rotation after it
    # fails, and the log refuses every later append.
    fs = FaultFS(wal_dir, fail={"fdatasync": (2, errno.EIO)})
    w = wal.Wal(wal_dir, fs=fs, segment_size_bytes=64)
    try:
        assert w.append(b"x" * 40) == 1
        with pytest.raises(wal.WalFailedError) as e:
            w.append(b"refused")
        assert "rotation" in e.value.op and e.value.errno == errno.EIO
    finally:
        w.close()
    assert fs.calls["fdatasync"] == 2
    with wal.Wal(wal_dir, segment_size_bytes=64) as w:
        recs = read_all(wal_dir)
        assert [r.payload for r in recs] == [b"x" * 40]
        assert w.append(b"y") == 2
    assert [r.lsn for r in read_all(wal_dir, mode="absolute")] == [1, 2]


def test_a_failed_directory_fsync_in_mark_applied_fails_the_log_closed(wal_dir):
    # Everything is durable before mark_applied; its directory fsync (after the deletes) fails.
    # Like every failed fsync here it is not retried: the log refuses further work, and a reopen
    # reads what is on disk (segments that came back below APPLIED are ignored).
    w = wal.Wal(wal_dir, segment_size_bytes=64)
    for i in range(6):
        w.append(b"r%d" % i + b"-" * 40)
    w.close()
    fs = FaultFS(wal_dir)
    w = wal.Wal(wal_dir, fs=fs, segment_size_bytes=64)
    fs.fail = {"fsync_dir": (fs.calls["fsync_dir"] + 2, errno.EIO)}
    try:
        with pytest.raises(wal.WalFailedError) as e:
            w.mark_applied(w.durable_lsn)
        assert e.value.op == "mark_applied" and e.value.errno == errno.EIO
        with pytest.raises(wal.WalFailedError):
            w.append(b"refused")
    finally:
        w.close()
    with wal.Wal(wal_dir, segment_size_bytes=64) as w:
        assert [r.lsn for r in read_all(wal_dir)][-1] == 6
        assert w.append(b"after") == 7


def test_a_mark_applied_failure_does_not_fail_the_group_being_synced(wal_dir):
    # mark_applied fails closed while a group is inside its fdatasync: appends of that group
    # still get their own outcome (here: durable, so acknowledged); later appends are refused.
    from wal.fs import OsFileSystem

    class GatedFS(OsFileSystem):
        armed = False
        entered = threading.Event()
        release = threading.Event()

        def fdatasync(self, fd):
            if self.armed:
                self.entered.set()
                assert self.release.wait(30)
            super().fdatasync(fd)

        def fsync(self, fd):  # APPLIED.tmp's fsync, inside mark_applied
            if self.armed:
                raise OSError(errno.EIO, "injected: fsync of APPLIED")
            super().fsync(fd)

    fs = GatedFS()
    w = wal.Wal(wal_dir, fs=fs)
    try:
        w.append(b"first")
        fs.armed = True
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("lsn", w.append(b"in flight")))
        t.start()
        assert fs.entered.wait(30)
        with pytest.raises(wal.WalFailedError) as e:
            w.mark_applied(w.durable_lsn + 1)
        assert e.value.op == "mark_applied"
        fs.release.set()
        t.join(30)
        assert got == {"lsn": 2}
        with pytest.raises(wal.WalFailedError):
            w.append(b"refused")
    finally:
        fs.release.set()
        w.close()
    assert [r.payload for r in read_all(wal_dir)] == [b"first", b"in flight"]


def test_a_failure_while_the_flusher_picks_up_a_group_never_acknowledges_dropped_records(wal_dir, monkeypatch):
    # mark_applied fails (EIO) right after the flusher released the writer's lock: the group it
    # saw is dropped by that failure. The flusher must not then "sync" an empty group and
    # publish the dropped records' LSNs as durable: every append either fails or is on disk.
    import wal.writer as writer_mod

    real_lock = threading.Lock

    class HookLock:
        def __init__(self):
            self._l = real_lock()
            self.on_release = None

        def acquire(self, blocking=True, timeout=-1):
            return self._l.acquire(blocking, timeout)

        def release(self):
            self._l.release()
            if self.on_release is not None:
                self.on_release()

        __enter__ = acquire

        def __exit__(self, *exc):
            self.release()

    monkeypatch.setattr(writer_mod.threading, "Lock", HookLock)
    fs = FaultFS(wal_dir)
    w = wal.Wal(wal_dir, fs=fs)
    monkeypatch.undo()
    try:
        assert w.append(b"first") == 1
        fired = threading.Event()

        def on_release():
            # The flusher's first release of the lock once "second" is framed (LSN 2).
            if threading.current_thread().name == "wal-flusher" and not fired.is_set() and w._next_lsn == 3:
                fired.set()
                fs.fail = {"fsync_dir": (fs.calls["fsync_dir"] + 1, errno.EIO)}
                t = threading.Thread(target=lambda: pytest.raises(wal.WalFailedError, w.mark_applied, 2))
                t.start()
                t.join()

        w._lock.on_release = on_release
        outcome: dict = {}
        t = threading.Thread(target=_run, args=(outcome, "append", lambda: w.append(b"second")))
        t.start()
        t.join(30)
        w._lock.on_release = None
    finally:
        w.close()
    on_disk = [(r.lsn, r.payload) for r in wal.WalReader(wal_dir).records()]
    assert fired.is_set(), "the failure was never injected"
    if isinstance(outcome["append"], BaseException):
        assert isinstance(outcome["append"], wal.WalFailedError)
    else:  # acknowledged: then it is on disk
        assert (outcome["append"], b"second") in on_disk, (outcome, on_disk)


def test_opening_a_locked_or_damaged_log_leaks_no_file_descriptor(wal_dir):
    import os

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc")
    w = wal.Wal(wal_dir)
    try:
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(20):
            with pytest.raises(wal.WalLockedError):
                wal.Wal(wal_dir)
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        w.close()
