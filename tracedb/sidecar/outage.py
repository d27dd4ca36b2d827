"""What a recording client does while its recorder is unreachable: raise, or fail open.

`on_outage="raise"` (the default): a call that cannot reach the recorder within the client's
timeouts raises `RecorderUnavailableError`; the agent decides.

`on_outage="continue"` (fail open): the agent goes on and its records are dropped, counted and
logged. While the recorder is down, calls return at once (`None` instead of a seq) and never try
it themselves: a prober in the background (a thread of the sync client, a task of the asyncio
one) does. It connects every `PROBE_INTERVAL_S` while nothing listens, and waits on a connection
it made for up to `PROBE_WAIT_S` for the answer, so a recorder that was stopped (SIGSTOP) is seen
the moment it resumes. A probe is a `get`, which the recorder answers only once its store is
open: a recorder still starting is not taken for back.

Once the recorder answers, the client counts it up again and, in the background, tells it about
every execution of which it dropped a record (`tell`): starts it if its start was dropped, reads
what it holds, flags it `recording_failure` with how many records were lost and when
(`record.lost_records_note`), and sends its finish if the finish was dropped, so that an
execution the agent finished is completed. A record the client counted as dropped may have been
kept (sent to a recorder that hung, which took it when it resumed): those are told apart by seq
and not counted as lost; if nothing was lost, nothing is flagged. An execution the agent goes on
recording meanwhile is told about first, by the call that records into it. From then on the
client numbers that execution's records from the recorder's next seq. An execution the recorder
closed meanwhile (recovery marked it incomplete after a crash) is flagged all the same, and
records nothing more.

This module holds that state and the requests of the exchanges; the sync and asyncio clients
send them (`run_steps`, `arun_steps`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Optional

from tracedb.errors import ConfigError, ExecutionClosedError, RecordingFailedError, TraceDBError
from tracedb.records.record import STATUS_INVALIDATED, STATUS_RUNNING, lost_records_note

log = logging.getLogger("tracedb.client")

RAISE = "raise"
CONTINUE = "continue"
POLICIES = (RAISE, CONTINUE)
ENV_VAR = "TRACEDB_ON_OUTAGE"
# In fail-open mode a request is given this long (connecting, reconnecting, waiting for its
# acknowledgment) before the recorder counts as down.
DEFAULT_OUTAGE_TIMEOUT_S = 2.0
# While down: how often the prober connects when nothing listens (a refused connect costs
# microseconds), and how long it waits on a connection it made for the answer.
PROBE_INTERVAL_S = 0.1
PROBE_WAIT_S = 5.0
# What a probe reads when no execution the recorder has lost records: any answer, "unknown
# execution" included, says the store is open.
PROBE_ID = "tracedb.outage-probe"
# What the request steps return for a record that is dropped after all (the recorder went down
# again, or closed the execution).
DROPPED = object()

Steps = Generator[dict, dict, Any]


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


@dataclass(eq=False)
class LostExecution:
    """An execution of which at least one record was dropped, until it is finished or closed."""

    execution_id: str
    # Dropped records the recorder has not heard of: (time in ns since the epoch, op), in order.
    unconfirmed: list = field(default_factory=list)
    drops: int = 0  # every drop, in all: a drop while the recorder is told tells it again
    lost: int = 0  # records known lost, as flagged on the recorder
    first_ns: Optional[int] = None  # the first and last of them
    last_ns: Optional[int] = None
    # The seq the first unconfirmed event or finish was sent with: what the client took for the
    # recorder's next seq. A recorder whose next seq is beyond it kept that many of them.
    from_seq: Optional[int] = None
    start: Optional[dict] = None  # the dropped start request, sent once the recorder is back
    finish: Optional[dict] = None  # the dropped finish request: the agent finished it
    closed: bool = False  # the recorder closed it (or it is invalidated): nothing more is sent
    # The recorder's next seq once it was told: this execution's records are numbered from it.
    # None: there are drops to tell it about.
    next_seq: Optional[int] = None
    lock: Any = None  # one exchange at a time: a threading.Lock or an asyncio.Lock

    @property
    def untold(self) -> bool:
        """Whether the recorder has yet to hear of dropped records of it."""
        return self.next_seq is None and not self.closed


class Outage:
    """A fail-open client's view of its recorder: down or up, and what was dropped."""

    def __init__(self, address: str, *, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], int] = time.time_ns, new_lock: Callable[[], Any] = threading.Lock):
        self.address = address
        self.clock = clock
        self.wall_clock = wall_clock
        self.new_lock = new_lock
        self.down = False
        self.down_since: Optional[float] = None
        self.outages = 0  # how many times the recorder went down
        self.unrecorded = 0  # records dropped, in all, less those the recorder turned out to hold
        self.lost: dict[str, LostExecution] = {}
        self.probing = False  # a prober runs (or is being started)
        self._lock = threading.Lock()

    # -- the recorder's state --------------------------------------------------------------

    def failed(self, cause: BaseException) -> bool:
        """The recorder did not answer in time: it is down until a probe gets an answer. True
        when the caller is to start the prober (none runs)."""
        with self._lock:
            if not self.down:
                self.down = True
                self.down_since = self.clock()
                self.outages += 1
                log.error(
                    "recorder unreachable: the agent goes on, its records are dropped and will be "
                    "flagged recording_failure once the recorder is back",
                    extra={"address": self.address, "cause": str(cause)},
                )
            if self.probing:
                return False
            self.probing = True
            return True

    def recovered(self) -> None:
        """A probe got an answer: the recorder is up."""
        with self._lock:
            if not self.down:
                return
            self.down = False
            took = self.clock() - (self.down_since or self.clock())
            log.warning(
                "recorder reachable again",
                extra={
                    "address": self.address,
                    "down_s": round(took, 3),
                    "unrecorded": self.unrecorded,
                    "executions_to_flag": sum(1 for x in self.lost.values() if x.untold),
                },
            )

    def prober_done(self) -> bool:
        """The prober asks whether it may stop: yes (and it is then no longer running) unless the
        recorder is down or an execution is still to be told."""
        with self._lock:
            if self.down or any(x.untold for x in self.lost.values()):
                return False
            self.probing = False
            return True

    def prober_stopped(self) -> None:
        """The prober ended otherwise (the client closed): the next failure starts another."""
        with self._lock:
            self.probing = False

    # -- what was dropped --------------------------------------------------------------------

    def drop(self, execution_id: Optional[str], req: Optional[dict] = None) -> None:
        """Count one dropped record (`req`: its request) of `execution_id`."""
        with self._lock:
            self.unrecorded += 1
            if execution_id is None:
                return
            x = self.lost.get(execution_id)
            if x is None:
                x = self.lost[execution_id] = LostExecution(execution_id, lock=self.new_lock())
            if x.closed:
                return
            op = req.get("op") if req else None
            x.unconfirmed.append((self.wall_clock(), op))
            x.drops += 1
            if op == "start":
                x.start = dict(req, id=None)
            elif op in ("event", "finish"):
                if op == "finish":
                    x.finish = dict(req, id=None)
                believed = x.next_seq if x.next_seq is not None else req.get("seq")
                if believed is not None:
                    x.from_seq = believed if x.from_seq is None else min(x.from_seq, believed)
            x.next_seq = None

    def probe_id(self) -> str:
        """What a probe reads: an execution the recorder has (its start was not dropped), so that
        the probe costs the recorder no error, else an id none has."""
        with self._lock:
            for x in self.lost.values():
                if x.start is None and not x.closed:
                    return x.execution_id
        return PROBE_ID

    def untold(self) -> list[LostExecution]:
        """The executions the recorder has yet to hear about."""
        with self._lock:
            return [x for x in self.lost.values() if x.untold]

    def _forget(self, x: LostExecution) -> None:
        with self._lock:
            if self.lost.get(x.execution_id) is x:
                del self.lost[x.execution_id]

    def stats(self) -> dict[str, Any]:
        """Counts for the agent's own logs or metrics."""
        with self._lock:
            return {
                "down": self.down,
                "outages": self.outages,
                "unrecorded": self.unrecorded,
                "executions_affected": len(self.lost),
            }

    # -- the exchanges (generators of requests; the clients send them) -----------------------

    def tell(self, x: LostExecution) -> Steps:
        """Tell the recorder about `x` (its lock held): start it if its start was dropped, read
        its next seq, flag what was lost, send the dropped finish.

        Lost are the dropped events (and a finish that cannot be sent any more): a dropped start
        or finish is sent now, and the first dropped events and finish the recorder holds anyway
        (it took them from the connection the client gave up on) are told apart by their seqs."""
        eid = x.execution_id
        drops = x.drops
        counted = len(x.unconfirmed)
        try:
            if x.start is not None:
                resp = yield dict(x.start)  # a hung recorder may hold it: then `created` is false
                x.start = None
                last, status = resp.get("last_seq", 0), resp.get("status", STATUS_RUNNING)
            else:
                record = (yield {"id": None, "op": "get", "execution_id": eid})["record"]
                events = record.get("events") or []
                last, status = (events[-1]["seq"] if events else 0), record.get("status", STATUS_RUNNING)
        except TraceDBError as e:
            if isinstance(e, RecordingFailedError):
                raise
            return self._give_up(x, e)
        kept = max(0, last + 1 - x.from_seq) if x.from_seq is not None else 0
        lost_at = []
        for ns, op in x.unconfirmed[:counted]:
            if op == "start":
                continue
            if op in ("event", "finish") and kept:
                kept -= 1
            elif not (op == "finish" and status == STATUS_RUNNING):
                lost_at.append(ns)
        lost = x.lost + len(lost_at)
        if lost_at and status != STATUS_INVALIDATED:
            first = lost_at[0] if x.first_ns is None else min(x.first_ns, lost_at[0])
            flag = {"id": None, "op": "recording_failure", "execution_id": eid,
                    "detail": lost_records_note(lost, first, lost_at[-1])}
            try:
                yield flag
            except TraceDBError as e:
                if isinstance(e, RecordingFailedError):
                    raise
                return self._give_up(x, e)
        with self._lock:
            self.unrecorded -= counted - len(lost_at)  # the recorder holds those, or is sent them now
            del x.unconfirmed[:counted]
            x.from_seq = None
            if lost_at:
                x.lost = lost
                x.first_ns = lost_at[0] if x.first_ns is None else min(x.first_ns, lost_at[0])
                x.last_ns = lost_at[-1]
            if x.drops == drops:  # else records were dropped meanwhile: tell it again
                x.next_seq = last + 1
        if status != STATUS_RUNNING:
            # Completed after all (a hung recorder kept the finish), closed by recovery, or
            # invalidated: nothing more of it is recorded.
            x.closed = True
            x.finish = None
            return None
        if x.finish is not None and x.next_seq is not None:
            finish = x.finish
            x.finish = None
            try:
                yield from self.send(x, finish)
            except RecordingFailedError:
                self.drop(eid, finish)  # dropped again: sent when the recorder is back again
                raise
        return None

    def send(self, x: LostExecution, req: dict) -> Steps:
        """Record `req` of `x` (its lock held): tell the recorder about `x` first if it has yet to
        hear, then send `req` with the recorder's next seq. Returns the response, or DROPPED."""
        if self.down or x.closed:
            return DROPPED
        if x.untold:
            yield from self.tell(x)
            if x.closed or x.untold:
                return DROPPED
        if self.lost.get(x.execution_id) is not x:
            return (yield req)  # finished meanwhile (its dropped finish was sent): as any request
        if req.get("seq") is not None:
            req["seq"] = x.next_seq
        try:
            resp = yield req
        except ExecutionClosedError:
            x.closed = True
            return DROPPED
        except TraceDBError as e:
            if getattr(e, "code", None) != "seq_conflict" or req.get("seq") is None:
                raise
            # A record the recorder took after it was read (from the connection the client gave
            # up on): read it again, once.
            got = yield {"id": None, "op": "get", "execution_id": x.execution_id}
            events = got["record"].get("events") or []
            x.next_seq = req["seq"] = (events[-1]["seq"] if events else 0) + 1
            resp = yield req
        if resp.get("seq") is not None:
            x.next_seq = resp["seq"] + 1
        if req.get("op") == "finish":
            self._forget(x)
        return resp

    def _give_up(self, x: LostExecution, cause: BaseException) -> None:
        """The recorder refuses to hear of `x` (closed and invalidated, or unknown): nothing
        more of it is sent."""
        x.closed = True
        x.finish = x.start = None
        log.warning("a dropped execution cannot be flagged", extra={"execution_id": x.execution_id, "cause": str(cause)})


def run_steps(steps: Steps, request: Callable[[dict], dict]) -> Any:
    """Send a generator's requests with `request` (blocking); its return value."""
    try:
        req = next(steps)
        while True:
            try:
                resp = request(req)
            except TraceDBError as e:
                req = steps.throw(e)
                continue
            req = steps.send(resp)
    except StopIteration as stop:
        return stop.value


async def arun_steps(steps: Steps, request) -> Any:
    """`run_steps` with an awaited `request`."""
    try:
        req = next(steps)
        while True:
            try:
                resp = await request(req)
            except TraceDBError as e:
                req = steps.throw(e)
                continue
            req = steps.send(resp)
    except StopIteration as stop:
        return stop.value
