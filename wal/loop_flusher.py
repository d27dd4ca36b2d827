"""The event loop as the WAL's flusher: it writes each group and awaits its fdatasync on an eventfd."""

from __future__ import annotations

import asyncio
import threading
import time

from . import aio
from .errors import WalUsageError
from .fs import write_all
from .futures import running_loop
from .group_commit import Owner


class LoopFlusher:
    """The attached event loop's half of `Wal`'s group commit; `Wal` is the class to use.

    `Wal.attach_loop` (which `open_async` calls) lets the running loop take the flusher
    thread's place: the loop writes each group itself and starts its fdatasync through Linux
    native AIO (wal/aio.py), serves producers while the disk flushes, and acknowledges the group
    when the completion arrives on the syncer's eventfd, which it watches. The thread stays as
    the fallback: it flushes for blocking callers whenever the loop is not running, and
    finishes a loop's flush if the loop went away.

    A mixin, sharing the Wal's lock and open group: it relies on the Wal's `_lock` (with
    `_synced`, the condition on it), `_group` (the open group), `_owner` (who writes and syncs
    a group now: a group_commit.Owner), `_failed`, `fs`, `_fd` and `directory`,
    and on its methods `_check_open`, `_take_group_locked`, `_group_synced`, `_ring_locked` and
    `_fail`. The state `_init_loop_flusher` sets is its own; the Wal's flusher thread reads it to
    decide when it takes over.
    """

    def _init_loop_flusher(self) -> None:
        self._aio_loop = None  # the attached event loop (attach_loop), or None
        self._syncer = None
        self._aio_job = None  # (bytes, waiters, last_lsn, rotate_to, t0) of the loop's flush
        self._kick_pending = None  # the attached loop while a _kicked callback is queued in it
        self._detaching = False  # detach_loop is under way: the loop starts no new flush
        self._reap_lock = threading.Lock()  # one reaper of a completion: loop or thread

    def attach_loop(self) -> bool:
        """Let the running event loop flush the groups its appends fill (call it in the loop).

        The loop writes each group and starts its fdatasync without blocking (wal/aio.py),
        then acknowledges the group when the completion arrives; appends from other threads
        and loops still work (the loop flushes theirs too). Returns False, changing nothing,
        where the file system object offers no background fdatasync (`fs.async_syncer()` is
        missing or returns None): the flusher thread then goes on flushing everything.
        Call `detach_loop` in the loop before it stops; `close` does it when it can.
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            self._check_attachable_locked()
        make = getattr(self.fs, "async_syncer", None)
        syncer = make(self.directory) if make is not None else None
        if syncer is None:
            return False
        try:
            loop.add_reader(syncer.fileno(), self._on_sync_done)
        except BaseException:
            syncer.close()
            raise
        try:
            with self._lock:
                self._check_attachable_locked()  # attached, failed or closed meanwhile
                self._aio_loop = loop
                self._syncer = syncer
        except BaseException:
            loop.remove_reader(syncer.fileno())
            syncer.close()
            raise
        return True

    def _check_attachable_locked(self) -> None:
        if self._aio_loop is not None:
            raise WalUsageError(f"WAL {self.directory} is already attached to an event loop")
        self._check_open()

    @property
    def loop_attached(self) -> bool:
        """An event loop flushes this log (attach_loop)."""
        return self._aio_loop is not None

    def _loop_alive(self) -> bool:
        """An event loop is attached and running: it flushes (under the lock)."""
        loop = self._aio_loop
        return loop is not None and loop.is_running() and not loop.is_closed()

    def detach_loop(self) -> None:
        """Give flushing back to the thread: finish the loop's flush in flight (waiting for
        it, and for a rotation under way), then stop watching the syncer. Call it in the
        attached loop, or once that loop has stopped; a no-op when no loop is attached."""
        loop = self._aio_loop
        if loop is None:
            return
        if loop.is_running() and running_loop() is not loop:
            raise WalUsageError("detach_loop() must be called in the attached event loop while it runs")
        with self._lock:
            if self._aio_loop is not loop:
                return
            self._detaching = True  # the loop starts no flush from now on, even if it runs again
            while self._owner is Owner.ROTATING:
                self._synced.wait()
        # Finish the flush in flight. One the loop took just before, and has not submitted
        # yet (it restarted in another thread), is waited for too.
        while self._aio_job is not None:
            if not self._reap_loop_flush(block=True, inline=True):
                time.sleep(0.001)
        with self._reap_lock:  # nobody is reaping from the syncer while it is closed
            with self._lock:
                if self._aio_loop is not loop:
                    return  # detached meanwhile, by another caller
                syncer, self._syncer = self._syncer, None
                self._aio_loop = None
                self._detaching = False
                self._kick_pending = None
                if self._group:
                    self._ring_locked()
            if not loop.is_closed():
                loop.remove_reader(syncer.fileno())
            syncer.close()

    def _detach_from_outside(self, loop) -> None:
        """close() from a thread other than the running attached loop's: detach in the loop."""
        done = threading.Event()

        def detach() -> None:
            try:
                self.detach_loop()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(detach)
        except RuntimeError:  # closed meanwhile
            self.detach_loop()
            return
        while not done.wait(0.05):
            if not loop.is_running():  # stopped before it ran the callback
                try:
                    self.detach_loop()
                    return
                except WalUsageError:
                    continue  # running again: it runs the callback

    def _kick_locked(self) -> bool:
        """Ask the attached loop to flush the open group (under the lock); False if it is
        closed."""
        loop = self._aio_loop
        if self._kick_pending is loop:
            return True
        try:
            loop.call_soon_threadsafe(self._kicked, loop)
        except RuntimeError:
            return False
        self._kick_pending = loop  # a kick queued in a loop detached since does not count
        return True

    def _kicked(self, loop) -> None:
        with self._lock:
            if self._kick_pending is loop:
                self._kick_pending = None
        self._loop_flush()

    def _loop_flush(self) -> None:
        """In the attached loop: write the open group and start its fdatasync, unless a
        group is being flushed (its end starts the next one) or there is none."""
        with self._lock:
            if (
                self._owner is not Owner.IDLE or not self._group or self._failed is not None
                or running_loop() is not self._aio_loop or self._detaching
            ):
                return
            group, waiters, last_lsn, rotate_to = self._take_group_locked()
            self._owner = Owner.LOOP
            self._aio_job = (len(group), waiters, last_lsn, rotate_to, time.perf_counter())
            syncer = self._syncer
        try:
            write_all(self.fs, self._fd, group)
            syncer.submit(self._fd)
        except BaseException as e:  # noqa: BLE001 - every failure fails closed
            with self._reap_lock:
                self._aio_job = None
            self._fail("write/fdatasync", e, waiters)

    def _on_sync_done(self) -> None:
        """The syncer's fd turned readable: finish the group whose fdatasync completed."""
        self._reap_loop_flush(block=False)

    def _reap_loop_flush(self, *, block: bool, inline: bool = False, rescue: bool = False) -> bool:
        """Finish the loop's flush in flight if its fdatasync completed (or wait for it when
        `block`); True if one was finished. A rotation the group calls for goes to the flusher
        thread when called in the attached loop, else (or when `inline`) runs right here.
        `rescue`: the flusher thread, finishing the flush of a loop that stopped (re-checked
        here)."""
        with self._reap_lock:
            job = self._aio_job
            syncer = self._syncer
            if syncer is None or (rescue and self._loop_alive()):
                return False
            if job is None:
                if not block:
                    syncer.reap(block=False)  # the loop's callback: clears a stale count
                return False
            outcome = syncer.reap(block=block)
            if outcome is aio.PENDING:
                return False
            self._aio_job = None
        nbytes, waiters, last_lsn, rotate_to, t0 = job
        if outcome is not None:
            self._fail("write/fdatasync", outcome, waiters)
            return True
        dt = time.perf_counter() - t0
        running = running_loop()
        loop = running if not inline and running is self._aio_loop else None  # None: no loop
        try:
            self._group_synced(nbytes, waiters, last_lsn, rotate_to, dt, loop)
        except BaseException as e:
            # Interrupted (KeyboardInterrupt in the loop's thread) while it still owned the
            # fd: fail closed rather than leave the fd owned by nobody who will release it.
            if self._owner is Owner.LOOP:
                self._fail("acknowledging a group", e, waiters)
            raise
        return True
