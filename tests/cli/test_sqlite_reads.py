"""A SQLite file read through the sqlite3 module (what `Reader.open` does for a current schema)
gives exactly what SQLAlchemy's engine gives: pages under every filter and cursor, ids by prefix,
records with their event times, and the WAL's pending view after a recorder was SIGKILLed.
And a read command on such a file does not load SQLAlchemy or pydantic at all."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

import tracedb
from tracedb.projection import db
from tracedb.config import load_config
from tracedb.errors import TraceDBError
from tracedb.reads.reader import EVERYTHING, Filter, Reader

from tests.conftest import FakeClock

from .conftest import T0, settings

pytestmark = pytest.mark.timeout(120)

INTENTS = ("Refund", "refund_all", "Ship%Now", "a/b", "Ünïcode", "ship-it")
PAYLOADS = (5, 1.5, None, "text", [1, {"k": None}], {"nested": {"x": [True, False]}}, {"pad": "p" * 300})


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    """Executions of several intents and fates, forks, an invalidated and a pinned one,
    compacted; then a recorder that is SIGKILLed leaves a finished and a running execution in
    the WAL alone (no recorder runs while the tests read)."""
    d = str(tmp_path_factory.mktemp("lite") / "data")
    clock = FakeClock()
    with tracedb.open(d, config=settings(), clock=clock) as store:
        ids = []
        for i in range(30):
            clock.ns += 1_000_000_000 if i % 7 else 0  # some share a creation time: the id breaks ties
            ex = store.start(INTENTS[i % len(INTENTS)], {"intent": "x", "i": i}, f"exec-{i:03d}-{'ab'[i % 2]}")
            for j in range(i % 5):
                clock.ns += 1_000
                ex.event("tool.responded", PAYLOADS[(i + j) % len(PAYLOADS)])
            if i % 3 == 0:  # a model call (usage, a model priced or not) and a failed tool call
                clock.ns += 10**9 * (i % 4)
                ex.event("llm.responded", {"response": {"model": ("gpt-4o", "own-model")[i % 2],
                                                        "usage": {"input_tokens": 10 * i, "output_tokens": i}}})
                ex.event("tool.responded", {"error": {"code": f"E{i % 2}", "message": "no"}})
            if i % 4:
                clock.ns += 1_000
                ex.finish({"status": "success", "i": i})
            ids.append(ex.execution_id)
        store.invalidate(ids[5], "bad data")
        store.pin(ids[9])
        fork = store.start(INTENTS[0], {"intent": "x"}, "exec-fork", parent_execution_id=ids[9], forked_at_seq=1)
        fork.event("tool.responded", {"forked": True})
        fork.finish({"status": "success"})
    from tests.damage.conftest import Recorder

    r = Recorder(d, "crash")  # exec-done (finished), exec-cut (running): in the WAL only
    r.ready()
    r.kill()
    return d


def readers(data_dir):
    cfg = load_config(None, overrides={"data_dir": data_dir})
    lite = Reader.open(cfg)
    assert lite._lite is not None, "Reader.open reads a current SQLite file through sqlite3"
    engine = db.open_store_engine(cfg.database)
    return lite, Reader(engine, owns_engine=True, config=cfg)


def outcome(call):
    try:
        return ("ok", call())
    except TraceDBError as e:
        return (type(e).__name__, e.message, e.hint, e.exit_code)


def all_pages(reader, where, limit):
    pages, before = [], None
    while True:
        page = reader.page(where, before=before, limit=limit)
        pages.append(([dataclasses.asdict(i) for i in page.items], page.next_cursor))
        if page.next_cursor is None:
            return pages
        before = page.next_cursor


FILTERS = [
    EVERYTHING,
    *(Filter(status=s) for s in ("running", "completed", "incomplete", "invalidated")),
    Filter(intent="Refund"), Filter(intent="Ship%Now"), Filter(search="%"), Filter(search="_"),
    Filter(search="REFUND"), Filter(search="a/b"), Filter(search="ünï"), Filter(search="ship"),
    Filter(replayable=True), Filter(replayable=False),
    Filter(since=(T0 + 5 * 10**9) / 1e9), Filter(until=(T0 + 12 * 10**9) / 1e9),
    Filter(status="completed", search="re", since=T0 / 1e9, replayable=True),
    *(Filter(outcome=o) for o in ("succeeded", "failed", "incomplete", "running")),
    Filter(model="gpt-4o"), Filter(model="own-model"), Filter(model="gpt"), Filter(error="E1"),
    Filter(min_cost=0), Filter(min_cost=0.0005), Filter(slower_than=1), Filter(slower_than=0),
    Filter(outcome="succeeded", model="gpt-4o", min_cost=0, slower_than=0.5),
]


def test_pages_are_the_same_through_both_paths(store_dir):
    lite, engine = readers(store_dir)
    with lite, engine:
        assert lite.pending and lite.pending.rows.keys() == engine.pending.rows.keys() == {"exec-done", "exec-cut"}
        for where in FILTERS:
            for limit in (1, 4, 50):
                assert all_pages(lite, where, limit) == all_pages(engine, where, limit), (where, limit)
        assert outcome(lambda: lite.page(Filter(status="nope"))) == outcome(lambda: engine.page(Filter(status="nope")))
        assert outcome(lambda: lite.page(limit=-1)) == outcome(lambda: engine.page(limit=-1))
        assert outcome(lambda: lite.page(before="garbage")) == outcome(lambda: engine.page(before="garbage"))
        assert lite.count() == engine.count() == 33


def test_ids_records_and_timelines_are_the_same_through_both_paths(store_dir):
    lite, engine = readers(store_dir)
    with lite, engine:
        ids = [s.execution_id for s in engine.each()]
        assert len(ids) == 33
        prefixes = {"", "exec", "exec-0", "exec-00", "exec-01", "exec-fork", "exec-c", "exec-d", "exec-\U0010ffff",
                    "nope", *ids, *(i[:-1] for i in ids)}
        for p in sorted(prefixes):
            assert outcome(lambda: lite.resolve(p)) == outcome(lambda: engine.resolve(p)), p
        for eid in ids:
            a, b = lite.timeline(eid), engine.timeline(eid)
            assert a.record.to_dict() == b.record.to_dict(), eid
            assert (a.event_times, a.created_at_ns, a.updated_at_ns, a.pinned, a.status_note) == (
                b.event_times, b.created_at_ns, b.updated_at_ns, b.pinned, b.status_note), eid
            assert lite.inspect(eid) == engine.inspect(eid)
            assert outcome(lambda: lite.replay(eid).response) == outcome(lambda: engine.replay(eid).response)
        assert lite.get("exec-cut").status == "incomplete" and lite.get("exec-done").status == "completed"
        # Reads beyond the common ones make the engine when first needed, and agree.
        assert lite.lineage("exec-fork").to_dict() == engine.lineage("exec-fork").to_dict()
        assert lite.status_counts() == engine.status_counts()


def test_a_read_command_loads_neither_sqlalchemy_nor_pydantic(store_dir):
    """Finding and reading one execution, or listing a page of them (each row judged, its
    record read), on a SQLite store loads no SQLAlchemy, Alembic or pydantic, nor the WAL's
    writer (asyncio), even with WAL records to fold in; nor importlib.metadata, which the crc32c
    package's __init__ would (its C extension is loaded by itself), nor tomllib without a
    config file."""
    script = (
        "import sys\n"
        "from tracedb.cli import main\n"
        "try:\n"
        "    main.main(sys.argv[1:], standalone_mode=False)\n"
        "finally:\n"
        "    print('LOADED', *sorted(m for m in ('sqlalchemy', 'pydantic', 'alembic', 'sqlmodel', 'wal.writer', 'asyncio', 'importlib.metadata', 'crc32c', 'tomllib') if m in sys.modules),"
        " file=sys.stderr)\n"
    )
    for args, heavy in ((["inspect", "exec-003"], []), (["trace", "get", "exec-007"], []),
                        (["replay", "exec-003-b", "--json"], []), (["inspect", "exec-cut"], []),
                        (["inspect", "--list"], []), (["inspect", "--list", "--all", "--format", "csv"], [])):
        r = subprocess.run([sys.executable, "-c", script, "--data-dir", store_dir, *args], capture_output=True,
                           text=True, cwd=os.getcwd(), timeout=60)
        loaded = [line for line in r.stderr.splitlines() if line.startswith("LOADED")]
        assert r.returncode == 0 and r.stdout, (args, r.stderr)
        assert loaded == [" ".join(["LOADED", *heavy])], (args, r.stderr)
