"""`recover --rebuild` of a WAL in which an execution id was used again after `prune` deleted its
first execution: the rebuilt store holds what the live one held (the newer execution only),
through real processes: `tracedb serve`, the recording client, the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import orjson
import pytest

import wal
from tests.serving import Serve
from tests.sidecar.helpers import rmtree, short_tempdir, sock_path
from tests.waiting import wait_until
from tracedb.client import connect

pytestmark = pytest.mark.timeout(300)


def tracedb_cli(data_dir: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracedb", "--data-dir", data_dir, *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )


def run_job(data_dir: str, answer: str, events: int) -> None:
    with connect("unix:" + sock_path(data_dir)) as client:
        ex = client.start("J", {"intent": "J", "answer": answer}, execution_id="job-1")
        for i in range(events):
            ex.event("tool.requested", {"run": answer, "i": i})
        ex.finish({"status": "success", "answer": answer})


def compacted(data_dir: str) -> bool:
    r = tracedb_cli(data_dir, "inspect", "--list", "--all", "--json")
    return r.returncode == 0 and any(row["status"] == "completed" for row in orjson.loads(r.stdout))


@pytest.fixture
def data_dir():
    d = short_tempdir()
    yield os.path.join(d, "pr")
    rmtree(d)


# Compaction batch sizes: the whole WAL in one batch (both starts in it); one record per batch (the
# older execution's rows are in the database when the newer start comes); three (the newer start
# comes in the batch that also finishes the older one).
@pytest.mark.parametrize("batch", [20000, 1, 3])
def test_rebuild_keeps_only_the_execution_that_reused_a_pruned_id(data_dir, batch):
    os.makedirs(data_dir)
    serve = Serve(data_dir)
    try:
        run_job(data_dir, "first", 3)
        wait_until(lambda: compacted(data_dir), 60, "the first job-1 in the database")
        pruned = tracedb_cli(data_dir, "prune", "--older-than", "0s")
        assert pruned.returncode == 0 and "deleted 1 trace" in pruned.stdout, pruned.stdout + pruned.stderr
        run_job(data_dir, "second", 1)  # accepted again: the database no longer holds job-1
    finally:
        code, err = serve.terminate()
    assert code == 0, err
    live = orjson.loads(tracedb_cli(data_dir, "trace", "get", "job-1", "--json").stdout)
    assert [e["seq"] for e in live["events"]] == [1, 2]

    damaged = data_dir + "2"
    shutil.copytree(data_dir, damaged, symlinks=True)
    os.truncate(os.path.join(damaged, "traces.db"), 4096)
    rebuilt = tracedb_cli(damaged, "recover", "--rebuild", env={"TRACEDB_COMPACT_BATCH_RECORDS": str(batch)})
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "Traceback" not in rebuilt.stderr
    assert os.path.exists(os.path.join(damaged, "traces.db.damaged"))
    got = orjson.loads(tracedb_cli(damaged, "trace", "get", "job-1", "--json").stdout)
    assert [e["seq"] for e in got["events"]] == [1, 2]
    assert got["events"][0]["payload"] == {"run": "second", "i": 0}
    assert got["finalResponse"] == {"status": "success", "answer": "second"}
    assert got["envelope"] == live["envelope"]
    assert got == live
    assert tracedb_cli(damaged, "verify").returncode == 0
    # The rebuilt directory opens again: recover, and a recorder that starts and stops.
    assert tracedb_cli(damaged, "recover").returncode == 0
    again = Serve(damaged)
    code, err = again.terminate()
    assert code == 0, err


def test_a_rebuild_that_stops_says_where_it_left_the_files(recorded, cli):
    data_dir, _lsn = recorded("crash")
    run = cli(data_dir)
    assert run("recover").exit_code == 0
    # A record this tracedb cannot apply (a newer tracedb's op) after what the recorder wrote.
    log = wal.open_wal(os.path.join(data_dir, "wal"), preallocate=False)
    log.append(orjson.dumps({"op": "from-the-future", "id": "exec-later", "t": 1}))
    log.close()
    db_path = os.path.join(data_dir, "traces.db")
    os.truncate(db_path, 4096)
    with open(db_path, "rb") as f:
        damaged_bytes = f.read()
    r = tracedb_cli(data_dir, "recover", "--rebuild")
    assert r.returncode == 4, r.stderr
    assert "Traceback" not in r.stderr
    assert "unknown op 'from-the-future'" in r.stderr
    assert f"the damaged file is kept as {db_path}.damaged" in r.stderr
    assert "tracedb recover` goes on from there" in r.stderr  # `<this python> -m tracedb recover`
    with open(db_path + ".damaged", "rb") as f:
        assert f.read() == damaged_bytes
    # What came before the record is in the new database, and reads show it.
    listed = run.json("inspect", "--list", "--all", "--json")
    assert sorted(row["execution_id"] for row in listed) == ["exec-cut", "exec-done"]
