"""The one writer of a WAL directory: group commit, rotation, fail-closed on I/O errors.

Appends are framed and given their LSN in call order under one lock, into the current group. A
single flusher thread takes the whole group, writes it with one write and makes it durable with
one fdatasync, then acknowledges every append of the group at once: blocked threads through the
group's gate (one wake-up per group, passed from thread to thread), asyncio callers through one
`call_soon_threadsafe` per event loop per group. So concurrency raises the group size instead of
the number of fsyncs.

An event loop can take the flusher's place (`attach_loop`, which `open_async` calls; see
wal/loop_flusher.py). Both flushers work on one state object, `GroupCommit`
(wal/group_commit.py), and ask the log only what its `GroupLog` interface offers. Around the
writer: the directory lock (wal/dir_lock.py), spare
zero-filled segments (wal/spares.py), the compactor's window of recent records
(wal/retained_records.py), the flusher's doorbell (wal/doorbell.py) and the acknowledgment of
asyncio futures (wal/futures.py).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from . import format as fmt
from .dir_lock import acquire_dir_lock
from .doorbell import Doorbell
from .errors import PayloadTooLargeError, WalClosedError, WalFailedError, WalUsageError
from .fs import OsFileSystem, make_dirs, make_private, write_all, write_file_atomic
from .futures import GroupGate, acknowledge, running_loop
from .group_commit import FlusherStep, Group, GroupCommit, Owner
from .loop_flusher import LoopFlusher
from .reader import APPLIED_FILE, list_segments, read_applied_lsn, read_gaps, scan_last_segment
from .repair import continue_at, keep_torn_tail, move_aside, seal_intact
from .retained_records import RetainedRecords
from .spares import SpareSegments

DEFAULT_SEGMENT_SIZE_BYTES = 64 << 20
# Spare segments follow the recording rate (see _spare_size_for_rate): the smallest is 1 MiB (or the
# segment size, when that is smaller), and each is sized, in powers of two of the smallest, to
# last about SPARE_SECONDS at the rate the open segment was filled, up to the segment size.
MIN_SPARE_BYTES = 1 << 20
SPARE_SECONDS = 2.0
# The rate is measured over at least this long: a burst of a few milliseconds is not a rate.
_RATE_MIN_SECONDS = 0.25
# How long the flusher thread may wait for the blocking callers a group released to append
# again before it takes the next group: this fraction of the last fdatasync, at most this long.
FILL_FRACTION = 0.5
FILL_MAX_S = 0.001
_frame_record = fmt.frame_record  # the single async append's framing, looked up once
_monotonic = time.monotonic  # the clock fill rates are measured with (tests set their own)


@dataclass(frozen=True)
class OpenResult:
    """What opening the log found and did."""

    last_lsn: int
    segments: int
    truncated_bytes: int
    torn_tail_offset: Optional[int]


@dataclass(frozen=True)
class WalStats:
    """Counters since open, for metrics."""

    appends: int
    groups: int
    bytes_written: int
    fsync_seconds_total: float
    durable_lsn: int
    last_group_size: int


def _check_size(payload) -> None:
    n = len(payload)
    if n > fmt.MAX_PAYLOAD_BYTES:
        raise PayloadTooLargeError(n, fmt.MAX_PAYLOAD_BYTES)


def _check_batch(payloads: Sequence[bytes], hints) -> None:
    """Refuse a call's hints that are not a mapping, and payloads too large, before any is framed."""
    if hints is not None and not isinstance(hints, Mapping):
        raise TypeError(f"hints must be a mapping of index in payloads to hint, not {type(hints).__name__}")
    for p in payloads:
        if len(p) > fmt.MAX_PAYLOAD_BYTES:
            raise PayloadTooLargeError(len(p), fmt.MAX_PAYLOAD_BYTES)


class ThreadFlusher:
    """The flusher thread's side of the `Flusher` interface: its doorbell, and whether it
    sleeps on it. The thread runs `Wal._flusher`; it is woken (a ring, a syscall) only when it
    sleeps."""

    __slots__ = ("bell", "idle", "thread")

    def __init__(self) -> None:
        self.bell: Optional[Doorbell] = None  # made once the log is open: no fd leaks on errors
        self.idle = False  # (under the commit's lock) it sleeps on the bell, or watches the loop
        self.thread: Optional[threading.Thread] = None

    def start(self, target) -> None:
        self.bell = Doorbell()
        self.thread = threading.Thread(target=target, name="wal-flusher", daemon=True)
        self.thread.start()

    def request_locked(self) -> bool:
        """Wake the thread if it sleeps (under the commit's lock): it flushes the open group."""
        if self.idle:
            self.idle = False
            self.bell.ring()
        return True

    def ring_locked(self) -> None:
        """Wake the thread whether it sleeps or not (a rotation to run, a close)."""
        self.idle = False
        self.bell.ring()

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def sleep(self) -> None:
        self.bell.wait()

    def join(self) -> None:
        if self.thread is not None and threading.current_thread() is not self.thread:
            self.thread.join()

    def close(self) -> None:
        if self.bell is not None:
            self.bell.close()


