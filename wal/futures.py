"""Acknowledging asyncio appends: each future is resolved in its own event loop's thread."""

from __future__ import annotations

import asyncio
from typing import Optional

running_loop = asyncio._get_running_loop  # the running loop of this thread, or None (in C)


def acknowledge(waiters, exc: Optional[BaseException]) -> None:
    """Resolve `waiters`, (loop, future, value) each, to their value (or fail them with `exc`):
    those of the loop running here right away, those of any other loop with one
    `call_soon_threadsafe` per loop."""
    running = running_loop()
    elsewhere: Optional[dict] = None
    for loop, fut, value in waiters:
        if loop is not running:
            if elsewhere is None:
                elsewhere = {}
            elsewhere.setdefault(loop, []).append((fut, value, exc))
        elif not fut.done():  # the attached loop acknowledging its own group
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
