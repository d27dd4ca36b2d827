"""Online backup and restore of a data directory, next to a running recorder.

A backup is a directory holding what a data directory holds: `traces.db`, a consistent copy made
with SQLite's online backup API, and `wal/`, the WAL segments that hold every record the copy has
not applied. Together they are the store as it was when the backup began, plus whatever was
acknowledged while it ran: opening a restored directory compacts the copied WAL into the copied
database, as recovery does after a crash.

The database is copied first, then the WAL. A recorder deletes a sealed segment only once its
records are applied in a committed transaction, so the copied WAL must start at or below the
copied database's applied LSN + 1; when the recorder deleted a segment between the two copies, the
copy is made again. Every file is fsynced, and each directory after its files.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from dataclasses import dataclass

import wal
from wal.fs import OsFileSystem, write_file_atomic
from wal.reader import APPLIED_FILE, GAPS_FILE, TAIL_MARK

from .config import Config
from .errors import EXIT_USAGE, ConfigError, IntegrityError, StoreNotFoundError, TraceDBError

RECORDER_ID_FILE = "RECORDER_ID"
_ATTEMPTS = 5


@dataclass(frozen=True)
class BackupResult:
    """Where the backup went, the database's applied LSN, and the WAL copied above it."""

    path: str
    applied_lsn: int
    wal_segments: int
    wal_bytes: int
    database_bytes: int


class BackupError(TraceDBError):
    """A backup or restore that cannot be made as asked."""

    code = "backup"


class BackupDestinationError(BackupError):
    """A destination the command refuses before writing anything: a usage error (exit 2)."""

    exit_code = EXIT_USAGE


def backup(config: Config, dest: str) -> BackupResult:
    """Copy the data directory `config` names into `dest` (a new or empty directory)."""
    if config.db_url:
        raise ConfigError(
            "tracedb backup copies an embedded store (its SQLite file and its WAL); this store "
            f"compacts into {config.db_url.split('://')[0]}",
            hint="back the shared database up with its own tools (pg_dump); the data directory's "
            "WAL holds only records not yet compacted",
        )
    if not os.path.isfile(config.sqlite_path):
        raise StoreNotFoundError(config.sqlite_path)
    if _inside(dest, config.data_dir):
        raise BackupDestinationError(
            f"{dest} is inside the data directory it would copy",
            hint="back up to a directory outside the data directory, ideally on another disk",
        )
    _prepare(dest)
    recorder_id = _recorder_id(config)
    fs = OsFileSystem()
    for _ in range(_ATTEMPTS):
        db_bytes = _copy_database(config.sqlite_path, os.path.join(dest, "traces.db"))
        applied = _applied_lsn(os.path.join(dest, "traces.db"), recorder_id)
        wal_dest = os.path.join(dest, "wal")
        shutil.rmtree(wal_dest, ignore_errors=True)
        os.makedirs(wal_dest)
        copied = _copy_segments(config.wal_dir, wal_dest, fs)
        first = copied[0][0] if copied else applied + 1
        if first <= applied + 1:
            break
        # The recorder applied and deleted a segment between the two copies: the database copy
        # made now holds its records.
    else:
        raise BackupError(
            "the recorder deleted WAL segments faster than they could be copied",
            hint="run the backup again, or when the recorder is less busy",
        )
    # What the copied database already applied need not be read again; nothing below `first`
    # is in the copy.
    write_file_atomic(fs, wal_dest, APPLIED_FILE, f"{first}\n".encode())
    if recorder_id:
        write_file_atomic(fs, dest, RECORDER_ID_FILE, (recorder_id + "\n").encode())
    fs.fsync_dir(dest)
    return BackupResult(dest, applied, len(copied), sum(n for _lsn, n in copied), db_bytes)


