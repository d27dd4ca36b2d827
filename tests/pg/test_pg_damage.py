"""Reads before recovery and WAL salvage with a fleet's PostgreSQL database: a read through one
data directory shows that directory's uncompacted WAL records and left-running executions, and
nothing of another recorder's."""

from __future__ import annotations

import os

import orjson
import pytest
from click.testing import CliRunner

import wal
from tests.damage.conftest import Recorder, flip_bit
from tracedb.cli import main

pytestmark = pytest.mark.timeout(240)


def cli(pg_url: str, data_dir: str):
    runner = CliRunner()

    def run(*args):
        return runner.invoke(main, ["--db", pg_url, "--data-dir", data_dir, *args], catch_exceptions=False)

    return run


def killed(data_dir: str, pg_url: str, *args) -> int:
    r = Recorder(data_dir, *args, env={"RECORDER_DB_URL": pg_url})
    lsn = r.ready()
    r.kill()
    return lsn


def test_reads_before_recovery_see_only_their_own_recorders_wal(pg_url, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    killed(a, pg_url, "compacted", 5, 3, 1 << 20)  # a's executions are in the database
    killed(b, pg_url, "crash")  # b's are only in its WAL
    run_b, run_a = cli(pg_url, b), cli(pg_url, a)
    rows = {r["execution_id"]: r for r in orjson.loads(run_b("inspect", "--list", "--json").stdout)}
    assert {"exec-done", "exec-cut"} <= set(rows) and len(rows) == 7
    assert (rows["exec-cut"]["status"], rows["exec-cut"]["replayable_reason"]) == ("incomplete", "execution_incomplete")
    assert run_b("replay", "exec-cut").exit_code == 6
    assert run_b("replay", "exec-done").exit_code == 0
    # Through a, b's WAL is not ours: b's executions are unknown until b compacts.
    assert {r["execution_id"] for r in orjson.loads(run_a("inspect", "--list", "--json").stdout)} == {
        f"exec-{i:05d}" for i in range(5)
    }
    assert run_a("replay", "exec-cut").exit_code == 3
    assert run_b("recover").exit_code == 0
    rows = {r["execution_id"]: r for r in orjson.loads(run_a("inspect", "--list", "--json").stdout)}
    assert rows["exec-cut"]["status"] == "incomplete" and rows["exec-done"]["replayable"] is True


def test_salvage_into_postgresql(pg_url, tmp_path):
    d = str(tmp_path / "s")
    killed(d, pg_url, "bulk", 40, 5, 64 << 20)
    wal_dir = os.path.join(d, "wal")
    recs = list(wal.read_records(wal_dir))
    target = next(r for r in recs[len(recs) // 2 :] if r.payload[:1] == b"\x01")
    eid, seq = orjson.loads(target.payload[1 : target.payload.index(b"\n")])[:2]
    flip_bit(os.path.join(wal_dir, target.segment), target.offset + 30, 4)
    run = cli(pg_url, d)
    done = orjson.loads(run("wal", "repair", "--salvage", "--json").stdout)
    assert done["corrupted_executions"] == [{"execution_id": eid, "missing_seqs": [seq]}]
    rows = orjson.loads(run("inspect", "--list", "--all", "--json").stdout)
    assert len(rows) == 40 and [r["execution_id"] for r in rows if not r["replayable"]] == [eid]
    assert orjson.loads(run("inspect", eid).stdout)["missing_seqs"] == [seq]
    assert run("verify").exit_code == 0
