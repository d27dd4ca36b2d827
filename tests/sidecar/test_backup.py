"""`tracedb backup` next to a recorder under load, then `tracedb restore`: every event acknowledged
before the backup began is in the restored store, and the restored store opens and verifies."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

import tracedb
from tracedb.sidecar.client import Client

from tests.waiting import wait_until

from .conftest import ServeProcess
from .helpers import sock_path


def _tracedb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracedb", *args], capture_output=True, text=True, timeout=300)


# Compacting in small batches, the recorder rotates, compacts and deletes segments while the
# backup copies them; compacting nothing, every record acknowledged is in the WAL alone.
LOADS = {
    "compacting": {"TRACEDB_COMPACT_BATCH_RECORDS": "500", "TRACEDB_COMPACT_INTERVAL_MS": "20"},
    "not-compacting": {"TRACEDB_COMPACT_BATCH_RECORDS": "10000000", "TRACEDB_COMPACT_INTERVAL_MS": "3600000"},
}


@pytest.mark.parametrize("load_kind", sorted(LOADS))
def test_a_backup_under_load_restores_every_event_acknowledged_before_it_began(tmp_path, load_kind):
    data_dir = str(tmp_path / "live")
    recorder = ServeProcess(data_dir, env={"TRACEDB_WAL_SEGMENT_SIZE_BYTES": str(256 << 10), **LOADS[load_kind]})
    acked: list[tuple[float, str, int]] = []  # (ack time, execution id, seq)
    stop = threading.Event()

    def load(worker: int) -> None:
        with Client("unix:" + sock_path(data_dir)) as client:
            while not stop.is_set():
                ex = client.start("Load", {"worker": worker})
                for k in range(20):
                    seq = ex.event("tool.responded", {"k": k, "text": "x" * 200})
                    acked.append((time.monotonic(), ex.execution_id, seq))
                seq = ex.finish({"status": "success"})
                acked.append((time.monotonic(), ex.execution_id, seq))

    threads = [threading.Thread(target=load, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(acked) > 3000, 120, "the load to get going")
        began = time.monotonic()
        before = [(eid, seq) for t, eid, seq in list(acked) if t < began]
        backup_dir = str(tmp_path / "backup")
        r = _tracedb("--data-dir", data_dir, "backup", backup_dir)
        assert r.returncode == 0, r.stderr
        wait_until(lambda: len(acked) > len(before) + 500, 120, "more load after the backup")
    finally:
        stop.set()
        for t in threads:
            t.join()
        code, err = recorder.terminate()
    assert code == 0, err
    assert "backed up to" in r.stdout

    restored = str(tmp_path / "restored")
    r = _tracedb("--data-dir", restored, "restore", backup_dir)
    assert r.returncode == 0, r.stderr
    assert _tracedb("--data-dir", restored, "verify").returncode == 0
    with tracedb.open(restored, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
        seqs: dict[str, set] = {}
        for eid, seq in before:
            seqs.setdefault(eid, set()).add(seq)
        for eid, wanted in seqs.items():
            got = {e.seq for e in store.get(eid).events}
            assert wanted <= got, f"{eid}: acknowledged {sorted(wanted - got)} before the backup, missing after restore"
    assert len(before) > 3000


def test_backup_refuses_a_destination_in_use_and_restore_a_directory_in_use(tmp_path):
    data_dir = str(tmp_path / "d")
    with tracedb.open(data_dir, config={"compact_interval_ms": 0}) as store:
        store.start("X", {}).finish({"status": "success"})
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "something").write_text("x")
    r = _tracedb("--data-dir", data_dir, "backup", str(busy))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "not an empty directory" in r.stderr
    for inside in (os.path.join(data_dir, "bk"), os.path.join(data_dir, "wal", "bk")):
        r = _tracedb("--data-dir", data_dir, "backup", inside)
        assert r.returncode == 2 and "inside the data directory" in r.stderr, r.stderr
        assert not os.path.exists(inside)
    r = _tracedb("--data-dir", data_dir, "restore", str(tmp_path / "nothing-here"))
    assert r.returncode == 2  # no such backup: a usage error
    assert _tracedb("--data-dir", data_dir, "backup", str(tmp_path / "ok")).returncode == 0
    r = _tracedb("--data-dir", data_dir, "restore", str(tmp_path / "ok"))
    assert r.returncode == 2 and "not an empty directory" in r.stderr
    r = _tracedb("--data-dir", str(tmp_path / "ok" / "sub"), "restore", str(tmp_path / "ok"))
    assert r.returncode == 2 and "inside the backup" in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "ok" / "sub")  # the backup is left as it was made
    r = _tracedb("--data-dir", data_dir, "backup", "")
    assert r.returncode == 2 and "the destination is empty" in r.stderr, r.stderr
    assert os.listdir(tmp_path / "ok")
