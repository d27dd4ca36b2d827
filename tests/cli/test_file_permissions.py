"""A data directory this user may not write (a `restore` run as root, then the recorder's unit
running as its own user) or read: every command says which file refuses it and what to run
(`chown -R`, or run as the unit's user), in one error line and one hint, never a traceback,
and changes nothing.

Root writes through any mode, so each command runs as `nobody` in a process of its own.
"""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

import tracedb

pytestmark = pytest.mark.timeout(300)

EID = "exec-a1b2c3d4"
WRITERS = [
    ["serve"],
    ["migrate"],
    ["compact"],
    ["recover"],
    ["prune", "--older-than", "0s"],
    ["pin", EID],
    ["invalidate", EID, "--reason", "wrong model"],
    ["fork", EID, "--at", "1"],
]
READERS = [
    ["inspect", "--list"],
    ["inspect", EID],
    ["trace", "get", EID],
    ["replay", EID],
    ["export", EID],
    ["verify"],
    ["wal", "scan"],
    ["wal", "repair", "--dry-run"],
]


def _root_owned_store(user) -> str:
    """A store made by root, its files readable by all (what `restore` run as root leaves)."""
    d = os.path.join(user.tmpdir(), "data")
    with tracedb.open(d, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
        ex = store.start("ProcessIntent", {"intent": "ProcessIntent"}, EID)
        ex.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
        ex.event("tool.requested", {"name": "search"})
        ex.finish({"status": "success"})
    subprocess.run(["chmod", "-R", "a+rX", d], check=True)
    return d


def _snapshot(d: str) -> dict:
    out = {}
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            digest = None
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(path, d)] = (st.st_mode, st.st_uid, digest)
    return out


def _refusal(nobody, d: str, args) -> tuple[str, str]:
    """`tracedb --data-dir D ARGS` as nobody: exit code 1 and one error with its hint, no traceback."""
    r = nobody.tracedb("--data-dir", d, *args)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr[-3000:])
    lines = [line for line in r.stderr.splitlines() if not line.startswith("{")]  # serve's JSON logs
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), r.stderr[-3000:]
    return lines[0], lines[1]


@pytest.mark.parametrize("args", WRITERS, ids=" ".join)
def test_a_root_owned_data_directory_names_the_file_and_the_chown(nobody, args):
    d = _root_owned_store(nobody)
    before = _snapshot(d)
    error, hint = _refusal(nobody, d, args)
    assert "Permission denied" in error and d in error, error
    assert f"chown -R nobody {d}" in hint and "run tracedb as the user" in hint and "belongs to root" in hint, hint
    assert _snapshot(d) == before  # refused before anything was written


@pytest.mark.parametrize("args", WRITERS[:5], ids=" ".join)
def test_a_database_left_to_root_in_a_directory_of_the_unit_user_names_the_database(nobody, args):
    # The WAL is the unit user's, the database file root's: SQLite's "attempt to write a
    # readonly database" used to come out as a traceback.
    d = _root_owned_store(nobody)
    nobody.give(d)
    subprocess.run(["chown", "root", os.path.join(d, "traces.db")], check=True)
    error, hint = _refusal(nobody, d, args)
    assert error == f"error: cannot use {os.path.join(d, 'traces.db')}: Permission denied", error
    assert f"chown -R nobody {d}" in hint, hint


@pytest.mark.parametrize("args", READERS[:-2], ids=" ".join)
def test_reads_of_a_root_owned_directory_say_sqlite_needs_to_write_there(nobody, args):
    # After a clean stop there is no traces.db-shm: SQLite must make one to read the database,
    # in the directory, which this user may not write.
    d = _root_owned_store(nobody)
    before = _snapshot(d)
    error, hint = _refusal(nobody, d, args)
    assert error == (f"error: cannot use {d}: Permission denied (SQLite makes traces.db-wal and "
                     "traces.db-shm there)"), error
    assert f"chown -R nobody {d}" in hint, hint
    assert _snapshot(d) == before


def test_the_wal_scan_of_a_root_owned_directory_reads_it(nobody):
    d = _root_owned_store(nobody)
    r = nobody.tracedb("--data-dir", d, "wal", "scan")
    assert r.returncode == 0 and r.stdout.startswith("4 record(s)"), (r.stdout, r.stderr[-3000:])


@pytest.mark.parametrize("args", READERS, ids=" ".join)
def test_reads_of_a_directory_closed_to_this_user_name_it(nobody, args):
    d = _root_owned_store(nobody)
    os.chmod(d, 0o700)
    error, hint = _refusal(nobody, d, args)
    assert "Permission denied" in error and d in error, error
    assert f"chown -R nobody {d}" in hint and f"{d} belongs to root" in hint, hint
