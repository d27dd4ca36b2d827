"""Executions under ids that earlier versions accepted and new executions may no longer take
("a/b", "../x", ".hidden", "a#b"): written to the WAL as those versions' store wrote them (the
record format has not changed), then compacted by opening the store, so that the tests can show
that reading, replaying and exporting them still works.

    from tests.legacy_ids import record_legacy

    record_legacy(data_dir, ["team/a", ".hidden"])   # each: a start, one event, a final response
"""

from __future__ import annotations

import os
import time

import orjson

EVENT_TYPE = "tool.requested"


def legacy_envelope(execution_id: str, intent: str) -> dict:
    return {"intent": intent, "payload": {"id": execution_id}}


def record_legacy(data_dir: str, execution_ids, *, intent: str = "Legacy", finish: bool = True,
                  config: dict | None = None) -> None:
    """Record one execution per id (a start, one `tool.requested` event with {"id": id}, and,
    with `finish`, the final response {"status": "success"}) straight into the WAL of
    `data_dir`, then compact it (into `config`'s database: `db_url`). The intent too may be one
    earlier versions accepted (any length, a NUL). No recorder may be running on `data_dir`."""
    import tracedb
    import wal
    from tracedb.records.codec import encode_event, encode_finish, encode_start
    from tracedb.records.record import compute_envelope_hash

    settings = {"compact_interval_ms": 0, "idle_timeout_s": 0, **(config or {})}
    tracedb.open(data_dir, config=settings).close()  # the directory, its database, its WAL
    log = wal.open_wal(os.path.join(data_dir, "wal"))
    try:
        t = time.time_ns()
        for eid in execution_ids:
            env = legacy_envelope(eid, intent)
            records = [
                encode_start(eid, intent, env, compute_envelope_hash(env), t),
                encode_event(eid, 1, EVENT_TYPE, orjson.dumps({"id": eid}), t + 1),
            ]
            if finish:
                records.append(encode_finish(eid, 2, {"status": "success"}, t + 2))
            log.append_many(records)
            t += 1000
    finally:
        log.close()
    tracedb.open(data_dir, config=settings).close()  # recovery compacts what the WAL holds
