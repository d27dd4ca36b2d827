"""A read that cannot see every file says so: a WAL directory, a segment or a database file
this process may not read (EACCES), or that the disk fails to read (EIO), is an error naming
the file, with a hint, for every read command, the library's readers and the web view; never a
partial answer from the files that could be read.

Root reads through chmod, so the refusals are tested as `nobody` on a copy it owns.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import orjson
import pytest

from tests.damage.conftest import Recorder

pytestmark = pytest.mark.timeout(300)

# Three executions compacted into the database, then two that only the WAL holds (the recorder
# was killed before compacting them), the last in a segment of its own.
IN_DATABASE = ["exec-00000", "exec-00001", "exec-00002"]
ONLY_IN_WAL = ["exec-00003", "exec-00004"]
WAL_ONLY_ID = ONLY_IN_WAL[-1]
READS = [
    ["inspect", "--list", "--all"],
    ["inspect", "--list", "--json"],
    ["inspect", WAL_ONLY_ID],
    ["trace", "get", WAL_ONLY_ID],
    ["replay", WAL_ONLY_ID],
    ["export", WAL_ONLY_ID],
    ["verify"],
]


def _split_store(data_dir: str) -> None:
    for args in (("compacted", 3, 2, 4096), ("bulk", 2, 20, 4096, 3)):
        r = Recorder(data_dir, *args)
        r.ready()
        r.kill()


@pytest.fixture(scope="module")
def split_store(tmp_path_factory) -> str:
    """The store above, made once (as root); each test copies it."""
    d = str(tmp_path_factory.mktemp("unreadable") / "data")
    _split_store(d)
    return d


def _copy_for(user, split_store) -> str:
    d = os.path.join(user.tmpdir(), "data")
    shutil.copytree(split_store, d)
    user.give(d)
    return d


def _last_segment(data_dir: str) -> str:
    wal_dir = os.path.join(data_dir, "wal")
    return os.path.join(wal_dir, sorted(n for n in os.listdir(wal_dir) if n.endswith(".wal"))[-1])


def _refused(r, path: str, code: int = 1, *, says: str = "Permission denied") -> None:
    """One error line naming `path`, one hint line (with --json: one JSON error); nothing on
    standard output."""
    assert r.returncode == code, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert r.stdout == "", r.stdout[-500:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    if "--json" in r.args:
        error = orjson.loads(r.stderr)["error"]
        message, hint = error["message"], error["hint"]
        assert error["exit_code"] == code
    else:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), r.stderr
        message, hint = lines[0], lines[1]
    assert path in message and says in message, message
    assert hint, r.stderr


def test_the_copy_reads_whole_as_nobody(nobody, split_store):
    # What the refusals below are measured against: the same copy, readable, reads whole.
    d = _copy_for(nobody, split_store)
    r = nobody.tracedb("--data-dir", d, "inspect", "--list", "--json")
    assert r.returncode == 0, r.stderr
    assert sorted(row["execution_id"] for row in orjson.loads(r.stdout)) == IN_DATABASE + ONLY_IN_WAL
    assert nobody.tracedb("--data-dir", d, "trace", "get", WAL_ONLY_ID).returncode == 0


@pytest.mark.parametrize("args", READS, ids=" ".join)
def test_an_unreadable_wal_directory_is_an_error_naming_it(nobody, split_store, args):
    d = _copy_for(nobody, split_store)
    os.chmod(os.path.join(d, "wal"), 0)
    r = nobody.tracedb("--data-dir", d, *args)
    _refused(r, os.path.join(d, "wal"))
    assert f"chmod -R u+rwX {d}" in r.stderr  # nobody owns it: its mode refuses


@pytest.mark.parametrize("args", READS, ids=" ".join)
def test_an_unreadable_segment_is_an_error_naming_it(nobody, split_store, args):
    d = _copy_for(nobody, split_store)
    segment = _last_segment(d)
    os.chmod(segment, 0)
    _refused(nobody.tracedb("--data-dir", d, *args), segment)


@pytest.mark.parametrize("args", READS, ids=" ".join)
def test_an_unreadable_database_is_an_error_naming_it(nobody, split_store, args):
    d = _copy_for(nobody, split_store)
    os.chmod(os.path.join(d, "traces.db"), 0)
    _refused(nobody.tracedb("--data-dir", d, *args), os.path.join(d, "traces.db"))


@pytest.mark.parametrize("name", ["wal/LOCK", "RECORDER_ID"])
def test_an_unreadable_lock_or_recorder_id_is_an_error_naming_it(nobody, split_store, name):
    # Without the lock file it cannot be told whether a recorder runs; without the recorder id,
    # which of the database's rows are this directory's.
    d = _copy_for(nobody, split_store)
    os.chmod(os.path.join(d, name), 0)
    for args in (["inspect", "--list", "--all"], ["trace", "get", WAL_ONLY_ID]):
        _refused(nobody.tracedb("--data-dir", d, *args), os.path.join(d, name))


@pytest.mark.parametrize("make_unreadable", ["wal", "segment", "traces.db"])
def test_the_library_readers_raise_the_error_that_names_the_file(nobody, split_store, make_unreadable):
    d = _copy_for(nobody, split_store)
    path = {"wal": os.path.join(d, "wal"), "segment": _last_segment(d), "traces.db": os.path.join(d, "traces.db")}[
        make_unreadable]
    os.chmod(path, 0)
    code = """
