"""Recovery after an unclean stop: what ran, and how far did it get.

Opening a store already truncated a torn WAL tail (`wal.open_wal`). Recovery then compacts every
durable record, and marks every execution still `running` that no live recorder is writing into
as incomplete: not replayable, reason `execution_incomplete` (one flagged `recording_failure`
keeps that reason and its note: `codec.transition`), every event up to the failure kept.
The marking is itself a WAL record, durable before it is compacted, so it survives another crash.
Completed executions are untouched and stay replayable. Nothing is retried.

The store calls `recover` with what it needs (its compaction step, its database, the WAL's
append), holding its compaction lock.
"""

from __future__ import annotations

import filecmp
import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Engine

import wal
from wal.fs import OsFileSystem, copy_to_new_file

from tracedb.records.codec import OP_INCOMPLETE, encode_status
from tracedb.projection.models import traces
from tracedb.records.record import STATUS_RUNNING

_APPEND_CHUNK = 1000
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecoverResult:
    """What recovery found and did."""

    wal_truncated_bytes: int = 0
    compacted_records: int = 0
    marked_incomplete: int = 0
    incomplete_ids: tuple[str, ...] = field(default=(), repr=False)
    segments_deleted: int = 0
    # Copies of damaged segments the WAL directory keeps (see keep_damaged_segments).
    kept_copies: tuple[str, ...] = ()


def keep_damaged_segments(wal_dir: str, applied_lsn: int) -> tuple[str, ...]:
    """Check the sealed segments wholly at or below `applied_lsn`, which the next compaction
    deletes without reading them again (a crash came between the commit of their records and the
    delete); copy each damaged one to `<name>.broken` first (fsynced), so that the evidence of
    damage `wal scan` or `verify` reported is never deleted with it.

    Returns those copies, and every `.broken` copy already there of a segment no longer in the
    log: one the log moved aside instead of deleting it (its SEAL was damaged, after every record
    in it had been applied; `wal.Wal.mark_applied`), or a repair's. Each recovery names them until
    they are removed: the compaction that found such damage stops on it once the segment is
    already moved, and only the next one goes on past it."""
    segs = wal.list_segments(wal_dir)
    live = {s.name for s in segs}
    kept = [
        os.path.join(wal_dir, name) for name in sorted(os.listdir(wal_dir))
        if ".wal.broken" in name and name.split(".wal.broken")[0] + ".wal" not in live
        and wal.segment_of(os.path.join(wal_dir, name)) is not None
    ]
    for seg, nxt in zip(segs, segs[1:]):
        if nxt.first_lsn > applied_lsn + 1:
            break
        if not wal.salvage_file(seg.path, next_first_lsn=nxt.first_lsn, last=False).damages:
            continue
        dst = seg.path + ".broken"
        n = 0
        while os.path.exists(dst):
            if filecmp.cmp(seg.path, dst, shallow=False):
                break  # kept already (an earlier open found it)
            n += 1
            dst = f"{seg.path}.broken.{n}"
        else:
            dst = _copy(seg.path, dst, wal_dir)
            log.error(
                "WAL segment %s is damaged; its records were applied already, and a copy is kept as "
                "%s before it is deleted", seg.name, os.path.basename(dst),
            )
        kept.append(dst)
    return tuple(kept)


def _copy(src: str, dst: str, directory: str) -> str:
    fs = OsFileSystem()
    fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        copy_to_new_file(fs, fd, dst)
    finally:
        os.close(fd)
    fs.fsync_dir(directory)
    return dst


def orphaned_executions(engine: Engine, recorder_id: str, recording: set[str]) -> list[str]:
    """Executions this recorder started that the database says are running and nobody records."""
    with engine.connect() as conn:
        return [
            eid
            for eid in conn.execute(
                sa.select(traces.c.execution_id)
                .where(traces.c.status == STATUS_RUNNING)
                .where(traces.c.recorder_id == recorder_id)
                .order_by(traces.c.created_at_ns)
            ).scalars()
            if eid not in recording
        ]


def recover(
    *,
    compact: Callable,
    engine: Engine,
    recorder_id: str,
    recording: set[str],
    append_many: Callable[[Sequence[bytes]], list[int]],
    now_ns: int,
    why: str,
    progress: Optional[Callable[[int, int], None]] = None,
) -> RecoverResult:
    """Compact (`compact(progress)`), then mark incomplete, durably, every running execution of
    `recorder_id` not in `recording`, and compact those marks."""
    first = compact(progress)
    orphans = orphaned_executions(engine, recorder_id, recording)
    records = [encode_status(OP_INCOMPLETE, eid, why, now_ns) for eid in orphans]
    for i in range(0, len(records), _APPEND_CHUNK):
        append_many(records[i : i + _APPEND_CHUNK])
    second = compact(None) if records else None
    return RecoverResult(
        compacted_records=first.records + (second.records if second else 0),
        marked_incomplete=len(orphans),
        incomplete_ids=tuple(orphans),
        segments_deleted=first.segments_deleted + (second.segments_deleted if second else 0),
    )
