"""One retry policy: exponential backoff with jitter, bounded by a deadline.

Every loop that waits before trying again (a client reconnecting to its recorder, a client told
`overloaded`, the store's background compaction after a failure) takes its delays from here, so
that many clients that lost the same recorder do not come back in lock step.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Optional


class Backoff:
    """Delays that double from `first_s` up to `max_s`, each drawn in [d/2, d] ("equal jitter").

    With `deadline` (a `time.monotonic()` instant), `next_delay()` returns None once waiting the
    next delay would pass it: the caller gives up then.
    """

    def __init__(
        self,
        first_s: float = 0.02,
        max_s: float = 1.0,
        *,
        deadline: Optional[float] = None,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[float, float], float] = random.uniform,
    ):
        self.first_s = first_s
        self.max_s = max_s
        self.deadline = deadline
        self.clock = clock
        self.rng = rng
        self.attempts = 0

    def next_delay(self) -> Optional[float]:
        """How long to wait before the next attempt; None when the deadline does not allow one."""
        ceiling = min(self.max_s, self.first_s * (2 ** min(self.attempts, 30)))
        delay = self.rng(ceiling / 2, ceiling)
        if self.deadline is not None and self.clock() + delay > self.deadline:
            return None
        self.attempts += 1
        return delay

    def reset(self) -> None:
        """An attempt succeeded: the next failure starts from `first_s` again."""
        self.attempts = 0
