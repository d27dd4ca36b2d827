"""The states of the WAL writer's group commit (wal/writer.py, wal/loop_flusher.py), by name."""

from __future__ import annotations

import enum


class Owner(enum.Enum):
    """Who writes and syncs a group now. At most one group is in flight at a time."""

    IDLE = "idle"  # nobody: the next group may be taken
    THREAD = "thread"  # the flusher thread (write, then a blocking fdatasync)
    LOOP = "loop"  # the attached event loop: an fdatasync in flight through the syncer
    ROTATING = "rotating"  # the flusher thread, rotating to the next segment for the loop


class FlusherStep(enum.Enum):
    """What the flusher thread does in a pass when it takes no group of its own to flush."""

    RESCUE = "rescue"  # finish the flush of an attached loop that went away
    ROTATE = "rotate"  # rotate to the next segment for the attached loop
    WATCH = "watch"  # wait a little while the attached loop flushes
