"""Stores for the tests of the streaming walks (verify in chunks, prune in batches), shared by the
SQLite tests here and the PostgreSQL ones in tests/pg: what is recorded, what is planted, and
what verify and prune must answer whatever the chunk or batch size."""

from __future__ import annotations

import sqlalchemy as sa

from tracedb import compute_envelope_hash
from tracedb.projection import checksums
from tracedb.projection.models import trace_steps, traces

DAY = 86400

# --- verify ------------------------------------------------------------------------------

VERIFY_IDS = [f"exec-v{i:02d}" for i in range(10)]  # execution-id order: v00 first, v09 last


def envelope_of(eid: str) -> dict:
    return {"intent": "X", "id": eid}


def record_verify_store(store) -> int:
    """Ten completed executions of 3 events and the final response; returns the step count."""
    for eid in VERIFY_IDS:
        ex = store.start("X", envelope_of(eid), eid)
        for j in range(3):
            ex.event("tool.requested", {"j": j})
        ex.finish({"status": "success"})
    store.compact()
    return 4 * len(VERIFY_IDS)


def plant_trace_problems(engine) -> list[str]:
    """Break the first trace (by execution id), the last, and the last of the first five (a
    chunk boundary for chunks of 5); returns the problems verify must report, in order."""
    first, boundary, last = VERIFY_IDS[0], VERIFY_IDS[4], VERIFY_IDS[-1]
    with engine.begin() as conn:
        conn.execute(traces.update().where(traces.c.execution_id == first).values(envelope_hash="sha256:" + "0" * 64))
        conn.execute(traces.update().where(traces.c.execution_id == boundary).values(last_seq=99))
        conn.execute(
            trace_steps.delete().where(trace_steps.c.execution_id == last).where(trace_steps.c.seq == 2)
        )
    return [
        f"{first}: envelope hash sha256:{'0' * 64} does not match the envelope "
        f"({compute_envelope_hash(envelope_of(first))})",
        f"{boundary}: last_seq is 99 but the last event has seq 4",
        f"{last}: event seq 3 where 2 was expected",
    ]


def plant_lifecycle_problems(engine) -> tuple[list[str], int]:
    """Every kind of problem a trace's steps can show, over the whole id range (each trace has
    seqs 1..4, FINAL_RESPONSE last). Returns the problems verify must report, in order, and the
    number of steps left."""

    def step(eid, seq, type_="tool.requested"):
        return trace_steps.insert().values(
            execution_id=eid, seq=seq, type=type_, payload=None, recorded_at_ns=1, lsn=1,
            payload_crc=checksums.of_bytes(b"null"),  # the JSON type writes None as null
        )

    s, t = trace_steps.c, traces.c
    v = VERIFY_IDS
    with engine.begin() as conn:
        conn.execute(trace_steps.delete().where(s.execution_id == v[1]).where(s.seq == 1))
        conn.execute(
            trace_steps.update().where(s.execution_id == v[2]).where(s.seq == 2).values(type="FINAL_RESPONSE")
        )
        conn.execute(step(v[3], 5))
        conn.execute(traces.update().where(t.execution_id == v[3]).values(last_seq=5))
        conn.execute(traces.update().where(t.execution_id == v[5]).values(final_response=sa.null(), final_response_crc=0))
        conn.execute(
            trace_steps.update().where(s.execution_id == v[6]).where(s.seq == 4).values(type="tool.responded")
        )
        conn.execute(trace_steps.delete().where(s.execution_id == v[7]))
        conn.execute(step(v[8], 9))
    return [
        f"{v[1]}: event seq 2 where 1 was expected",
        f"{v[2]}: 2 FINAL_RESPONSE events",
        f"{v[3]}: events recorded after FINAL_RESPONSE (seq 4)",
        f"{v[5]}: completed without a FINAL_RESPONSE",
        f"{v[6]}: completed without a FINAL_RESPONSE",
        f"{v[7]}: last_seq is 4 but the last event has seq 0",
        f"{v[7]}: completed without a FINAL_RESPONSE",
        f"{v[8]}: event seq 9 where 5 was expected",
        f"{v[8]}: last_seq is 4 but the last event has seq 9",
        f"{v[8]}: events recorded after FINAL_RESPONSE (seq 4)",
    ], 4 * len(VERIFY_IDS) - 1 + 1 - 4 + 1


