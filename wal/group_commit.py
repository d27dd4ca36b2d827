"""The WAL writer's group commit as one state object (`GroupCommit`), and the interfaces its two
flushers (the flusher thread in wal/writer.py, the event loop in wal/loop_flusher.py) share:
what a flusher asks of the log (`GroupLog`) and what the log asks of a flusher (`Flusher`)."""

from __future__ import annotations

import enum
import threading
from typing import Optional, Protocol

from .errors import WalClosedError, WalFailedError
from .futures import GroupGate


class Owner(enum.Enum):
    """The group commit's state: who writes and syncs a group now. At most one group is in
    flight at a time."""

    IDLE = "idle"  # nobody: the next group may be taken
    THREAD = "thread"  # the flusher thread (write, then a blocking fdatasync)
    LOOP = "loop"  # the attached event loop: an fdatasync in flight through the syncer
    ROTATING = "rotating"  # the flusher thread, rotating to the next segment for the loop


class FlusherStep(enum.Enum):
    """What the flusher thread does in a pass when it takes no group of its own to flush."""

    RESCUE = "rescue"  # finish the flush of an attached loop that went away
    ROTATE = "rotate"  # rotate to the next segment for the attached loop
    WATCH = "watch"  # wait a little while the attached loop flushes


class Group:
    """A group taken for flushing: its framed bytes, the waiters to acknowledge once it is
    durable ((loop, future, value) each; a blocking group's gate as (None, gate, None)), its
    last LSN, and the next segment, (salt, number, first LSN), when it is the last of its
    segment (else None)."""

    __slots__ = ("data", "waiters", "last_lsn", "rotate_to")

    def __init__(self, data: bytearray, waiters: list, last_lsn: int, rotate_to) -> None:
        self.data = data
        self.waiters = waiters
        self.last_lsn = last_lsn
        self.rotate_to = rotate_to