import asyncio, sys
from tracedb.config import load_config
from tracedb.errors import FileAccessError
from tracedb.reads.reader import AsyncReader, Reader

config = load_config(None, overrides={"data_dir": sys.argv[1]})
try:
    with Reader.open(config) as reader:
        print("Reader read", len(reader.page().items))
except FileAccessError as e:
    print("Reader", e.path)

async def main():
    try:
        reader = await AsyncReader.open(config)
        try:
            print("AsyncReader read", len((await reader.page()).items))
        finally:
            await reader.close()
    except FileAccessError as e:
        print("AsyncReader", e.path)

asyncio.run(main())
"""
    r = nobody.python(code, d)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"Reader {path}", f"AsyncReader {path}"], r.stdout


def test_the_web_view_says_it_cannot_read_the_wal(nobody, split_store):
    import httpx

    d = _copy_for(nobody, split_store)
    ui = nobody.start_tracedb("--data-dir", d, "ui", "--port", "0", "--json")
    try:
        line = ui.stdout.readline()
        assert line, ui.stderr.read()
        url, _, token = orjson.loads(line)["url"].partition("?token=")  # the address carries the token once
        auth = {"Authorization": f"Bearer {token}"}
        assert WAL_ONLY_ID in httpx.get(url, headers=auth, timeout=30).text  # whole while it can read
        os.chmod(os.path.join(d, "wal"), 0)
        for page in ("", f"e/{WAL_ONLY_ID}", f"api/live?id={WAL_ONLY_ID}&after=0&status=completed"):
            r = httpx.get(url + page, headers=auth, timeout=30)
            assert r.status_code == 500, (page, r.status_code)
            assert "cannot use" in r.text and os.path.join(d, "wal") in r.text, (page, r.text[-1500:])
            assert f"chmod -R u+rwX {d}" in r.text, r.text[-1500:]  # and the hint
    finally:
        ui.send_signal(signal.SIGTERM)
        try:
            ui.wait(30)
        finally:
            ui.stdout.close()
            ui.stderr.close()


def _mem(path: str) -> None:
    """Make `path` read like a failing disk: a symlink to this reader's /proc/self/mem, whose
    offset 0 is never mapped, so the kernel answers every read of it with EIO."""
    os.remove(path)
    os.symlink("/proc/self/mem", path)


@pytest.mark.parametrize("what", ["segment", "traces.db"])
def test_a_file_the_disk_fails_to_read_is_damage_exit_4(split_store, tmp_path, what):
    d = str(tmp_path / "data")
    shutil.copytree(split_store, d)
    path = _last_segment(d) if what == "segment" else os.path.join(d, "traces.db")
    _mem(path)
    for args in READS:
        r = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", d, *args],
                           capture_output=True, text=True, timeout=120)
        _refused(r, path, 4, says="Input/output error")
        assert "dmesg" in r.stderr


@pytest.mark.parametrize("args", READS + [["wal", "repair", "--dry-run"], ["recover", "--rebuild"]], ids=" ".join)
def test_an_unreadable_lock_file_is_an_error_naming_it(nobody, split_store, args):
    """Whether a recorder holds the WAL cannot be told from a lock file this user may not open:
    a command that needs to know (a repair, a rebuild, a read of what is not compacted) says so
    instead of taking the log for free."""
    d = _copy_for(nobody, split_store)
    lock = os.path.join(d, "wal", "LOCK")
    os.chmod(lock, 0)
    _refused(nobody.tracedb("--data-dir", d, *args), lock)