def restore(backup_dir: str, data_dir: str) -> str:
    """Copy a backup into `data_dir` (new or empty), fsynced; the first open recovers it."""
    if not os.path.isfile(os.path.join(backup_dir, "traces.db")) or not os.path.isdir(os.path.join(backup_dir, "wal")):
        raise StoreNotFoundError(backup_dir)
    if _inside(data_dir, backup_dir):
        raise BackupDestinationError(
            f"{data_dir} is inside the backup {backup_dir}",
            hint="restore into a directory outside the backup: the backup must stay as it was made",
        )
    _prepare(data_dir)
    fs = OsFileSystem()
    for root, dirs, files in os.walk(backup_dir):
        rel = os.path.relpath(root, backup_dir)
        target = os.path.normpath(os.path.join(data_dir, rel))
        os.makedirs(target, exist_ok=True)
        for name in files:
            _copy_file(os.path.join(root, name), os.path.join(target, name), fs)
        fs.fsync_dir(target)
    fs.fsync_dir(os.path.dirname(os.path.abspath(data_dir)))
    return data_dir


def _inside(path: str, directory: str) -> bool:
    """`path` is `directory` or below it (links resolved)."""
    directory = os.path.realpath(directory)
    return os.path.commonpath([directory, os.path.realpath(path)]) == directory


def _prepare(dest: str) -> None:
    if not dest.strip():
        raise BackupDestinationError("the destination is empty", hint="give a new directory")
    if os.path.exists(dest) and (not os.path.isdir(dest) or os.listdir(dest)):
        raise BackupDestinationError(f"{dest} exists and is not an empty directory", hint="give a new directory")
    os.makedirs(dest, exist_ok=True)
    OsFileSystem().fsync_dir(os.path.dirname(os.path.abspath(dest)))


def _recorder_id(config: Config) -> str:
    if config.recorder_id:
        return config.recorder_id
    try:
        with open(os.path.join(config.data_dir, RECORDER_ID_FILE), encoding="ascii") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def _copy_database(src: str, dst: str) -> int:
    """SQLite's online backup: a consistent copy while the recorder goes on writing."""
    if os.path.exists(dst):
        os.unlink(dst)
    source = sqlite3.connect(f"file:{os.path.abspath(src)}?mode=ro", uri=True, timeout=30)
    target = sqlite3.connect(dst)
    try:
        source.backup(target)
        target.execute("PRAGMA journal_mode=WAL")
    finally:
        target.close()
        source.close()
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return os.path.getsize(dst)


def _applied_lsn(db_path: str, recorder_id: str) -> int:
    con = sqlite3.connect(db_path)
    try:
        q = "SELECT max(applied_lsn) FROM compaction_checkpoint"
        row = con.execute(q + (" WHERE recorder_id = ?" if recorder_id else ""), (recorder_id,) if recorder_id else ()).fetchone()
    except sqlite3.Error as e:
        raise IntegrityError(f"the database copy cannot be read: {e}", hint="run `tracedb verify`") from None
    finally:
        con.close()
    return int(row[0] or 0)


def _kept_by_the_log(name: str) -> bool:
    """Files of the WAL directory a backup keeps besides segments: the LSN gaps a repair made
    legal (the log does not read without them), and the evidence of damage (kept torn tails,
    `.broken` copies), which salvage reads."""
    return name == GAPS_FILE or TAIL_MARK in name or ".wal.broken" in name


def _copy_segments(src_dir: str, dst_dir: str, fs: OsFileSystem) -> list[tuple[int, int]]:
    """Copy every segment that is still there, and the files the log keeps beside them; (first
    LSN, bytes) of each segment copied, in order."""
    copied = []
    for name in sorted(os.listdir(src_dir)):
        if _kept_by_the_log(name):
            _copy_file(os.path.join(src_dir, name), os.path.join(dst_dir, name), fs)
    for seg in wal.list_segments(src_dir):
        try:
            n = _copy_file(seg.path, os.path.join(dst_dir, seg.name), fs)
        except FileNotFoundError:
            continue  # applied and deleted meanwhile: the database copy must cover it
        copied.append((seg.first_lsn, n))
    fs.fsync_dir(dst_dir)
    return copied


def _copy_file(src: str, dst: str, fs: OsFileSystem) -> int:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        n = 0
        while chunk := fin.read(1 << 20):
            fout.write(chunk)
            n += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return n