# Steps without a trace, by where they fall: before the first trace, between the first two,
# between the fifth and the sixth (a chunk boundary), after the last.
ORPHANS = ["exec-u1", "exec-v000", "exec-v045", "exec-w1"]


def merge_orphans(trace_problems: list[str]) -> list[str]:
    """The problems in verify's order (execution id) once ORPHANS are planted too."""
    by_id = [(p.split(":", 1)[0], p) for p in trace_problems]
    by_id += [(o, f"{o}: step 1 has no trace") for o in ORPHANS]
    return [p for _, p in sorted(by_id, key=lambda x: x[0])]


def walk_problems(result) -> list[str]:
    """verify's problems without the database's own checks (which come after the walk)."""
    return [p for p in result.problems if not p.startswith(("sqlite ", "postgresql", "recorder "))]


# --- prune -------------------------------------------------------------------------------


def record(store, clock, eid: str, *, finish: bool = True, **start) -> int:
    """Record an execution of 2 events (and the final response unless `finish` is False), one
    second after the previous one; returns its step count."""
    ex = store.start("X", {"id": eid}, eid, **start)
    ex.event("tool.requested", {"n": 1})
    ex.event("tool.responded", {"n": 2})
    clock.advance(1)
    if not finish:
        return 2
    ex.finish({"status": "success"})
    return 3


def record_retention_store(store, clock) -> dict:
    """Old traces of every kind, interleaved with old fillers so that any batch size splits
    them, then young ones. Returns what prune must delete and keep."""
    steps: dict[str, int] = {}

    def rec(eid, **kw):
        steps[eid] = record(store, clock, eid, **kw)

    fillers = iter(f"exec-fill{i:02d}" for i in range(10))

    def fill():
        rec(next(fillers))

    fork = lambda parent: {"parent_execution_id": parent, "forked_at_seq": 1}  # noqa: E731
    fill()
    rec("exec-p1")  # a young fork is made from it below: kept
    fill()
    rec("exec-g")  # its fork exec-c is kept for exec-c's own young fork: kept
    fill()
    rec("exec-c", **fork("exec-g"))
    fill()
    rec("exec-a")  # a -> b -> d, all old: all three go
    fill()
    rec("exec-b", **fork("exec-a"))
    fill()
    rec("exec-d", **fork("exec-b"))
    fill()
    rec("exec-pin1")
    fill()
    rec("exec-pp")  # pinned; its old fork exec-pf goes
    rec("exec-pf", **fork("exec-pp"))
    fill()
    rec("exec-q")  # its fork exec-qf is pinned: kept
    rec("exec-qf", **fork("exec-q"))
    rec("exec-pin2")
    rec("exec-r")  # its fork exec-rf is still running: kept
    rec("exec-rf", finish=False, **fork("exec-r"))
    fill()
    rec("exec-run", finish=False)  # old but running: never deleted
    rec("exec-inv")
    store.invalidate("exec-inv", "bad tool")  # invalidated is terminal: it goes
    clock.advance(31 * DAY)
    rec("exec-f1", **fork("exec-p1"))
    rec("exec-y", **fork("exec-c"))
    rec("exec-young")
    for eid in ("exec-pin1", "exec-pin2", "exec-pp", "exec-qf"):
        store.pin(eid)
    store.compact()
    clock.advance(1)
    deleted = {f"exec-fill{i:02d}" for i in range(10)} | {"exec-a", "exec-b", "exec-d", "exec-pf", "exec-inv"}
    return {
        "deleted": deleted,
        "deleted_steps": sum(steps[e] for e in deleted),
        "kept": set(steps) - deleted,
        "kept_pinned": 4,  # exec-pin1, exec-pin2, exec-pp, exec-qf
        "kept_parents": 5,  # exec-p1, exec-g, exec-c, exec-q, exec-r
    }


def forks_without_parent(engine) -> list[str]:
    """Forks whose parent is no longer stored (prune must never leave one, even between batches)."""
    child, parent = traces.alias("child"), traces.alias("parent")
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(child.c.execution_id)
            .select_from(child.outerjoin(parent, parent.c.execution_id == child.c.parent_execution_id))
            .where(child.c.parent_execution_id.is_not(None))
            .where(parent.c.execution_id.is_(None))
        ).scalars().all()
        conn.rollback()
    return list(rows)


def stored_ids(engine) -> set[str]:
    with engine.connect() as conn:
        ids = set(conn.execute(sa.select(traces.c.execution_id)).scalars())
        conn.rollback()
    return ids
