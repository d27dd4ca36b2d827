"""Acknowledging appends: each asyncio future is resolved in its own event loop's thread, and the
threads blocked on a group wake through that group's gate."""

from __future__ import annotations

import asyncio
import threading
from typing import Optional

running_loop = asyncio._get_running_loop  # the running loop of this thread, or None (in C)


class GroupGate:
    """Where the threads whose records are in one group wait for its fdatasync (`Wal.append`,
    `Wal.append_many`): a lock held from the group's first blocking append until the group is
    acknowledged (or failed), when it is opened once. Each waiter that gets through opens it
    for the next: the flusher wakes one thread per group instead of notifying every blocked
    thread at every group, and no thread of the next group is woken early.

    It sits in the group's waiters as (None, gate, None), with the future's `done`,
    `set_result` and `set_exception`, so that `acknowledge` opens it with the group's futures."""

    __slots__ = ("_lock", "_opened")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._opened = False

    def done(self) -> bool:
        return self._opened

    def set_result(self, _value) -> None:
        """The group is durable (or failed: `set_exception`): let its threads through."""
        if not self._opened:
            self._opened = True
            self._lock.release()

    set_exception = set_result  # a waiter reads the failure from the log itself

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the gate is open (at most `timeout` seconds); whether it is. (Open, it
        may still be held by a waiter interrupted before it passed it on: a timed wait then
        returns True all the same.)"""
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return self._opened
        self._lock.release()  # the next waiter goes through
        return True


def acknowledge(waiters, exc: Optional[BaseException]) -> None:
    """Resolve `waiters`, (loop, future, value) each, to their value (or fail them with `exc`):
    those of the loop running here right away, those of any other loop with one
    `call_soon_threadsafe` per loop; a group's gate (loop None) is opened here."""
    running = running_loop()
    elsewhere: Optional[dict] = None
    for loop, fut, value in waiters:
        if loop is not running and loop is not None:
            if elsewhere is None:
                elsewhere = {}
            elsewhere.setdefault(loop, []).append((fut, value, exc))
        elif not fut.done():  # the attached loop acknowledging its own group, or a gate
            if exc is None:
                fut.set_result(value)
            else:
                fut.set_exception(exc)
    if elsewhere is None:
        return
    for loop, batch in elsewhere.items():
        try:
            loop.call_soon_threadsafe(resolve_futures, batch)
        except RuntimeError:
            pass  # that loop is closed; nobody is waiting there any more


def resolve_futures(batch) -> None:
    """Runs in an event loop's thread: resolve (or fail) one group's futures, (future, value,
    exception) each, there."""
    for fut, value, exc in batch:
        if fut.done():
            continue
        if exc is None:
            fut.set_result(value)
        else:
            fut.set_exception(exc)
