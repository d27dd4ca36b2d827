"""Recovery after an unclean stop (seed 002's scenarios 1-3).

Opening a store already truncated a torn WAL tail (`wal.open_wal`). Recovery then compacts every
durable record, and marks every execution still `running` that no live recorder is writing into
as incomplete: not replayable, reason `execution_incomplete`, every event up to the failure kept.
The marking is itself a WAL record, durable before it is compacted, so it survives another crash.
Completed executions are untouched and stay replayable. Nothing is retried (seed 002).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

import orjson
import sqlalchemy as sa

from .compactor import OP_INCOMPLETE
from .models import traces
from .record import STATUS_RUNNING

if TYPE_CHECKING:
    from .store import Store

_APPEND_CHUNK = 1000


@dataclass(frozen=True)
class RecoverResult:
    """What recovery found and did."""

    wal_truncated_bytes: int = 0
    compacted_records: int = 0
    marked_incomplete: int = 0
    incomplete_ids: tuple[str, ...] = field(default=(), repr=False)
    segments_deleted: int = 0


def recover(
    store: "Store",
    *,
    at_open: bool = False,
    progress: Optional[Callable[[int, int], None]] = None,
) -> RecoverResult:
    """Compact, then mark orphaned running executions incomplete, durably; see the module doc."""
    with store._compact_lock:
        first = store._compact_locked(progress)
        live = {s.execution_id for s in store._open_states()}
        with store._read_engine.connect() as conn:
            running = [
                eid
                for eid in conn.execute(
                    sa.select(traces.c.execution_id)
                    .where(traces.c.status == STATUS_RUNNING)
                    .where(traces.c.recorder_id == store.recorder_id)
                    .order_by(traces.c.created_at_ns)
                ).scalars()
                if eid not in live
            ]
        why = "recovery" if at_open else "recover"
        now = store.clock()
        docs = [orjson.dumps({"op": OP_INCOMPLETE, "id": eid, "why": why, "t": now}) for eid in running]
        for i in range(0, len(docs), _APPEND_CHUNK):
            store._wal.append_many(docs[i : i + _APPEND_CHUNK])
        second = store._compact_locked(None) if docs else None
    truncated = store._wal.open_result.truncated_bytes if at_open else 0
    return RecoverResult(
        wal_truncated_bytes=truncated,
        compacted_records=first.records + (second.records if second else 0),
        marked_incomplete=len(running),
        incomplete_ids=tuple(running),
        segments_deleted=first.segments_deleted + (second.segments_deleted if second else 0),
    )
