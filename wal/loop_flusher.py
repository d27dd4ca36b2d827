"""The event loop as the WAL's flusher: it writes each group and awaits its fdatasync on an eventfd."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Optional

from . import aio
from .errors import WalUsageError
from .futures import running_loop
from .group_commit import Flusher, GroupCommit, GroupLog, Owner


class LoopFlusher:
    """The attached event loop's half of the group commit (a `Flusher`); `Wal.attach_loop`
    makes the running loop this flusher.

    The loop writes each group itself and starts its fdatasync through Linux native AIO
    (wal/aio.py), serves producers while the disk flushes, and acknowledges the group when the
    completion arrives on the syncer's eventfd, which it watches. The flusher thread
    (`fallback`) stays: it flushes for blocking callers whenever the loop is not running, and
    finishes a loop's flush if the loop went away.

    It works on the group commit's state (`commit`, under its lock) and asks the log only what
    `GroupLog` offers: take a group, write it, report it synced, fail closed.
    """

    def __init__(self, commit: GroupCommit, log: GroupLog, fallback: Flusher) -> None:
        self._commit = commit
        self._log = log
        self._fallback = fallback
        self.loop: Optional[asyncio.AbstractEventLoop] = None  # the attached loop, or None
        self.syncer = None
        self.job = None  # (group, t0) of the loop's flush in flight
        self._kick_pending = None  # the attached loop while a _kicked callback is queued in it
        self.detaching = False  # detach is under way: the loop starts no new flush
        self._reap_lock = threading.Lock()  # one reaper of a completion: loop or thread

    def attach(self) -> bool:
        """Make the running loop the flusher (see `Wal.attach_loop`); False, changing nothing,
        where the file system object offers no background fdatasync."""
        loop = asyncio.get_running_loop()
        with self._commit.lock:
            self._check_attachable_locked()
        make = getattr(self._log.fs, "async_syncer", None)
        syncer = make(self._log.directory) if make is not None else None
        if syncer is None:
            return False
        try:
            loop.add_reader(syncer.fileno(), self._on_sync_done)
        except BaseException:
            syncer.close()
            raise
        try:
            with self._commit.lock:
                self._check_attachable_locked()  # attached, failed or closed meanwhile
                self.loop = loop
                self.syncer = syncer
        except BaseException:
            loop.remove_reader(syncer.fileno())
            syncer.close()
            raise
        return True

    def _check_attachable_locked(self) -> None:
        if self.loop is not None:
            raise WalUsageError(f"WAL {self._log.directory} is already attached to an event loop")
        self._commit.check_open()

    def alive(self) -> bool:
        """An event loop is attached and running: it flushes (under the lock)."""
        loop = self.loop
        return loop is not None and loop.is_running() and not loop.is_closed()

    def detach(self) -> None:
        """Give flushing back to the thread: finish the loop's flush in flight (waiting for
        it, and for a rotation under way), then stop watching the syncer. Call it in the
        attached loop, or once that loop has stopped; a no-op when no loop is attached."""
        loop = self.loop
        if loop is None:
            return
        if loop.is_running() and running_loop() is not loop:
            raise WalUsageError("detach_loop() must be called in the attached event loop while it runs")
        commit = self._commit
        with commit.lock:
            if self.loop is not loop:
                return
            self.detaching = True  # the loop starts no flush from now on, even if it runs again
            while commit.owner is Owner.ROTATING:
                commit.synced.wait()
        # Finish the flush in flight. One the loop took just before, and has not submitted
        # yet (it restarted in another thread), is waited for too.
        while self.job is not None:
            if not self.reap(block=True, inline=True):
                time.sleep(0.001)
        with self._reap_lock:  # nobody is reaping from the syncer while it is closed
            with commit.lock:
                if self.loop is not loop:
                    return  # detached meanwhile, by another caller
                syncer, self.syncer = self.syncer, None
                self.loop = None
                self.detaching = False
                self._kick_pending = None
                if commit.data:
                    self._fallback.request_locked()
            if not loop.is_closed():
                loop.remove_reader(syncer.fileno())
            syncer.close()

    def detach_from_outside(self, loop) -> None:
        """close() from a thread other than the running attached loop's: detach in the loop."""
        done = threading.Event()

        def detach() -> None:
            try:
                self.detach()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(detach)
        except RuntimeError:  # closed meanwhile
            self.detach()
            return
        while not done.wait(0.05):
            if not loop.is_running():  # stopped before it ran the callback
                try:
                    self.detach()
                    return
                except WalUsageError:
                    continue  # running again: it runs the callback

    def request_locked(self) -> bool:
        """Ask the attached loop to flush the open group (under the lock); False if it is
        closed."""
        loop = self.loop
        if self._kick_pending is loop:
            return True
        try:
            loop.call_soon_threadsafe(self._kicked, loop)
        except RuntimeError:
            return False
        self._kick_pending = loop  # a kick queued in a loop detached since does not count
        return True

    def _kicked(self, loop) -> None:
        with self._commit.lock:
            if self._kick_pending is loop:
                self._kick_pending = None
        self.flush()

    def flush(self) -> None:
        """In the attached loop: write the open group and start its fdatasync, unless a
        group is being flushed (its end starts the next one) or there is none."""
        commit = self._commit
        with commit.lock:
            if (
                commit.owner is not Owner.IDLE or not commit.data or commit.failed is not None
                or running_loop() is not self.loop or self.detaching
            ):
                return
            group = self._log.take_group_locked()
            commit.owner = Owner.LOOP
            self.job = (group, time.perf_counter())
            syncer = self.syncer
        try:
            syncer.submit(self._log.write_group(group))
        except BaseException as e:  # noqa: BLE001 - every failure fails closed
            with self._reap_lock:
                self.job = None
            self._log.fail("write/fdatasync", e, group.waiters)

    def _on_sync_done(self) -> None:
        """The syncer's fd turned readable: finish the group whose fdatasync completed."""
        self.reap(block=False)

    def reap(self, *, block: bool, inline: bool = False, rescue: bool = False) -> bool:
        """Finish the loop's flush in flight if its fdatasync completed (or wait for it when
        `block`); True if one was finished. A rotation the group calls for goes to the flusher
        thread when called in the attached loop, else (or when `inline`) runs right here.
        `rescue`: the flusher thread, finishing the flush of a loop that stopped (re-checked
        here)."""
        with self._reap_lock:
            job = self.job
            syncer = self.syncer
            if syncer is None or (rescue and self.alive()):
                return False
            if job is None:
                if not block:
                    syncer.reap(block=False)  # the loop's callback: clears a stale count
                return False
            outcome = syncer.reap(block=block)
            if outcome is aio.PENDING:
                return False
            self.job = None
        group, t0 = job
        if outcome is not None:
            self._log.fail("write/fdatasync", outcome, group.waiters)
            return True
        dt = time.perf_counter() - t0
        running = running_loop()
        loop = running if not inline and running is self.loop else None  # None: no loop
        try:
            self._log.group_synced(group, dt, loop)
        except BaseException as e:
            # Interrupted (KeyboardInterrupt in the loop's thread) while it still owned the
            # fd: fail closed rather than leave the fd owned by nobody who will release it.
            if self._commit.owner is Owner.LOOP:
                self._log.fail("acknowledging a group", e, group.waiters)
            raise
        return True
