"""A small recorder for testing the server on its own: in-memory executions over a real WAL.

It follows the Backend contract (tracedb/sidecar/backend.py) the way the store adapter does:
writes are staged synchronously and committed as one WAL group per read. Nothing is compacted.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

import orjson

import wal
from tracedb.errors import ExecutionClosedError, ExecutionExistsError, ExecutionNotFoundError
from tracedb.records.record import compute_envelope_hash
from tracedb.sidecar import protocol as P
from tracedb.sidecar.backend import IN_BATCH, BackendStats, Staged


class _Exec:
    def __init__(self, intent, envelope, envelope_hash):
        self.intent = intent
        self.envelope = envelope
        self.envelope_hash = envelope_hash
        self.status = "running"
        self.events: list[tuple[str, Any]] = []
        self.final: Optional[dict] = None


class MemoryBackend:
    """Executions in a dict, every write framed into a real WAL before it is acknowledged."""

    def __init__(self, wal_dir: str, *, fs=None):
        self.wal = wal.open_wal(wal_dir, fs=fs)
        self.execs: dict[str, _Exec] = {}
        self._batch: list[bytes] = []
        self._last: Optional[asyncio.Future] = None
        self._n = 0
        self.closed = False
        self.hold: Optional[asyncio.Future] = None  # tests: delay every commit until set

    # -- staging -----------------------------------------------------------------------------
    def commit(self):
        if not self._batch:
            return None
        batch, self._batch = self._batch, []
        loop = asyncio.get_running_loop()
        fut = self.wal.append_future(batch, loop)
        if self.hold is not None:
            # Tests: answers wait until `hold` is set, though the records are durable.
            held, hold = loop.create_future(), self.hold

            def done(f):
                def release(_h):
                    if not held.done():
                        if f.exception() is not None:
                            held.set_exception(f.exception())
                        else:
                            held.set_result(f.result())

                hold.add_done_callback(release)

            fut.add_done_callback(done)
            fut = held
        self._last = fut
        return fut

    def barrier(self):
        if self._batch:
            return IN_BATCH
        if self._last is not None and not self._last.done():
            return self._last
        return None

    def _stage(self, record: dict):
        self._batch.append(orjson.dumps(record))
        return IN_BATCH

    def stage_start(self, intent, envelope, execution_id, parent, forked_at):
        h = compute_envelope_hash(envelope)
        if execution_id is None:
            self._n += 1
            execution_id = f"exec-{self._n:08d}"
        ex = self.execs.get(execution_id)
        if ex is not None:
            if ex.envelope_hash != h or ex.intent != intent:
                raise ExecutionExistsError(execution_id)
            return Staged(
                {"execution_id": execution_id, "envelope_hash": h, "created": False, "last_seq": len(ex.events)},
                self.barrier(),
            )
        self.execs[execution_id] = _Exec(intent, envelope, h)
        fut = self._stage({"k": "start", "x": execution_id, "i": intent, "e": envelope})
        return Staged({"execution_id": execution_id, "envelope_hash": h, "created": True, "last_seq": 0}, fut)

    def _get(self, eid) -> _Exec:
        ex = self.execs.get(eid)
        if ex is None:
            raise ExecutionNotFoundError(eid)
        return ex

    def _dup(self, ex, eid, typ, payload, seq):
        last = len(ex.events)
        if seq is not None and seq <= last:
            if ex.events[seq - 1] != (typ, payload):
                raise P.ProtocolError(P.SEQ_CONFLICT, f"seq {seq} of {eid} holds another event")
            return Staged({"seq": seq, "duplicate": True}, self.barrier())
        if ex.status != "running":
            raise ExecutionClosedError(eid, ex.status)
        if seq is not None and seq != last + 1:
            raise P.ProtocolError(P.SEQ_CONFLICT, f"expected seq {last + 1}, got {seq}")
        return None

    def stage_event(self, eid, typ, payload, seq):
        ex = self._get(eid)
        dup = self._dup(ex, eid, typ, payload, seq)
        if dup is not None:
            return dup
        try:
            body = orjson.dumps({"k": "event", "x": eid, "t": typ, "p": payload})
        except orjson.JSONEncodeError as e:
            raise P.ProtocolError(P.BAD_REQUEST, f"payload cannot be recorded: {e}") from None
        ex.events.append((typ, payload))
        self._batch.append(body)
        return Staged({"seq": len(ex.events)}, IN_BATCH)

    def stage_finish(self, eid, response, seq):
        ex = self._get(eid)
        dup = self._dup(ex, eid, "FINAL_RESPONSE", response, seq)
        if dup is not None:
            return dup
        ex.events.append(("FINAL_RESPONSE", response))
        ex.final = response
        ex.status = "completed"
        return Staged({"seq": len(ex.events)}, self._stage({"k": "finish", "x": eid, "r": response}))

    def stage_invalidate(self, eid, reason):
        ex = self._get(eid)
        ex.status = "invalidated"
        return Staged({}, self._stage({"k": "invalidate", "x": eid, "r": reason}))

    def stage_abandon(self, eid, reason):
        ex = self._get(eid)
        if ex.status == "running":
            ex.status = "incomplete"
            return Staged({"status": "incomplete"}, self._stage({"k": "abandon", "x": eid, "r": reason}))
        if ex.status == "incomplete":
            return Staged({"status": "incomplete"}, self.barrier())
        raise ExecutionClosedError(eid, ex.status)

    async def get(self, eid):
        ex = self._get(eid)
        return {
            "header": {"executionId": eid, "envelopeHash": ex.envelope_hash},
            "events": [{"seq": i + 1, "type": t, "payload": p} for i, (t, p) in enumerate(ex.events)],
            "finalResponse": ex.final,
            "status": ex.status,
        }

    def stats(self):
        s = self.wal.stats()
        return BackendStats(
            open_executions=sum(1 for e in self.execs.values() if e.status == "running"),
            durable_lsn=s.durable_lsn,
            failed=str(self.wal.failed) if self.wal.failed else None,
        )

    def set_group_observer(self, observer):
        prev = [self.wal.durable_lsn]

        def on_group(nbytes, dt):
            lsn = self.wal.durable_lsn
            observer(lsn - prev[0], nbytes, dt)
            prev[0] = lsn

        self.wal.on_group = on_group

    async def close(self):
        self.closed = True
        await asyncio.get_running_loop().run_in_executor(None, self.wal.close)
