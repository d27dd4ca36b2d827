"""What a recording client does while its recorder is unreachable: raise, or fail open.

`on_outage="raise"` (the default): a call that cannot reach the recorder within the client's
timeouts raises `RecorderUnavailableError`; the agent decides.

`on_outage="continue"` (fail open): the agent goes on and its records are dropped, counted and
logged. While the recorder is down, calls return at once (`None` instead of a seq) without
trying it again; it is probed again after a delay that grows from 1 s to 30 s. Once it answers,
the client flags every execution of which it dropped a record with `recording_failure` (not
replayable, events kept), starting on the recorder any execution whose start was dropped, and
carries on recording them from the seq the recorder has. An execution the recorder closed
meanwhile (recovery marked it incomplete after a crash) records nothing more.

This module holds that state; the sync and asyncio clients drive it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import ConfigError

log = logging.getLogger("tracedb.client")

RAISE = "raise"
CONTINUE = "continue"
POLICIES = (RAISE, CONTINUE)
ENV_VAR = "TRACEDB_ON_OUTAGE"
# In fail-open mode a request is given this long (connecting, reconnecting, waiting for its
# acknowledgment) before the recorder counts as down.
DEFAULT_OUTAGE_TIMEOUT_S = 2.0
_FIRST_PROBE_S = 1.0
_MAX_PROBE_S = 30.0


def outage_policy(value: Optional[str]) -> str:
    """The policy from the argument, else TRACEDB_ON_OUTAGE, else "raise"."""
    chosen = value if value is not None else os.environ.get(ENV_VAR) or RAISE
    if chosen not in POLICIES:
        source = "on_outage" if value is not None else ENV_VAR
        raise ConfigError(
            f"{source} must be one of {', '.join(POLICIES)}, not {chosen!r}",
            hint='"raise" (default) fails the call when the recorder is unreachable; "continue" '
            "lets the agent go on and flags what was lost once the recorder is back",
        )
    return chosen


@dataclass
class LostExecution:
    """An execution of which at least one record was dropped."""

    execution_id: str
    dropped: int = 0
    # The start itself was dropped: what is needed to start it once the recorder is back.
    start: Optional[dict] = None
    # The recorder closed it meanwhile (incomplete): nothing more of it is recorded.
    closed: bool = False
    # Flagged recording_failure; the next event or finish takes this seq (the recorder's next).
    next_seq: Optional[int] = None


class Outage:
    """A fail-open client's view of its recorder: down or up, what was dropped, when to probe."""

    def __init__(self, address: str, *, clock=time.monotonic):
        self.address = address
        self.clock = clock
        self.down = False
        self.down_since: Optional[float] = None
        self.outages = 0  # how many times the recorder went down
        self.unrecorded = 0  # records dropped, in all
        self.lost: dict[str, LostExecution] = {}
        self._probe_delay = _FIRST_PROBE_S
        self._next_probe = 0.0
        self._lock = threading.Lock()

    # -- the recorder's state --------------------------------------------------------------

    def probe_due(self) -> bool:
        """While down: whether it is time to try the recorder again (at most one caller at a
        time is told yes; the others drop their record)."""
        with self._lock:
            if not self.down:
                return True
            now = self.clock()
            if now < self._next_probe:
                return False
            self._next_probe = now + self._probe_delay  # the others wait for this probe
            return True

    def failed(self, cause: BaseException) -> None:
        """The recorder did not answer in time: it is down until a probe gets an answer."""
        with self._lock:
            now = self.clock()
            if not self.down:
                self.down = True
                self.down_since = now
                self.outages += 1
                self._probe_delay = _FIRST_PROBE_S
                log.error(
                    "recorder unreachable: the agent goes on, its records are dropped and will be "
                    "flagged recording_failure once the recorder is back",
                    extra={"address": self.address, "cause": str(cause)},
                )
            else:
                self._probe_delay = min(self._probe_delay * 2, _MAX_PROBE_S)
            self._next_probe = now + self._probe_delay

    def recovered(self) -> bool:
        """The recorder answered. True if it was down (the caller then flags what was lost)."""
        with self._lock:
            if not self.down:
                return False
            self.down = False
            took = self.clock() - (self.down_since or self.clock())
            log.warning(
                "recorder reachable again",
                extra={
                    "address": self.address,
                    "down_s": round(took, 3),
                    "unrecorded": self.unrecorded,
                    "executions_to_flag": sum(1 for x in self.lost.values() if x.next_seq is None and not x.closed),
                },
            )
            return True

    # -- what was dropped --------------------------------------------------------------------

    def drop(self, execution_id: Optional[str], start: Optional[dict] = None) -> None:
        """Count one dropped record of `execution_id` (`start`: the dropped start request)."""
        with self._lock:
            self.unrecorded += 1
            if execution_id is None:
                return
            lost = self.lost.get(execution_id)
            if lost is None:
                lost = self.lost[execution_id] = LostExecution(execution_id, start=start)
            lost.dropped += 1
            lost.next_seq = None  # to be flagged (again) once the recorder is back

    def to_flag(self) -> list[LostExecution]:
        """The executions still to flag recording_failure."""
        with self._lock:
            return [x for x in self.lost.values() if x.next_seq is None and not x.closed]

    def closed(self, execution_id: str) -> bool:
        """Whether the recorder closed this execution after its records were dropped."""
        lost = self.lost.get(execution_id)
        return lost is not None and lost.closed

    def take_seq(self, execution_id: str, req: dict) -> None:
        """After a flag: send the execution's next event or finish with the recorder's next seq
        (records the client counted were dropped), then forget the execution."""
        with self._lock:
            lost = self.lost.get(execution_id)
            if lost is None or lost.next_seq is None or lost.closed:
                return
            if req.get("seq") is not None:
                req["seq"] = lost.next_seq
            del self.lost[execution_id]

    def stats(self) -> dict[str, Any]:
        """Counts for the agent's own logs or metrics."""
        with self._lock:
            return {
                "down": self.down,
                "outages": self.outages,
                "unrecorded": self.unrecorded,
                "executions_affected": len(self.lost),
            }


def flag_detail(lost: LostExecution) -> str:
    """The note a flagged execution carries."""
    return (
        f"{lost.dropped} record(s) of this execution were not recorded: the recorder was "
        "unreachable and the client was set to fail open (on_outage=continue)"
    )