class Wal:
    """A write-ahead log opened for appending. Sync API; see `AsyncWal` for the asyncio twin.

    `append` returns the record's LSN only after the fdatasync covering it succeeded.
    """

    def __init__(
        self,
        directory: str,
        *,
        segment_size_bytes: int = DEFAULT_SEGMENT_SIZE_BYTES,
        fs=None,
        on_group: Optional[Callable[[int, float], None]] = None,
        preallocate: bool = False,
        preallocate_after_bytes: Optional[int] = None,
    ):
        self.directory = os.path.abspath(directory)
        self.segment_size_bytes = segment_size_bytes
        self.preallocate = preallocate
        self.fs = fs or OsFileSystem()
        # Called with (bytes, seconds) after each group is written and synced; settable.
        self.on_group = on_group
        # The group commit's state (who flushes, what is pending, what is durable), under
        # its lock; `_lock` and `_synced` name its lock and condition.
        self._commit = GroupCommit(self.directory)
        self._lock = self._commit.lock
        self._synced = self._commit.synced
        self._applied_lock = threading.Lock()
        # The two flushers: the thread (always there), and the attached event loop, if any.
        self._thread_flusher = ThreadFlusher()
        self._loop_flusher = LoopFlusher(self._commit, self, self._thread_flusher)
        # The loop that will ring for the open group once its ready callbacks ran; an append
        # from any other loop schedules its own ring (a closed loop never runs its callbacks).
        self._ring_loop = None
        self._retained: Optional[RetainedRecords] = None  # see retain()
        self._appends = 0
        self._groups = 0
        self._bytes = 0
        self._fsync_s = 0.0
        self._last_group = 0
        self._lock_fd: Optional[int] = None
        self._fd: Optional[int] = None
        # Spare segments (preallocate), made by their own thread when asked for: for a plain
        # segment once this much was written in it since it was opened (so that a short-lived
        # writer, a script, a test, never zero-fills anything), for a preallocated one once it
        # is half full. Each is sized by the rate the open segment fills at (_spare_size_for_rate).
        self._min_spare = min(MIN_SPARE_BYTES, segment_size_bytes)
        self._prealloc_after = (
            self._min_spare // 2 if preallocate_after_bytes is None else preallocate_after_bytes
        )
        self._spares: Optional[SpareSegments] = None
        self._spare_ready = False  # (under the lock) a spare is ready for the next rotation
        self._spare_size = 0  # (under the lock) the ready spare's size
        self._spare_asked = False  # a spare was asked for and not yet installed
        self._spare_at: Optional[int] = None  # ask for a spare once the open segment is this long
        self._prealloc = False  # the open segment was zero-filled ahead of its writes
        self._bound = segment_size_bytes  # the open segment is sealed once this long
        self._rate_mark = (0.0, 0)  # (time, segment length) the fill rate is measured from
        make_dirs(self.fs, self.directory)
        self._lock_fd = acquire_dir_lock(self.directory, self.fs)
        try:
            self.open_result = self._recover()
        except BaseException:
            self._release_lock()
            raise
        self._thread_flusher.start(self._flusher)
        if preallocate:
            self._spares = SpareSegments(self.fs, self.directory, self._spare_made)
            self._spare_event = self._spares.ready_event  # set once a spare is ready (tests wait on it)
            with self._lock:
                size = self._spare_due_locked()
            if size:
                self._spares.request(size)

    # -- opening -------------------------------------------------------------------------
    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def _recover(self) -> OpenResult:
        """Remove temp files, validate the last segment, truncate a torn tail (its bytes kept
        first), continue after a gap a repair recorded, open for append."""
        for name in os.listdir(self.directory):
            if name.endswith(".tmp"):
                self.fs.unlink(os.path.join(self.directory, name))
        segs = list_segments(self.directory)
        if not segs:
            applied = read_applied_lsn(self.directory)
            first = read_gaps(self.directory).get(applied - 1, applied)  # a repair's gap, if any
            self._next_lsn = first
            self._create_segment(1, first)
            return OpenResult(first - 1, 1, 0, None)
        tail = scan_last_segment(self.directory, segs)
        last = tail.segment
        end = tail.end_offset
        next_lsn = tail.next_lsn
        size = os.path.getsize(last.path)
        torn = tail.torn_tail.offset if tail.torn_tail is not None else None
        # Past `end` there is a torn tail (cut it), or only the zeros of a preallocated segment
        # (the reader checked): those are kept and written over, unless the segment is sealed.
        truncated = size - end if (torn is not None or tail.sealed) else 0
        if torn is not None:
            # Cut bytes may hold an acknowledged record a flipped bit made unreadable: kept.
            keep_torn_tail(self.fs, last.path, end, next_lsn)
        # After a gap a repair recorded, the log continues at its end (a crash may have come
        # before the repair made the segment that starts there).
        floor = read_gaps(self.directory).get(next_lsn - 1, next_lsn)
        fd = self.fs.open(last.path, os.O_WRONLY)
        try:
            make_private(fd)  # written to from now on: a segment an older version made may be 0644
            if truncated:
                self.fs.ftruncate(fd, end)
            # Bytes a killed process left in the page cache are durable only once synced.
            self.fs.fdatasync(fd)
            os.lseek(fd, end, os.SEEK_SET)
        except BaseException:
            self.fs.close(fd)
            raise
        if floor > next_lsn:
            self.fs.close(fd)
            continue_at(self.fs, self.directory, floor)
            opened = self._recover()
            return OpenResult(opened.last_lsn, opened.segments, truncated, torn)
        kept = size - truncated  # past `end`: zeros, preallocated
        self._set_segment(fd, last.number, last.first_lsn, tail.seed, end, kept if kept > end else 0)
        if self._prealloc:
            # Reopened inside a preallocated segment: a spare once it is half full, and not
            # before this writer wrote as much as a plain segment asks for first.
            self._spare_at = max(self._bound // 2, end + self._prealloc_after)
        self._next_lsn = next_lsn
        self._commit.durable_lsn = next_lsn - 1
        self._commit.last_lsn = next_lsn - 1
        self._encode_seed = self._seed
        if tail.sealed:
            self.fs.close(fd)
            self._fd = None
            self._create_segment(last.number + 1, next_lsn)
        return OpenResult(next_lsn - 1, len(segs), truncated, torn)

    def _create_segment(self, number: int, first_lsn: int) -> None:
        """Open the log on a new, empty segment (a new log, or the last one was sealed)."""
        salt = secrets.randbits(32)
        fd = self._create_segment_file(salt, number, first_lsn)
        self._set_segment(fd, number, first_lsn, fmt.salt_seed(salt), fmt.SEGMENT_HEADER_SIZE, 0)
        self._encode_seed = self._seed
        self._commit.durable_lsn = first_lsn - 1
        self._commit.last_lsn = first_lsn - 1

    def _create_segment_file(self, salt: int, number: int, first_lsn: int) -> int:
        """Write a new segment file holding its header (atomically); its fd, after the header."""
        name = fmt.segment_name(number, first_lsn)
        write_file_atomic(self.fs, self.directory, name, fmt.encode_segment_header(salt, number, first_lsn))
        fd = self.fs.open(os.path.join(self.directory, name), os.O_WRONLY)
        os.lseek(fd, fmt.SEGMENT_HEADER_SIZE, os.SEEK_SET)
        return fd

    def _set_segment(
        self, fd: int, number: int, first_lsn: int, seed: int, end: int, prealloc_size: int
    ) -> None:
        """Make `fd` the open segment, written up to byte `end`; `prealloc_size`: the length of
        the file zero-filled ahead of its writes (0: a plain segment, appended to).

        A preallocated segment is sealed once its zeros are used up (at most at the configured
        segment size), a plain one at the segment size, or earlier when a spare is ready."""
        self._fd = fd
        self._segment_number = number
        self._segment_first = first_lsn
        self._seed = seed
        self._segment_bytes = end
        self._prealloc = prealloc_size > end
        self._rate_mark = (_monotonic(), end)
        if self._prealloc:
            # Sealed before fewer zeros than a record header would be left after the last
            # record: the reader tells the end of the data by a zero record header followed by
            # zeros, and a shorter run of zeros at the end of a file is a torn record.
            self._bound = min(prealloc_size - (fmt.RECORD_HEADER_SIZE - 1), self.segment_size_bytes)
            self._spare_at = max(self._bound // 2, end)  # the next spare once half full
        else:
            self._bound = self.segment_size_bytes
            # A spare asked for already (not ready in time for this rotation) is taken as soon
            # as it is ready; else one is asked for once this segment has grown a little.
            self._spare_at = None if self._spare_asked else end + self._prealloc_after

    # -- the event loop as flusher (wal/loop_flusher.py) ---------------------------------
    def attach_loop(self) -> bool:
        """Let the running event loop flush the groups its appends fill (call it in the loop).

        The loop writes each group and starts its fdatasync without blocking (wal/aio.py),
        then acknowledges the group when the completion arrives; appends from other threads
        and loops still work (the loop flushes theirs too). Returns False, changing nothing,
        where the file system object offers no background fdatasync (`fs.async_syncer()` is
        missing or returns None): the flusher thread then goes on flushing everything.
        Call `detach_loop` in the loop before it stops; `close` does it when it can.
        """
        return self._loop_flusher.attach()

    def detach_loop(self) -> None:
        """Give flushing back to the thread: finish the loop's flush in flight (waiting for
        it, and for a rotation under way), then stop watching the syncer. Call it in the
        attached loop, or once that loop has stopped; a no-op when no loop is attached."""
        self._loop_flusher.detach()

    @property
    def loop_attached(self) -> bool:
        """An event loop flushes this log (attach_loop)."""
        return self._loop_flusher.loop is not None

    # -- appending -----------------------------------------------------------------------
    def _check_open(self) -> None:
        self._commit.check_open()

    def _encode_all_locked(self, payloads: Sequence[bytes], hints) -> list[int]:
        """Frame `payloads` into the open group (sizes already checked); their LSNs."""
        first = self._next_lsn
        group = self._commit.data
        mark = len(group)
        try:
            nxt = fmt.frame_data_records(group, self._encode_seed, first, payloads)
        except BaseException:
            # A payload that is not bytes: nothing of the call is framed, and no LSN is taken.
            del group[mark:]
            raise
        self._next_lsn = nxt
        self._commit.last_lsn = nxt - 1
        retained = self._retained
        if retained is not None:
            keep = retained.keep
            if hints is None:
                for i, p in enumerate(payloads):
                    keep(first + i, p, None)
            else:
                for i, p in enumerate(payloads):
                    keep(first + i, p, hints.get(i))
        return list(range(first, nxt))

    def _enqueue(self, payloads: Sequence[bytes], hints=None) -> tuple[list[int], GroupGate]:
        """Frame a blocking caller's records into the open group; their LSNs, and the gate of
        that group to wait on."""
        _check_batch(payloads, hints)
        with self._lock:
            self._check_open()
            lsns = self._encode_all_locked(payloads, hints)
            self._appends += len(lsns)
            gate = self._gate_locked()
        return lsns, gate

    def _gate_locked(self) -> GroupGate:
        """The open group's gate, for a blocking caller whose records were just framed into it
        (under the lock); sees that the group gets flushed."""
        gate, _new = self._commit.gate_locked()
        self._wake_locked()
        return gate

    def _wake_locked(self) -> None:
        """After an append made outside the attached loop (under the lock): see that its
        group gets flushed, by the attached loop while it runs, else by the flusher thread."""
        looper = self._loop_flusher
        if looper.alive() and (self._commit.owner is not Owner.IDLE or looper.request_locked()):
            return  # the flush in flight (or the rotation) starts the next one when done
        self._thread_flusher.request_locked()

    def _wait_durable(self, lsn: int, gate: GroupGate) -> None:
        # The group's gate opens once it is durable: one wake-up per group, passed along. The
        # wait is timed, so that nothing a waiter did wrong with the gate can leave a thread
        # waiting: the checks below then decide.
        commit = self._commit
        looper = self._loop_flusher
        if gate.wait(1.0 if looper.loop is None else 0.1) and commit.durable_lsn >= lsn:
            return
        # A failure, a close, or an attached loop that did not flush in time: look closer.
        with commit.lock:
            while commit.durable_lsn < lsn:
                # A failure elsewhere (mark_applied) does not stop the group being written: an
                # append in it waits for that group's own outcome.
                if commit.failed is not None and lsn > commit.writing_lsn:
                    raise commit.failed
                if commit.closed and not self._thread_flusher.alive():
                    raise WalClosedError(f"WAL {self.directory} closed before LSN {lsn} was synced")
                if looper.loop is None:
                    commit.synced.wait()
                elif not commit.synced.wait(0.1) and not looper.alive():
                    self._thread_flusher.request_locked()  # the loop stopped: the thread takes over

    def append(self, payload: bytes, hint=None) -> int:
        """Append one record; return its LSN once it is durable (after fdatasync).

        `hint` (any object) is kept with the record in memory only, for `take_retained`."""
        if running_loop() is not None:
            raise WalUsageError(
                "Wal.append() blocks and was called inside a running event loop; "
                "use `await AsyncWal.append()` (wal.open_async) there"
            )
        _check_size(payload)
        with self._lock:
            lsn = self._frame_one_locked(payload, hint)
            gate = self._gate_locked()
        self._wait_durable(lsn, gate)
        return lsn

    def append_many(self, payloads: Sequence[bytes], hints=None) -> list[int]:
        """Append records in order; return their LSNs once all are durable. `hints`: an
        optional mapping of index in `payloads` to that record's hint (see `append`)."""
        if running_loop() is not None:
            raise WalUsageError(
                "Wal.append_many() blocks and was called inside a running event loop; "
                "use `await AsyncWal.append_many()` (wal.open_async) there"
            )
        if not payloads:
            return []
        lsns, gate = self._enqueue(payloads, hints)
        self._wait_durable(lsns[-1], gate)
        return lsns

    def append_future(
        self, payloads: Sequence[bytes], loop: asyncio.AbstractEventLoop, hints=None
    ) -> asyncio.Future:
        """Enqueue records; the returned future (of `loop`) resolves to their LSNs once durable.
        `hints` as for `append_many`."""
        _check_batch(payloads, hints)
        fut = loop.create_future()
        with self._lock:
            self._check_open()
            lsns = self._encode_all_locked(payloads, hints)
            if not lsns:  # nothing to wait for (no callback is attached yet: safe off-loop)
                fut.set_result(lsns)
                return fut
            self._appends += len(lsns)
            self._commit.waiters.append((loop, fut, lsns))
            if self._thread_flusher.idle and self._ring_loop is not loop:
                self._ring_for(loop)
        return fut

    def append_one_future(self, payload, loop: asyncio.AbstractEventLoop, hint=None) -> asyncio.Future:
        """`append_future` for one record: the future resolves to its LSN. The hot path of
        asyncio callers, so it is written out rather than shared."""
        _check_size(payload)
        fut = loop.create_future()
        with self._lock:
            lsn = self._frame_one_locked(payload, hint)
            self._commit.waiters.append((loop, fut, lsn))
            if self._thread_flusher.idle and self._ring_loop is not loop:
                self._ring_for(loop)
        return fut

    def _frame_one_locked(self, payload, hint) -> int:
        """Frame one record (its size checked) into the open group, under the lock; its LSN.
        The single appends' hot path, shorter than `_encode_all_locked`."""
        commit = self._commit
        if commit.failed is not None or commit.closed:
            commit.check_open()
        lsn = self._next_lsn
        _frame_record(commit.data, self._encode_seed, lsn, fmt.TYPE_DATA, payload)
        self._next_lsn = lsn + 1
        commit.last_lsn = lsn
        if self._retained is not None:
            self._retained.keep(lsn, payload, hint)
        self._appends += 1
        return lsn

    def _ring_for(self, loop) -> None:
        """Wake the idle flusher for an append made for `loop` (under the lock)."""
        if running_loop() is loop:
            # Ring once the loop has run what is ready now: the other producers woken by the
            # last acknowledgment (or the other connections read in this pass) join this
            # group, and the flusher wakes to a free GIL instead of taking the group a record
            # at a time from a busy loop, trading the GIL back and forth at each syscall.
            self._ring_loop = loop
            loop.call_soon(self._ring_later, loop)
        else:  # not called from `loop` running in this thread: nothing would ring
            self._wake_locked()

    def _ring_later(self, loop) -> None:
        with self._lock:
            if self._ring_loop is loop:
                self._ring_loop = None
            flush_here = self._loop_flusher.loop is loop  # this loop flushes, below, outside the lock
            if not flush_here and self._commit.data:
                self._thread_flusher.request_locked()
        if flush_here:
            self._loop_flusher.flush()

    # -- records kept in memory for an in-process consumer -------------------------------
    def retain(self, max_records: int, max_bytes: int = 32 << 20) -> None:
        """Keep up to `max_records` appended records (and `max_bytes` of their payloads) in
        memory for `take_retained`, so that an in-process consumer (the compactor) need not
        read back from disk what was just written. 0 turns it off and drops what is kept.
        Past either bound everything kept is dropped (a consumer that fell behind reads the
        segments) and keeping starts over."""
        max_records = max(0, int(max_records))
        max_bytes = max(0, int(max_bytes))
        with self._lock:
            if not max_records:
                self._retained = None
            elif self._retained is None:
                self._retained = RetainedRecords(max_records, max_bytes)
            else:
                self._retained.max_records = max_records
                self._retained.max_bytes = max_bytes

    def take_retained(self, first_lsn: int, max_records: int, to_lsn: int) -> Optional[list]:
        """Up to `max_records` durable records from `first_lsn` on, none past `to_lsn`, as
        (lsn, payload, hint) in LSN order, dropping them and any before them from memory; None
        when `first_lsn` is not kept (read it from the segments with a WalReader instead).
        `hint` is what the appender passed along with the payload (or None)."""
        with self._lock:
            if self._retained is None:
                return None
            return self._retained.take(first_lsn, max_records, min(to_lsn, self._commit.durable_lsn))

    # -- the flusher ---------------------------------------------------------------------
    def take_group_locked(self) -> Group:
        """The open group, taken for flushing (under the lock; the group is not empty); part
        of the `GroupLog` the flushers use."""
        data, waiters, last_lsn = self._commit.take_locked()
        fmt.mark_group_start(data, self._encode_seed)  # the seed it was framed with
        rotate_to = None
        if self._segment_bytes + len(data) >= self._bound or (
            # A plain segment (the first after open) is left early for a zero-filled spare,
            # once one is ready: fdatasync over preallocated blocks skips the file-size journal
            # commit that an append costs.
            self._spare_ready and not self._prealloc
        ):
            # Appends framed from now on belong to the next segment: give them its salt.
            salt = secrets.randbits(32)
            rotate_to = (salt, self._segment_number + 1, last_lsn + 1)
            self._encode_seed = fmt.salt_seed(salt)
        return Group(data, waiters, last_lsn, rotate_to)

    def write_group(self, group: Group) -> int:
        """Write a taken group to the open segment (its flusher owns the fd); the fd to sync."""
        fd = self._fd
        write_all(self.fs, fd, group.data)
        return fd

    def _flusher(self) -> None:
        """The flusher thread: flushes the groups nobody else does, rotates for the attached
        loop, and finishes the flush of a loop that went away."""
        commit = self._commit
        thread = self._thread_flusher
        looper = self._loop_flusher
        while True:
            with commit.lock:
                # Decide and take the group under one hold of the lock: a failure in between
                # (mark_applied) empties the group, and an empty group must never be "synced".
                taken = None
                if commit.rotation is not None:  # the attached loop's, see group_synced
                    taken, rotation, commit.rotation = FlusherStep.ROTATE, commit.rotation, None
                elif commit.owner is not Owner.IDLE:
                    # The attached loop is flushing. Stay awake while it does (a blocking
                    # caller rang): if the loop goes away mid-flush, finish its flush here.
                    rescue = commit.owner is Owner.LOOP and looper.job is not None and not looper.alive()
                    taken = FlusherStep.RESCUE if rescue else FlusherStep.WATCH
                elif not commit.data:
                    if commit.closed:
                        return
                    thread.idle = True
                elif looper.alive() and looper.request_locked():
                    taken = FlusherStep.WATCH  # the loop flushes the group; watch that it does
                elif commit.want and (wait := commit.filling_locked(time.perf_counter())):
                    commit.filled.wait(wait)  # see GroupCommit.expect_locked
                    continue
                else:
                    taken = self.take_group_locked()
                    commit.owner = Owner.THREAD
                if taken is FlusherStep.WATCH:
                    thread.idle = True  # the loop's own appends schedule its flushes
                    commit.watch.wait(0.05)
                    continue
            if taken is None:
                thread.sleep()
                continue
            if taken is FlusherStep.RESCUE:
                if not looper.reap(block=True, rescue=True):
                    with commit.lock:  # the loop runs again, or it was detached meanwhile
                        commit.watch.wait(0.05)
                continue
            if taken is FlusherStep.ROTATE:
                if not self._rotate_and_release(*rotation):
                    return
                continue  # the next pass hands the open group back to the loop
            try:
                t0 = time.perf_counter()
                self.fs.fdatasync(self.write_group(taken))
                dt = time.perf_counter() - t0
            except BaseException as e:  # noqa: BLE001 - every failure fails closed
                self.fail("write/fdatasync", e, taken.waiters)
                return
            if not self.group_synced(taken, dt, None):
                return

    def group_synced(self, group: Group, dt: float, loop) -> bool:
        """A group's fdatasync succeeded: acknowledge it, then rotate if it was the last of
        its segment (in the flusher thread when `loop`, the attached loop, is running this).
        Leaves the commit's owner set while a rotation runs. False if the rotation failed."""
        nbytes, waiters, rotate_to = len(group.data), group.waiters, group.rotate_to
        commit = self._commit
        with commit.lock:
            commit.synced_locked(group.last_lsn)
            self._groups += 1
            self._bytes += nbytes
            self._fsync_s += dt
        self._last_group = len(waiters)
        if self.on_group is not None:
            # Before the fd is released: the next group's report never overtakes this one.
            try:
                self.on_group(nbytes, dt)
            except Exception:  # noqa: BLE001 - metrics must never break the log
                pass
        spare = 0
        if rotate_to is None:
            with commit.lock:
                self._segment_bytes += nbytes
                commit.owner = Owner.IDLE
                if loop is None:
                    commit.expect_locked(time.perf_counter(), min(FILL_FRACTION * dt, FILL_MAX_S))
                if self._spare_at is not None and self._segment_bytes >= self._spare_at:
                    spare = self._spare_due_locked()
            if spare:
                self._spares.request(spare)
            if loop is not None:
                # Start the next group's fdatasync before acknowledging this one: the disk
                # works while the loop runs the producers this acknowledgment wakes.
                self._loop_flusher.flush()
        acknowledge(waiters, None)
        retained = self._retained
        if retained is not None and retained.dropped is not None:
            retained.dropped = None  # a window dropped under the lock is freed here, outside it
        if rotate_to is None:
            return True
        if loop is not None:
            # Its blocking calls (seal, fdatasync, rename, directory fsync) go to the flusher
            # thread, which hands flushing back to the loop when it is done.
            with commit.lock:
                commit.owner = Owner.ROTATING
                commit.rotation = (rotate_to, group.last_lsn)
                self._thread_flusher.ring_locked()  # whether it sleeps on the bell ...
                commit.watch.notify()  # ... or watches the loop
            return True
        return self._rotate_and_release(rotate_to, group.last_lsn)

    def _rotate_and_release(self, rotate_to, last_lsn: int) -> bool:
        # The group is durable and acknowledged; a failed rotation fails closed only the
        # appends queued behind it (already framed for the next segment).
        try:
            self._rotate(rotate_to, last_lsn)
        except BaseException as e:  # noqa: BLE001
            self.fail("segment rotation", e, [])
            return False
        with self._lock:
            self._commit.owner = Owner.IDLE
            self._synced.notify_all()
        return True

    def _rotate(self, rotate_to, last_lsn: int) -> None:
        """Seal the open segment after `last_lsn` and open the next one, in the spare if one
        is ready."""
        salt, number, first_lsn = rotate_to
        data_records = last_lsn - self._segment_first + 1
        write_all(self.fs, self._fd, fmt.encode_seal(self._seed, last_lsn, data_records))
        self.fs.fdatasync(self._fd)
        if self._prealloc:
            # A sealed segment ends with its SEAL record: drop the unused preallocated zeros.
            self.fs.ftruncate(self._fd, os.lseek(self._fd, 0, os.SEEK_CUR))
            self.fs.fdatasync(self._fd)
        self.fs.close(self._fd)
        self._fd = None
        with self._lock:
            spare_size = self._spare_size if self._spare_ready else 0
            self._spare_ready = False
        if spare_size:
            self._spare_asked = False
            name = fmt.segment_name(number, first_lsn)
            fd = self._spares.install(name, fmt.encode_segment_header(salt, number, first_lsn))
        else:
            fd = self._create_segment_file(salt, number, first_lsn)
        self._set_segment(fd, number, first_lsn, fmt.salt_seed(salt), fmt.SEGMENT_HEADER_SIZE, spare_size)

    # -- spare segments (preallocate) ----------------------------------------------------
    def _spare_due_locked(self) -> int:
        """The size of the spare to ask for now (under the lock), once the open segment has
        reached the length set for it (`_spare_at`); 0 when none is due. Asks only once."""
        if (
            self._spares is None or self._spare_at is None or self._spare_asked
            or self._segment_bytes < self._spare_at
        ):
            return 0
        self._spare_at = None
        self._spare_asked = True
        return self._spare_size_for_rate()

    def _spare_size_for_rate(self) -> int:
        """Enough zero-filled bytes for about SPARE_SECONDS at the rate the open segment was
        filled: the smallest spare, doubled until it holds that much, at most the segment size.
        A log that records little keeps small segments; a busy one gets whole ones."""
        since, mark = self._rate_mark
        elapsed = max(_monotonic() - since, _RATE_MIN_SECONDS)
        wanted = (self._segment_bytes - mark) / elapsed * SPARE_SECONDS
        size = self._min_spare
        while size < wanted and size < self.segment_size_bytes:
            size *= 2
        return min(size, self.segment_size_bytes)

    def _spare_made(self, size: int) -> None:
        """The spare thread made a spare of `size` bytes: the next rotation may use it."""
        with self._lock:
            self._spare_ready = True
            self._spare_size = size

    def fail(self, op: str, cause: BaseException, waiters, *, from_flusher: bool = True) -> None:
        """Fail closed: `waiters` and every pending append fail with a WalFailedError, and
        appends are refused from now on (an fsync is never retried). `from_flusher`: the
        flusher of the group in flight failed (else, mark_applied: that group's own outcome
        still decides its appends)."""
        err = WalFailedError(op, cause)
        with self._lock:
            rest = self._commit.fail_locked(err, from_flusher)
            if self._retained is not None:
                self._retained.clear()  # what was not durable never will be
        if self._spares is not None:
            self._spares.stop()
        acknowledge(waiters + rest, err)

    # -- truncation below an applied LSN -------------------------------------------------
    def mark_applied(self, lsn: int) -> int:
        """Declare every record below `lsn` applied elsewhere; delete sealed segments below it.

        Returns the number of segments deleted.
        """
        with self._lock:
            self._check_open()
            if lsn > self._commit.durable_lsn + 1:
                raise WalUsageError(
                    f"cannot mark LSN {lsn} applied: only LSNs up to {self._commit.durable_lsn} are durable"
                )
            current = self._segment_number
        with self._applied_lock:  # one at a time: they share APPLIED.tmp and the deletes
            applied = read_applied_lsn(self.directory)
            try:
                if lsn > applied:
                    write_file_atomic(self.fs, self.directory, APPLIED_FILE, f"{lsn}\n".encode())
                lsn = max(lsn, applied)  # the applied LSN never moves backwards
                segs = list_segments(self.directory)
                gaps = read_gaps(self.directory)
                deleted = 0
                for seg, nxt in zip(segs, segs[1:]):
                    if seg.number >= current or nxt.first_lsn > lsn:
                        break
                    if seal_intact(seg.path, seg.first_lsn, nxt.first_lsn, gaps):
                        self.fs.unlink(seg.path)
                    else:
                        move_aside(self.fs, seg.path)  # the evidence of damage is never deleted
                    deleted += 1
                if deleted:
                    self.fs.fsync_dir(self.directory)
            except OSError as e:
                # A failed fsync of the directory (or of APPLIED) is not retried, as everywhere
                # in this log: fail closed; reopening recovers from what is on disk.
                self.fail("mark_applied", e, [], from_flusher=False)
                raise self._commit.failed from e
        return deleted

    @property
    def applied_lsn(self) -> int:
        return read_applied_lsn(self.directory)

    # -- state ---------------------------------------------------------------------------
    @property
    def durable_lsn(self) -> int:
        """The last LSN covered by a successful fdatasync."""
        return self._commit.durable_lsn

    @property
    def failed(self) -> Optional[WalFailedError]:
        return self._commit.failed

    def stats(self) -> WalStats:
        with self._lock:
            return WalStats(
                self._appends, self._groups, self._bytes, self._fsync_s, self._commit.durable_lsn,
                self._last_group,
            )

    def close(self) -> None:
        """Flush what is queued, stop the flusher, release the lock. Safe to call twice.

        With an event loop attached, call it from that loop's thread (`AsyncWal.close` does)
        or once the loop has stopped; from another thread while the loop runs, the loop keeps
        flushing until the queue is empty and is then detached through a callback."""
        looper = self._loop_flusher
        loop = looper.loop
        if loop is not None and (running_loop() is loop or not loop.is_running()):
            try:
                looper.detach()
            except WalUsageError:
                pass  # it started running again: detached through it below
        with self._lock:
            if self._commit.closed:
                return
            self._commit.closed = True
            self._thread_flusher.ring_locked()
            self._commit.filled.notify()  # a flusher thread waiting for a group to fill
        if self._spares is not None:
            self._spares.stop()
        self._thread_flusher.join()
        loop = looper.loop
        if loop is not None:
            looper.detach_from_outside(loop)
        if self._spares is not None:
            self._spares.join()
            self._spares.discard()
        with self._lock:
            self._synced.notify_all()
        self._thread_flusher.close()
        if self._fd is not None:
            try:
                self.fs.close(self._fd)
            except OSError:
                pass
            self._fd = None
        self._release_lock()

    def __enter__(self) -> "Wal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        commit = getattr(self, "_commit", None)
        if getattr(self, "_lock_fd", None) is not None and commit is not None and not commit.closed:
            import warnings

            warnings.warn(f"Wal {self.directory} was never closed", ResourceWarning, stacklevel=1)


class AsyncWal:
    """The asyncio twin of `Wal`: the same names, awaited; never blocks the event loop."""

    def __init__(self, wal: Wal):
        self.wal = wal

    @property
    def directory(self) -> str:
        return self.wal.directory

    @property
    def durable_lsn(self) -> int:
        return self.wal.durable_lsn

    def append(self, payload: bytes) -> "asyncio.Future[int]":
        """Append one record: `await` it for the LSN, which comes back once it is durable.

        A plain method returning a future rather than a coroutine: the record is framed and
        queued at call time, in call order, and no coroutine frame is paid per event.
        """
        return self.wal.append_one_future(payload, asyncio.get_running_loop())

    async def append_many(self, payloads: Sequence[bytes]) -> list[int]:
        """Append records in order; their LSNs come back once all are durable."""
        if not payloads:
            return []
        return await self.wal.append_future(payloads, asyncio.get_running_loop())

    async def mark_applied(self, lsn: int) -> int:
        return await asyncio.get_running_loop().run_in_executor(None, self.wal.mark_applied, lsn)

    def stats(self) -> WalStats:
        return self.wal.stats()

    async def close(self) -> None:
        self.wal.detach_loop()  # waits for the fdatasync (or rotation) under way
        await asyncio.get_running_loop().run_in_executor(None, self.wal.close)


def open_wal(directory: str, **kwargs) -> Wal:
    """Open (creating if needed) the WAL in `directory` for appending; runs tail recovery."""
    return Wal(directory, **kwargs)


async def open_async(directory: str, *, attach_loop: bool = True, **kwargs) -> AsyncWal:
    """Open the WAL for asyncio callers (recovery runs in a worker thread).

    With `attach_loop` (the default) the running loop flushes its groups itself where the
    machine offers a background fdatasync (`Wal.attach_loop`); close it with `AsyncWal.close`
    in that loop."""
    loop = asyncio.get_running_loop()
    wal = await loop.run_in_executor(None, lambda: Wal(directory, **kwargs))
    if attach_loop:
        try:
            wal.attach_loop()
        except BaseException:
            wal.close()
            raise
    return AsyncWal(wal)
