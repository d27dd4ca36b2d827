"""What tracedb writes is private: a data directory it makes is 0700 and every file in it 0600
(traces.db and SQLite's files beside it, WAL segments, LOCK, APPLIED, RECORDER_ID, the socket),
whatever the umask of the process, which tracedb leaves as it was; another local user can read
none of it. A data directory that exists keeps its mode, with one warning when others may enter
it. Each directory level tracedb makes is fsynced into its parent."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile

import pytest

import tracedb
from tests.waiting import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WARNING = "open to other local users"
SETTINGS = {"wal_segment_size_bytes": 4096, "wal_preallocate": True, "compact_interval_ms": 0, "idle_timeout_s": 0}

# Records, compacts (segments rotate and are deleted, APPLIED is written), and keeps the store
# open (SQLite's -wal and -shm exist only then) until its standard input closes.
_EMBEDDED = r"""
import json, os, sys
import tracedb
d = sys.argv[1]
umask = os.umask(0); os.umask(umask)
with tracedb.open(d, config=json.loads(sys.argv[2])) as store:
    for i in range(80):
        ex = store.start("Ask", {"prompt": "secret prompt %d" % i})
        ex.event("llm.requested", {"messages": ["secret %d" % i]})
        ex.finish({"status": "success", "answer": "secret answer"})
    store.compact()
    print("READY", oct(os.umask(umask)), flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def open_base():
    """A directory every local user may enter (tmp_path's parents are private to root): what
    keeps other users out of the data directory must be the data directory's own modes."""
    base = tempfile.mkdtemp(prefix="tdb", dir="/tmp")
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _in_umask(umask: int, *argv: str) -> list[str]:
    return ["sh", "-c", f'umask {umask:03o}; exec "$@"', "sh", *argv]


def _not_private(root: str) -> dict[str, str]:
    """Every path under `root` (and `root`) whose mode is not 0700 (directory) or 0600 (file,
    socket), by os.lstat."""
    wrong = {}
    paths = [root]
    for base, dirs, files in os.walk(root):
        paths += [os.path.join(base, n) for n in dirs + files]
    for path in paths:
        try:
            m = os.lstat(path).st_mode
        except FileNotFoundError:
            continue  # a segment compacted and deleted meanwhile (the recorder still runs)
        want = 0o700 if stat.S_ISDIR(m) else 0o600
        if stat.S_IMODE(m) != want or not (stat.S_ISDIR(m) or stat.S_ISREG(m) or stat.S_ISSOCK(m)):
            wrong[path] = oct(m)
    return wrong


def _readable_by_nobody(root: str) -> list[str]:
    """The paths under `root` the user nobody can read (a file) or list (a directory)."""
    if os.geteuid() != 0:
        pytest.skip("runuser needs root: another user's access cannot be tried")
    found = []
    for base, dirs, files in os.walk(root):
        for path in [base] + [os.path.join(base, n) for n in files]:
            try:
                m = os.lstat(path).st_mode
            except FileNotFoundError:
                continue  # deleted meanwhile by the running recorder
            if stat.S_ISSOCK(m):
                continue  # its 0600 is checked above; connecting is not reading
            cmd = ["ls", path] if stat.S_ISDIR(m) else ["cat", path]
            r = subprocess.run(["runuser", "-u", "nobody", "--", *cmd], capture_output=True, timeout=30)
            if r.returncode == 0:
                found.append(path)
            elif not os.path.exists(path):
                continue  # deleted between the listing and the try
            else:
                assert b"Permission denied" in r.stderr, r.stderr
    return found


@pytest.mark.parametrize("umask", [0o000, 0o022], ids=["umask000", "umask022"])
def test_the_embedded_store_makes_everything_private(open_base, umask):
    d = os.path.join(open_base, "a", "data")
    proc = subprocess.Popen(
        _in_umask(umask, sys.executable, "-c", _EMBEDDED, d, json.dumps(SETTINGS)),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        line = proc.stdout.readline().split()
        assert line == ["READY", oct(umask)], proc.stderr.read() if not line else line
        names = {os.path.relpath(os.path.join(b, n), d) for b, ds, fs in os.walk(d) for n in ds + fs}
        assert {"traces.db", "traces.db-wal", "traces.db-shm", "RECORDER_ID", "wal", "wal/LOCK", "wal/APPLIED"} <= names
        assert _not_private(os.path.join(open_base, "a")) == {}
        assert _readable_by_nobody(d) == []
    finally:
        proc.communicate("", timeout=60)
    assert proc.returncode == 0
    assert _not_private(os.path.join(open_base, "a")) == {}

    out = os.path.join(open_base, "exported")
    r = subprocess.run(
        _in_umask(umask, sys.executable, "-m", "tracedb", "--data-dir", d, "export", "--all", "-o", out),
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert len(os.listdir(out)) == 80
    assert _not_private(out) == {}


@pytest.mark.parametrize("umask", [0o000, 0o022], ids=["umask000", "umask022"])
def test_tracedb_serve_makes_everything_private(open_base, umask):
    from benchmarks.sidecar import accepts
    from tracedb.sidecar.client import Client

    d = os.path.join(open_base, "data")
    sock = os.path.join(d, "tracedb.sock")
    env = dict(os.environ, TRACEDB_WAL_SEGMENT_SIZE_BYTES="4096", TRACEDB_COMPACT_INTERVAL_MS="20")
    env.pop("TRACEDB_SIDECAR", None)
    proc = subprocess.Popen(
        _in_umask(umask, sys.executable, "-m", "tracedb", "--data-dir", d, "serve"),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO,
    )
    try:
        def listening() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"tracedb serve exited {proc.returncode}: {proc.stderr.read().decode()}")
            return accepts(sock)

        wait_until(listening, 60, "tracedb serve to listen")
        with Client("unix:" + sock) as client:
            for i in range(60):
                ex = client.start("Ask", {"prompt": "secret prompt %d" % i})
                ex.event("llm.requested", {"messages": ["secret"]})
                ex.finish({"status": "success"})
        assert stat.S_ISSOCK(os.lstat(sock).st_mode)
        assert _not_private(d) == {}
        assert _readable_by_nobody(d) == []
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert WARNING not in err.decode()  # a directory it made itself
    assert _not_private(d) == {}


def test_an_existing_data_directory_keeps_its_mode_and_is_warned_about_once(tmp_path, caplog):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o755)
    caplog.set_level(logging.WARNING, logger="tracedb")
    for _ in range(3):  # an agent that opens and closes its store in a loop
        with tracedb.open(str(d), config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
            store.start("X", {}).finish({"status": "success"})
    warnings = [r for r in caplog.records if WARNING in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    assert str(d) in warnings[0].getMessage() and "0755" in warnings[0].getMessage()
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o755
    assert _not_private(str(d / "wal")) == {}
    assert stat.S_IMODE(os.stat(d / "traces.db").st_mode) == 0o600


def test_tracedb_serve_warns_once_on_stderr_and_the_cli_commands_do_not(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o750)
    env = dict(os.environ)
    env.pop("TRACEDB_SIDECAR", None)
    tracedb_cmd = [sys.executable, "-m", "tracedb", "--data-dir", str(d)]
    proc = subprocess.Popen(tracedb_cmd + ["serve"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=REPO)
    try:
        from benchmarks.sidecar import accepts

        wait_until(lambda: accepts(str(d / "tracedb.sock")) or proc.poll() is not None, 60, "tracedb serve")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    lines = [line for line in err.decode().splitlines() if WARNING in line]
    assert len(lines) == 1 and str(d) in lines[0] and "0750" in lines[0], err.decode()
    for args in (["recover"], ["compact"], ["inspect", "--list"]):
        r = subprocess.run(tracedb_cmd + args, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
        assert r.returncode == 0 and WARNING not in r.stderr, (args, r.stderr)


def _strace(argv: list[str], out: str) -> list[tuple[str, str]]:
    """Run `argv` under strace; its mkdir and fsync calls in order, as (call, path)."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (apt-get install strace)")
    r = subprocess.run(
        ["strace", "-f", "-qq", "-y", "-e", "trace=mkdir,mkdirat,fsync,fdatasync", "-o", out, *argv],
        capture_output=True, text=True, timeout=180, cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    calls = []
    with open(out) as f:
        for line in f:
            if m := re.search(r'\bmkdir(?:at)?\((?:[^,]*, )?"([^"]+)"', line):
                if "= 0" in line:
                    calls.append(("mkdir", m.group(1)))
            elif m := re.search(r"\bf(?:data)?sync\(\d+<([^>]+)>\)", line):
                calls.append(("fsync", m.group(1)))
    return calls


def test_every_directory_level_the_store_makes_is_fsynced_into_its_parent(tmp_path):
    base = str(tmp_path)
    d = os.path.join(base, "x", "y", "data")
    code = "import sys, tracedb; tracedb.open(sys.argv[1], config={'compact_interval_ms': 0}).close()"
    calls = [(c, p) for c, p in _strace([sys.executable, "-c", code, d], str(tmp_path / "strace.out"))
             if p.startswith(base) and not p.startswith(os.path.join(base, "strace"))]
    dirs = [os.path.join(base, "x"), os.path.join(base, "x", "y"), d, os.path.join(d, "wal")]
    made = [(c, p) for c, p in calls if c == "mkdir" or p in [base] + dirs]
    assert made[:8] == [
        ("mkdir", dirs[0]), ("fsync", base), ("mkdir", dirs[1]), ("fsync", dirs[0]),
        ("mkdir", d), ("fsync", dirs[1]), ("mkdir", dirs[3]), ("fsync", d),
    ], made


def test_a_database_file_left_0644_is_made_private_with_what_sqlite_keeps_beside_it(tmp_path):
    """SQLite makes its -wal and -shm files with the database file's mode: a traces.db an older
    version left 0644 would go on spreading new traces into 0644 files. The recorder makes it
    0600 when it opens it (a file of another user is left as it is)."""
    d = str(tmp_path / "d")
    settings = {"compact_interval_ms": 0, "idle_timeout_s": 0}
    with tracedb.open(d, config=settings) as store:
        store.start("X", {}).finish({"status": "success"})
    os.chmod(os.path.join(d, "traces.db"), 0o644)
    with tracedb.open(d, config=settings) as store:
        store.start("Y", {"prompt": "secret"}).finish({"status": "success"})
        assert _not_private(d) == {}
        assert os.path.exists(os.path.join(d, "traces.db-wal"))


def test_migrate_create_makes_a_private_data_directory_whatever_the_umask(tmp_path):
    d = str(tmp_path / "new" / "data")
    r = subprocess.run(
        _in_umask(0, sys.executable, "-m", "tracedb", "--data-dir", d, "migrate", "--create"),
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert os.path.exists(os.path.join(d, "traces.db"))
    assert _not_private(str(tmp_path / "new")) == {}
