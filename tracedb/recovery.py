"""Recovery after an unclean stop: what ran, and how far did it get.

Opening a store already truncated a torn WAL tail (`wal.open_wal`). Recovery then compacts every
durable record, and marks every execution still `running` that no live recorder is writing into
as incomplete: not replayable, reason `execution_incomplete`, every event up to the failure kept.
The marking is itself a WAL record, durable before it is compacted, so it survives another crash.
Completed executions are untouched and stay replayable. Nothing is retried.

The store calls `recover` with what it needs (its compaction step, its database, the WAL's
append), holding its compaction lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .codec import OP_INCOMPLETE, encode_status
from .models import traces
from .record import STATUS_RUNNING

_APPEND_CHUNK = 1000


@dataclass(frozen=True)
class RecoverResult:
    """What recovery found and did."""

    wal_truncated_bytes: int = 0
    compacted_records: int = 0
    marked_incomplete: int = 0
    incomplete_ids: tuple[str, ...] = field(default=(), repr=False)
    segments_deleted: int = 0


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
