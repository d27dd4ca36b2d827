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

Everything either writes is private to its owner: directories 0700, files 0600.

`restore` copies exactly what `backup` writes, as regular files: anything else in a backup (a
symbolic link, a device, a FIFO, a socket, a file or directory of another name) is refused, by
name, before anything is written.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import stat
from dataclasses import dataclass

import wal
from wal import format as fmt
from wal.fs import PRIVATE_FILE, OsFileSystem, copy_to_new_file, make_dirs, make_private, write_file_atomic
from wal.reader import APPLIED_FILE, GAPS_FILE

from tracedb.reads import sqlite as sqlite_reads
from tracedb.config import Config
from tracedb.errors import (  # BackupError, BackupDestinationError: also re-exported (their old home)
    BackupDestinationError,
    BackupError,
    ConfigError,
    IntegrityError,
    StoreNotFoundError,
)

RECORDER_ID_FILE = "RECORDER_ID"
DB_FILE = "traces.db"
WAL_DIR = "wal"
_ATTEMPTS = 5
_BROKEN_MARK = ".wal.broken"


@dataclass(frozen=True)
class BackupResult:
    """Where the backup went, the database's applied LSN, and the WAL copied above it."""

    path: str
    applied_lsn: int
    wal_segments: int
    wal_bytes: int
    database_bytes: int


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
    _check_destination(dest)
    fs = OsFileSystem()
    make_dirs(fs, dest)
    recorder_id = _recorder_id(config)
    for _ in range(_ATTEMPTS):
        db_bytes = _copy_database(config.sqlite_path, os.path.join(dest, DB_FILE))
        applied = _applied_lsn(os.path.join(dest, DB_FILE), recorder_id)
        wal_dest = os.path.join(dest, WAL_DIR)
        shutil.rmtree(wal_dest, ignore_errors=True)
        make_dirs(fs, wal_dest)
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
    """Copy a backup into `data_dir` (new or empty), fsynced; the first open recovers it.

    Every file of the backup is checked first (regular, and one `backup` writes); then each is
    copied from the descriptor that was checked, fsynced; then `wal/` is fsynced, the data
    directory once `wal/` is in it, and last the data directory's parent."""
    files = _check_backup(backup_dir)
    if _inside(data_dir, backup_dir):
        raise BackupDestinationError(
            f"{data_dir} is inside the backup {backup_dir}",
            hint="restore into a directory outside the backup: the backup must stay as it was made",
        )
    _check_destination(data_dir)
    fs = OsFileSystem()
    made = make_dirs(fs, data_dir)
    try:
        _copy_backup(backup_dir, data_dir, files, fs)
    except BaseException:
        # Half a restore must not look like a data directory: what this call wrote goes.
        if made:
            shutil.rmtree(made[0], ignore_errors=True)
        else:
            for name in os.listdir(data_dir):
                path = os.path.join(data_dir, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
        raise
    return data_dir


def _is_broken_copy(name: str) -> bool:
    """`<segment>.wal.broken` or `<segment>.wal.broken.N`: a copy of a damaged segment."""
    base, mark, rest = name.partition(_BROKEN_MARK)
    return (
        bool(mark) and fmt.parse_segment_name(base + ".wal") is not None
        and (not rest or (rest[0] == "." and rest[1:].isdigit()))
    )


def _in_backup_wal(name: str) -> bool:
    """A name `backup` writes into a backup's `wal/`."""
    return fmt.parse_segment_name(name) is not None or name == APPLIED_FILE or _kept_by_the_log(name)


def _check_backup(backup_dir: str) -> dict[str, list[tuple[str, os.stat_result]]]:
    """What a restore copies: {"" (the backup's top), "wal": [(name, lstat)]}, every entry a
    regular file that `backup` writes. Anything else is refused, every one of them named, with
    nothing written (IntegrityError, exit 4). Symbolic links are never followed: a link in a
    backup could make the restore copy any file this user may read into the data directory."""
    if not os.path.isdir(backup_dir):
        raise StoreNotFoundError(backup_dir)
    found: dict[str, list] = {"": [], WAL_DIR: []}
    refused: list[str] = []
    for name in sorted(os.listdir(backup_dir)):
        st = os.lstat(os.path.join(backup_dir, name))
        if name == WAL_DIR and stat.S_ISDIR(st.st_mode):
            continue
        if name in (DB_FILE, RECORDER_ID_FILE) and stat.S_ISREG(st.st_mode):
            found[""].append((name, st))
        else:
            refused.append(_what(os.path.join(backup_dir, name), st))
    wal_dir = os.path.join(backup_dir, WAL_DIR)
    if os.path.isdir(wal_dir) and not os.path.islink(wal_dir):
        for name in sorted(os.listdir(wal_dir)):
            st = os.lstat(os.path.join(wal_dir, name))
            if stat.S_ISREG(st.st_mode) and _in_backup_wal(name):
                found[WAL_DIR].append((name, st))
            else:
                refused.append(_what(os.path.join(wal_dir, name), st))
    if refused:
        raise IntegrityError(
            f"the backup {backup_dir} holds what `tracedb backup` never writes, so nothing was restored: "
            + "; ".join(refused),
            hint="a backup is traces.db, RECORDER_ID and wal/ (segments, APPLIED, LSN_GAPS, kept tails "
            "and .broken copies), all regular files: restore from a backup made by `tracedb backup`, or "
            "move the other entries out of it if you know where they came from",
        )
    if not any(name == DB_FILE for name, _st in found[""]) or not os.path.isdir(wal_dir):
        raise StoreNotFoundError(backup_dir)
    return found


def _what(path: str, st: os.stat_result) -> str:
    """An entry a restore refuses, named with its kind."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return f"{path} is a symbolic link (to {os.readlink(path)})"
    kinds = (
        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
    )
    for test, kind in kinds:
        if test(mode):
            return f"{path} is {kind}"
    return f"{path} is a file a backup does not hold"


def _copy_backup(backup_dir: str, data_dir: str, files: dict, fs: OsFileSystem) -> None:
    """Copy the checked entries, each from a descriptor opened without following links and
    checked again (the same inode the check saw, still a regular file), then fsync in order."""
    top = os.open(backup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _copy_entries(top, files[""], data_dir, fs)
        wal_dest = os.path.join(data_dir, WAL_DIR)
        make_dirs(fs, wal_dest)
        src_wal = os.open(WAL_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
        try:
            _copy_entries(src_wal, files[WAL_DIR], wal_dest, fs)
        finally:
            os.close(src_wal)
    finally:
        os.close(top)
    fs.fsync_dir(wal_dest)
    fs.fsync_dir(data_dir)
    fs.fsync_dir(os.path.dirname(os.path.abspath(data_dir)))


def _copy_entries(src_dir_fd: int, entries, dst_dir: str, fs: OsFileSystem) -> None:
    for name, checked in entries:
        # O_NONBLOCK: should a FIFO have taken the file's place since the check, opening it
        # must not wait for a writer.
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src_dir_fd)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENXIO):  # a link, a socket now
                raise
            raise _changed(name) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (checked.st_dev, checked.st_ino):
                raise _changed(name)
            copy_to_new_file(fs, fd, os.path.join(dst_dir, name))
        finally:
            os.close(fd)


def _changed(name: str) -> IntegrityError:
    return IntegrityError(
        f"{name} in the backup was replaced while it was being restored, so nothing was restored",
        hint="make sure nothing writes into the backup, and restore again",
    )


def _inside(path: str, directory: str) -> bool:
    """`path` is `directory` or below it (links resolved)."""
    directory = os.path.realpath(directory)
    return os.path.commonpath([directory, os.path.realpath(path)]) == directory


def _check_destination(dest: str) -> None:
    if not dest.strip():
        raise BackupDestinationError("the destination is empty", hint="give a new directory")
    if os.path.lexists(dest) and (not os.path.isdir(dest) or os.listdir(dest)):
        raise BackupDestinationError(f"{dest} exists and is not an empty directory", hint="give a new directory")


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
    # Made private before SQLite opens it: SQLite would make it 0644 (less the umask), and its
    # -wal file with the same mode.
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        make_private(fd)
    finally:
        os.close(fd)
    source = sqlite_reads.open_read(src, timeout_s=30)
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
    con = None
    try:
        con = sqlite_reads.open_read(db_path, timeout_s=5.0, make_files=True)
        applied = sqlite_reads.applied_lsn(con, recorder_id)
    except sqlite3.Error as e:
        raise IntegrityError(f"the database copy cannot be read: {e}", hint="run `tracedb verify`") from None
    finally:
        if con is not None:
            con.close()
    return int(applied or 0)


def _kept_by_the_log(name: str) -> bool:
    """Files of the WAL directory a backup keeps besides segments: the LSN gaps a repair made
    legal (the log does not read without them), and the evidence of damage (kept torn tails,
    `.broken` copies), which salvage reads."""
    return name == GAPS_FILE or wal.tail_of(name) is not None or _is_broken_copy(name)


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
    fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return copy_to_new_file(fs, fd, dst)
    finally:
        os.close(fd)