class GroupCommit:
    """Everything the group commit decides with, under its one lock (`lock`):

    - `owner`: who flushes the group in flight (`Owner`), IDLE when none is;
    - what is pending: the open group's bytes (`data`), its waiters and, for blocking
      callers, its gate (`gate`), and its last LSN (`last_lsn`, the last LSN framed);
    - the acknowledged LSNs: `writing_lsn`, the last LSN of the group in flight (0: none), and
      `durable_lsn`, the last LSN covered by a successful fdatasync; they only move up, and an
      append is acknowledged only once `durable_lsn` covers it;
    - `failed`: the error that closed the log for appends (never cleared: an fsync is never
      retried), and `closed`;
    - `rotation`: a rotation the flusher thread is to carry out for the attached loop;
    - `callers`: the blocking calls framed into the open group (`writing_callers`: into the
      group in flight), and `want`/`fill_until`: how many the flusher thread waits for in the
      open group before it takes it, and until when (see `expect_locked`).

    `synced` (a condition on the lock) is notified when `durable_lsn` moves, the owner goes
    back to IDLE after a rotation, or the log fails or closes; `watch` is where the flusher
    thread waits while the loop flushes; `filled` is notified when the open group holds the
    blocking calls the flusher thread waits for."""

    __slots__ = (
        "name", "lock", "synced", "watch", "owner", "data", "waiters", "gate", "last_lsn",
        "writing_lsn", "durable_lsn", "failed", "closed", "rotation", "filled", "callers",
        "writing_callers", "want", "fill_until",
    )

    def __init__(self, name: str) -> None:
        self.name = name  # the log's directory, for error messages
        self.lock = threading.Lock()
        self.synced = threading.Condition(self.lock)
        self.watch = threading.Condition(self.lock)
        self.owner = Owner.IDLE
        self.data = bytearray()
        self.waiters: list = []
        self.gate: Optional[GroupGate] = None
        self.last_lsn = 0
        self.writing_lsn = 0
        self.durable_lsn = 0
        self.failed: Optional[WalFailedError] = None
        self.closed = False
        self.rotation = None
        self.filled = threading.Condition(self.lock)
        self.callers = 0
        self.writing_callers = 0
        self.want = 0
        self.fill_until = 0.0

    def check_open(self) -> None:
        """Raise why appends are refused (the failure, or the close), if they are."""
        if self.failed is not None:
            raise self.failed
        if self.closed:
            raise WalClosedError(f"WAL {self.name} is closed")

    def gate_locked(self) -> tuple[GroupGate, bool]:
        """The open group's gate, for a blocking caller whose records were just framed into it
        (under the lock); and whether it was made just now."""
        self.callers += 1
        if self.callers == self.want:
            self.filled.notify()
        gate = self.gate
        if gate is not None:
            return gate, False
        gate = self.gate = GroupGate()
        self.waiters.append((None, gate, None))
        return gate, True

    def take_locked(self) -> tuple[bytearray, list, int]:
        """Hand the open group (not empty) to a flusher: its bytes, waiters and last LSN. It
        becomes the group being written (`writing_lsn`), and a new group opens."""
        data, waiters, last = self.data, self.waiters, self.last_lsn
        self.writing_lsn = last
        self.writing_callers, self.callers, self.want = self.callers, 0, 0
        self.data = bytearray()
        self.waiters = []
        self.gate = None
        return data, waiters, last

    def expect_locked(self, now: float, bound_s: float) -> None:
        """The flusher thread acknowledged a group of `writing_callers` blocking calls: before
        it takes the next group, let it wait (until `now + bound_s` at most) for the open
        group to hold those callers again as well as the ones already in it. The threads a
        group releases leave its gate one after another; without the wait the next
        fdatasync starts with the first few of them, and the rest wait a whole fdatasync
        more. A lone caller (or asyncio producers, which are not counted) never waits."""
        released = self.writing_callers
        if released > 1 and bound_s > 0:
            self.want = self.callers + released
            self.fill_until = now + bound_s
        else:
            self.want = 0

    def filling_locked(self, now: float) -> float:
        """How long the flusher thread is still to wait for the open group to fill (0: take
        it now)."""
        if self.callers >= self.want or self.closed or self.failed is not None:
            return 0.0
        return max(0.0, self.fill_until - now)

    def synced_locked(self, last_lsn: int) -> None:
        """A group's fdatasync succeeded: every LSN up to `last_lsn` is durable."""
        self.durable_lsn = last_lsn
        self.synced.notify_all()

    def fail_locked(self, err: WalFailedError, from_flusher: bool) -> list:
        """The log failed (`err`): it refuses appends from now on and the open group is dropped;
        the waiters of that group, to fail. `from_flusher`: the flusher of the group in flight
        failed it, so no group is in flight any more."""
        self.failed = err
        if from_flusher:
            self.writing_lsn = 0
            self.owner = Owner.IDLE
        rest = self.waiters
        self.waiters = []
        self.gate = None
        self.data = bytearray()
        self.callers = self.want = 0
        self.synced.notify_all()
        self.filled.notify()
        return rest


class GroupLog(Protocol):
    """What a flusher needs of the log whose groups it flushes (`Wal` is one)."""

    fs: object  # the file operations (wal/fs.py); `async_syncer` when it offers one
    directory: str

    def take_group_locked(self) -> Group:
        """The open group (not empty), taken for flushing, under the commit's lock."""

    def write_group(self, group: Group) -> int:
        """Write the group's bytes to the open segment; the fd to fdatasync."""

    def group_synced(self, group: Group, seconds: float, loop) -> bool:
        """The group's fdatasync succeeded: acknowledge it, rotate if it was the last of its
        segment (handed to the flusher thread when `loop`, the attached loop, runs this).
        False if the rotation failed."""

    def fail(self, op: str, cause: BaseException, waiters) -> None:
        """Fail closed: `waiters` and every pending append fail, appends are refused."""


class Flusher(Protocol):
    """A flusher of the group commit: the flusher thread, or the attached event loop."""

    def request_locked(self) -> bool:
        """See that the open group gets flushed (under the commit's lock); False if this
        flusher cannot now (the caller then asks the other one)."""

    def alive(self) -> bool:
        """It flushes now (under the commit's lock)."""
