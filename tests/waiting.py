"""Waiting in tests: for a condition, never for a fixed time.

A fixed sleep is too short on a loaded machine (the test fails for nothing) and longer than
needed everywhere else. These poll the condition itself and fail with what was awaited:

    from tests.waiting import wait_until, wait_until_async

    wait_until(lambda: server.draining, 10, "the shutdown to begin")
    await wait_until_async(lambda: len(acked) >= 64, 10, "64 acknowledged appends")

(Importable from every test folder: `python -m pytest` runs from the project root.)
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

POLL_S = 0.01


def _timed_out(timeout_s: float, what: str) -> AssertionError:
    return AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def wait_until(predicate: Callable[[], object], timeout_s: float = 20.0, what: str = "the condition",
               interval_s: float = POLL_S) -> None:
    """Poll `predicate` until it is true; fail the test if it is still false after `timeout_s`.
    The predicate may raise to stop the wait early (e.g. a process it waits on exited)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise _timed_out(timeout_s, what)
        time.sleep(interval_s)


async def wait_until_async(predicate: Callable[[], object], timeout_s: float = 20.0,
                           what: str = "the condition", interval_s: float = POLL_S) -> None:
    """`wait_until` for a coroutine: the event loop runs between looks. `interval_s=0` only
    yields to the loop between looks, for a condition to act on before the loop moves on."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise _timed_out(timeout_s, what)
        await asyncio.sleep(interval_s)
