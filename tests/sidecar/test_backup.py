"""`tracedb backup` next to a recorder under load, then `tracedb restore`: every event acknowledged
before the backup began is in the restored store, and the restored store opens and verifies."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import tracedb
import wal
from tracedb.sidecar.client import Client

from tests.waiting import wait_until

from tests.serving import Serve
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
    recorder = Serve(data_dir, env={"TRACEDB_WAL_SEGMENT_SIZE_BYTES": str(256 << 10), **LOADS[load_kind]})
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


def _small_store(root: str) -> str:
    """A data directory with a few executions, and evidence of damage its WAL keeps (a .broken
    copy, a kept torn tail); its path."""
    data_dir = os.path.join(root, "live")
    with tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
        for i in range(5):
            store.start("X", {"prompt": f"secret {i}"}).finish({"status": "success"})
    wal_dir = os.path.join(data_dir, "wal")
    seg = wal.list_segments(wal_dir)[-1]
    shutil.copyfile(seg.path, seg.path + ".broken")
    with open(seg.path + ".tail-4096", "wb") as f:
        f.write(b"\x01" * 64)
    return data_dir


def _small_backup(root: str) -> str:
    """A backup of `_small_store`; its path."""
    data_dir = _small_store(root)
    backup_dir = os.path.join(root, "backup")
    r = _tracedb("--data-dir", data_dir, "backup", backup_dir)
    assert r.returncode == 0, r.stderr
    return backup_dir


def _socket_at(path: str) -> None:
    """A Unix socket file at `path` (bound in a short directory, then moved: paths are short)."""
    short = tempfile.mkdtemp(prefix="tdb")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(os.path.join(short, "s"))
        os.rename(os.path.join(short, "s"), path)
    finally:
        s.close()
        shutil.rmtree(short)


A_SEGMENT = "0000000000000099-0000000000009999.wal"  # a name a backup may hold
REFUSED = {
    # kind: (what to put where, the entry the error names)
    "database-linked-outside": lambda b, outside: (os.unlink(os.path.join(b, "traces.db")),
                                                   os.symlink(outside, os.path.join(b, "traces.db")), "traces.db"),
    "segment-linked-to-passwd": lambda b, _o: (os.symlink("/etc/passwd", os.path.join(b, "wal", A_SEGMENT)),
                                               A_SEGMENT),
    "link-to-passwd": lambda b, _o: (os.symlink("/etc/passwd", os.path.join(b, "passwd")), "passwd"),
    "wal-linked-outside": lambda b, outside: (shutil.rmtree(os.path.join(b, "wal")),
                                              os.symlink(os.path.dirname(outside), os.path.join(b, "wal")), "wal"),
    "device": lambda b, _o: (os.mknod(os.path.join(b, "wal", A_SEGMENT), stat.S_IFCHR | 0o600, os.makedev(1, 3)),
                             A_SEGMENT),
    "fifo": lambda b, _o: (os.mkfifo(os.path.join(b, "wal", A_SEGMENT)), A_SEGMENT),
    "socket": lambda b, _o: (_socket_at(os.path.join(b, "wal", A_SEGMENT)), A_SEGMENT),
    "extra-file": lambda b, _o: (open(os.path.join(b, "notes.txt"), "w").close(), "notes.txt"),
    "extra-wal-file": lambda b, _o: (open(os.path.join(b, "wal", "APPLIED.old"), "w").close(), "APPLIED.old"),
    "extra-directory": lambda b, _o: (os.mkdir(os.path.join(b, "wal", "more")), "more"),
}


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_restore_refuses_anything_but_the_regular_files_a_backup_holds_and_writes_nothing(tdir, kind):
    if kind == "device" and os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    backup_dir = _small_backup(tdir)
    outside = os.path.join(tdir, "elsewhere", "secret.db")
    os.makedirs(os.path.dirname(outside))
    shutil.copyfile(os.path.join(backup_dir, "traces.db"), outside)
    *_made, named = REFUSED[kind](backup_dir, outside)
    target = os.path.join(tdir, "restored", "data")
    r = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", target, "restore", backup_dir],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 4, r.stdout + r.stderr
    assert r.stderr.startswith("error: ") and "\nhint: " in r.stderr, r.stderr
    assert os.path.join(backup_dir, *(["wal"] if named in (A_SEGMENT, "APPLIED.old", "more") else []), named) in r.stderr
    assert not os.path.lexists(os.path.join(tdir, "restored")), "restore wrote something"
    # Into an empty directory that exists: refused the same way, and it stays empty.
    os.makedirs(target)
    r = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", target, "restore", backup_dir],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 4 and os.listdir(target) == [], r.stderr


def _strace_calls(argv: list[str], out: str) -> list[tuple[str, str]]:
    """`argv` run under strace: its mkdir and fsync calls in order, as (call, path)."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (apt-get install strace)")
    r = subprocess.run(["strace", "-f", "-qq", "-y", "-e", "trace=mkdir,mkdirat,fsync,fdatasync", "-o", out, *argv],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    calls = []
    with open(out) as f:
        for line in f:
            if (m := re.search(r'\bmkdir(?:at)?\((?:[^,]*, )?"([^"]+)"', line)) and "= 0" in line:
                calls.append(("mkdir", m.group(1)))
            elif m := re.search(r"\bf(?:data)?sync\(\d+<([^>]+)>\)", line):
                calls.append(("fsync", m.group(1)))
    return calls


def test_restore_makes_every_file_durable_then_wal_then_the_data_directory_then_its_parent(tdir):
    """After a power cut the restored directory must not hold traces.db without wal/ (it would
    refuse to open): the data directory is fsynced once wal/ is in it."""
    backup_dir = _small_backup(tdir)
    target = os.path.join(tdir, "restored", "data")
    wal_dir = os.path.join(target, "wal")
    calls = _strace_calls([sys.executable, "-m", "tracedb", "--data-dir", target, "restore", backup_dir],
                          os.path.join(tdir, "strace.out"))
    files = [p for c, p in calls if c == "fsync" and p.startswith(target + os.sep) and p != wal_dir]
    copied = {os.path.relpath(p, target) for p in files}
    assert copied == {os.path.relpath(os.path.join(b, n), backup_dir)
                      for b, _d, names in os.walk(backup_dir) for n in names}, copied
    last = {p: i for i, (c, p) in enumerate(calls) if c == "fsync"}
    last_file = max(i for i, (c, p) in enumerate(calls) if c == "fsync" and p in files)
    made_wal = calls.index(("mkdir", wal_dir))
    assert last_file < last[wal_dir] < last[target] < last[os.path.dirname(target)], calls
    assert made_wal < last[target]


def test_backup_and_restore_write_private_files_whatever_the_umask(tdir):
    backup_dir = os.path.join(tdir, "b", "backup")
    data_dir = _small_store(tdir)
    restored = os.path.join(tdir, "r", "restored")
    for args in (("--data-dir", data_dir, "backup", backup_dir), ("--data-dir", restored, "restore", backup_dir)):
        r = subprocess.run(["sh", "-c", 'umask 000; exec "$@"', "sh", sys.executable, "-m", "tracedb", *args],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    for root in (os.path.join(tdir, "b"), os.path.join(tdir, "r")):
        for base, dirs, names in os.walk(root):
            for path in [base] + [os.path.join(base, n) for n in names]:
                m = os.lstat(path).st_mode
                assert stat.S_IMODE(m) == (0o700 if stat.S_ISDIR(m) else 0o600), (path, oct(m))
    wal_names = sorted(os.listdir(os.path.join(restored, "wal")))
    assert any(n.endswith(".wal.broken") for n in wal_names) and any(".tail-" in n for n in wal_names)
    assert sorted(os.listdir(os.path.join(backup_dir, "wal"))) == wal_names
    with tracedb.open(restored, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
        assert len(store.list()) == 5
