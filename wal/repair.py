"""Repair a damaged log: keep a `.broken` copy, truncate at the last good record.

Never run on a log that a writer holds open: it takes the directory's lock first.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Optional

from .dir_lock import acquire_dir_lock
from .errors import WalCorruptionError
from .fs import OsFileSystem, write_file_atomic
from .reader import APPLIED_FILE, Damage, RecoveryMode, WalReader, list_segments, read_applied_lsn


@dataclass(frozen=True)
class RepairResult:
    """What repair did: where the log now ends, what was cut, where the copies are."""

    damage: Optional[Damage]
    last_lsn: int
    truncated_segment: Optional[str]
    truncated_at: Optional[int]
    removed_segments: tuple[str, ...]
    broken_copies: tuple[str, ...]


def _keep_copy(fs, path: str) -> str:
    # Never overwrite the copy an earlier (maybe interrupted) repair kept.
    dst = path + ".broken"
    n = 0
    while os.path.exists(dst):
        n += 1
        dst = f"{path}.broken.{n}"
    shutil.copyfile(path, dst)
    fd = fs.open(dst, os.O_RDONLY)
    try:
        fs.fsync(fd)
    finally:
        fs.close(fd)
    return dst


def repair(directory: str, *, fs=None, applied_lsn: Optional[int] = None) -> RepairResult:
    """Cut the log at its first damage (torn tail or corruption). A clean log is left alone.

    `applied_lsn`: every record below it is applied elsewhere (the consumer's checkpoint + 1).
    A cut below it would leave a log that ends before what the consumer holds, and that no
    writer can continue: then the segments left (every record in them applied, their damaged
    one copied) are removed and `APPLIED` is set to `applied_lsn`, so the log continues there."""
    fs = fs or OsFileSystem()
    lock_fd = acquire_dir_lock(os.path.abspath(directory))
    try:
        reader = WalReader(directory, mode=RecoveryMode.POINT_IN_TIME)
        reader.skip_to_end()
        if not reader.damages:
            return RepairResult(None, reader.last_lsn, None, None, (), ())
        damage = reader.damages[0]
        if damage.missing_segments and reader.records_read == 0:
            # The log's first segments are gone: cutting at the gap would keep nothing and throw
            # away every segment after it. (A gap further on is cut: the prefix before it stays.)
            raise WalCorruptionError(
                damage.path, damage.offset, damage.expected, damage.found
            ).with_hint(
                "segments are missing, not damaged: restore them from a backup; repair refuses "
                "to delete the segments after the gap"
            )
        copies = []
        removed = []
        cut_path = damage.path
        cut_at = damage.offset
        if cut_at == 0:
            # A damaged segment header: the whole segment goes (after its copy).
            cut_at = None
        later = [s for s in list_segments(directory) if s.path > cut_path]
        copies.append(_keep_copy(fs, cut_path))
        for s in later:
            copies.append(_keep_copy(fs, s.path))
        # The copies' directory entries must be durable before the originals are cut.
        fs.fsync_dir(directory)
        if cut_at is None:
            fs.unlink(cut_path)
            removed.append(cut_path)
        else:
            fd = fs.open(cut_path, os.O_WRONLY)
            try:
                fs.ftruncate(fd, cut_at)
                fs.fdatasync(fd)
            finally:
                fs.close(fd)
        for s in later:
            fs.unlink(s.path)
            removed.append(s.path)
        fs.fsync_dir(directory)
        last_lsn = reader.last_lsn
        if applied_lsn is not None and last_lsn < applied_lsn - 1:
            for s in list_segments(directory):
                fs.unlink(s.path)
                removed.append(s.path)
            write_file_atomic(fs, directory, APPLIED_FILE, f"{max(applied_lsn, read_applied_lsn(directory))}\n".encode())
            last_lsn = applied_lsn - 1
        return RepairResult(
            damage,
            last_lsn,
            None if cut_at is None else cut_path,
            cut_at,
            tuple(removed),
            tuple(copies),
        )
    finally:
        os.close(lock_fd)
