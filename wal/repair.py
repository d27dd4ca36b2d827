"""Repair a damaged log: keep a `.broken` copy, truncate at the last good record.

Never run on a log that a writer holds open: it takes the directory's lock first. Also the
two steps of a cut that the writer shares when it cuts a torn tail: keeping the cut bytes
(`keep_torn_tail`), and continuing the log above the LSNs they held (`continue_at`).
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from typing import Optional

from . import format as fmt
from .dir_lock import acquire_dir_lock
from .errors import WalCorruptionError
from .fs import OsFileSystem, copy_to_new_file, write_all, write_file_atomic
from .reader import (
    APPLIED_FILE,
    GAPS_FILE,
    TAIL_MARK,
    Damage,
    RecoveryMode,
    WalReader,
    list_segments,
    read_applied_lsn,
    read_gaps,
    salvage_file,
    salvage_tail,
    scan_last_segment,
)

log = logging.getLogger(__name__)
_READ_BYTES = 1 << 20


@dataclass(frozen=True)
class RepairResult:
    """What repair did: where the log now ends, what was cut, where the copies are."""

    damage: Optional[Damage]
    last_lsn: int
    truncated_segment: Optional[str]
    truncated_at: Optional[int]
    removed_segments: tuple[str, ...]
    broken_copies: tuple[str, ...]
    # The LSN the log continues at when the records cut held LSNs above `last_lsn` (never
    # reused: salvage reads them back from the copies); None when it continues at last_lsn + 1.
    continues_at: Optional[int] = None


@dataclass(frozen=True)
class KeptTail:
    """The non-zero bytes of a torn tail, copied before the writer cut them."""

    path: str
    offset: int  # where they were in the segment
    length: int
    records: int  # records with a valid CRC in them (a torn group's pages land in any order)


def _nonzero_end(path: str, start: int) -> int:
    """The offset just past the last non-zero byte of the file at or after `start` (or `start`)."""
    end = start
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        pos = start
        while True:
            block = f.read(_READ_BYTES)
            if not block:
                return end
            stripped = len(block.rstrip(b"\x00"))
            if stripped:
                end = pos + stripped
            pos += len(block)


def _kept_name(path: str, data: bytes) -> tuple[str, bool]:
    """Where to keep `data`: `path`, or `path.N` for the first N not taken (a kept file is never
    overwritten); True when one of them holds these bytes already (kept by an earlier open that
    stopped before its cut)."""
    dst, n = path, 0
    while os.path.exists(dst):
        with open(dst, "rb") as f:
            if f.read() == data:
                return dst, True
        n += 1
        dst = f"{path}.{n}"
    return dst, False


def keep_torn_tail(fs, segment_path: str, offset: int, next_lsn: int) -> Optional[KeptTail]:
    """Copy the bytes of a torn tail at `offset` (up to its last non-zero byte) to
    `<segment>.tail-<offset>` next to the segment, after a segment header naming `next_lsn` (the
    LSN the tail began at), written and fsynced, the directory fsynced: the cut may remove
    bytes of an acknowledged record a flipped bit made unreadable, and those must not vanish.
    None when the tail is only zeros (nothing to keep)."""
    stop = _nonzero_end(segment_path, offset)
    if stop <= offset:
        return None
    with open(segment_path, "rb") as f:
        head = fmt.decode_segment_header(f.read(fmt.SEGMENT_HEADER_SIZE))
        f.seek(offset)
        data = f.read(stop - offset)
    stop = offset + len(data)
    data += bytes(-len(data) % fmt.ALIGN)  # whole 8-byte words, as records are laid out
    header = fmt.encode_segment_header(head.salt, head.segment_number, next_lsn)
    dst, done = _kept_name(f"{segment_path}{TAIL_MARK}{offset}", header + data)
    if not done:
        write_file_atomic(fs, os.path.dirname(segment_path), os.path.basename(dst), header + data)
    valid = len(salvage_tail(dst).records)
    log.warning(
        "WAL %s: the torn tail at offset %d (%d bytes, never acknowledged unless a flipped bit "
        "damaged its record) is cut; its bytes are kept in %s (`tracedb wal repair --salvage` reads them)",
        os.path.basename(segment_path), offset, stop - offset, os.path.basename(dst),
    )
    return KeptTail(dst, offset, stop - offset, valid)


def _record_gap(fs, directory: str, before: int, after: int) -> None:
    gaps = read_gaps(directory)
    if gaps.get(before) == after:
        return
    gaps[before] = after
    text = "".join(f"{b} {a}\n" for b, a in sorted(gaps.items()))
    write_file_atomic(fs, directory, GAPS_FILE, text.encode())


def continue_at(fs, directory: str, next_lsn: int) -> bool:
    """Make the next record appended to the log carry `next_lsn`, above the LSNs of records a
    cut removed (kept in copies), so that no LSN is ever given to two records. Needs the
    directory's lock, and a log whose last segment ends cleanly (after the cut).

    The gap is recorded in LSN_GAPS first (so a crash part way is finished by the next open);
    then the last segment is sealed and a new one starts at `next_lsn`. False when the log
    continues at or above `next_lsn` already."""
    segs = list_segments(directory)
    tail = scan_last_segment(directory, segs) if segs else None
    at = tail.next_lsn if tail is not None else read_applied_lsn(directory)
    if next_lsn <= at:
        return False
    _record_gap(fs, directory, at - 1, next_lsn)
    number = 1
    if tail is not None:
        number = tail.segment.number + 1
        fd = fs.open(tail.segment.path, os.O_WRONLY)
        try:
            fs.ftruncate(fd, tail.end_offset)  # zeros after the end: only the last segment has them
            if not tail.sealed:
                os.lseek(fd, tail.end_offset, os.SEEK_SET)
                write_all(fs, fd, fmt.encode_seal(tail.seed, at - 1, at - tail.segment.first_lsn))
            fs.fdatasync(fd)
        finally:
            fs.close(fd)
    header = fmt.encode_segment_header(secrets.randbits(32), number, next_lsn)
    write_file_atomic(fs, directory, fmt.segment_name(number, next_lsn), header)
    return True


def _top_lsn_cut(copies: list[str], cut_at: Optional[int]) -> Optional[int]:
    """The highest LSN of a record with a valid CRC in the bytes a cut removes: in the first
    copy from `cut_at` on (all of it when None), in the others all of them."""
    top = None
    for i, path in enumerate(copies):
        for r in salvage_file(path).records:
            if (i > 0 or cut_at is None or r.offset >= cut_at) and (top is None or r.lsn > top):
                top = r.lsn
    return top


def _keep_copy(fs, path: str) -> str:
    # Never overwrite the copy an earlier (maybe interrupted) repair kept.
    dst = path + ".broken"
    n = 0
    while os.path.exists(dst):
        n += 1
        dst = f"{path}.broken.{n}"
    src = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        copy_to_new_file(fs, src, dst)
    finally:
        os.close(src)
    return dst


_SEAL_SIZE = len(fmt.encode_seal(0, 0, 0))


def seal_intact(path: str, first_lsn: int, next_first_lsn: int, gaps: dict) -> bool:
    """Whether the sealed segment `path` (its name says it starts at `first_lsn`) ends with the
    SEAL the writer wrote: a valid CRC, the segment's last LSN, its count of records, and the
    next segment starting right after (or where a gap the log recorded ends). Two short reads:
    the check made before a segment is deleted as applied. A reader that applied every record
    of a segment reports damage in its SEAL only after that, when the segment may be gone."""
    try:
        with open(path, "rb") as f:
            head = fmt.decode_segment_header(f.read(fmt.SEGMENT_HEADER_SIZE))
            size = os.fstat(f.fileno()).st_size
            if isinstance(head, str) or head.first_lsn != first_lsn or size < fmt.SEGMENT_HEADER_SIZE + _SEAL_SIZE:
                return False
            f.seek(size - _SEAL_SIZE)
            tail = f.read(_SEAL_SIZE)
    except FileNotFoundError:
        return True  # nothing left to keep
    last = fmt.REC_HEAD.unpack_from(tail)[2]
    if next_first_lsn not in (last + 1, gaps.get(last)):
        return False
    return tail == fmt.encode_seal(fmt.salt_seed(head.salt), last, last - first_lsn + 1)


def move_aside(fs, path: str) -> str:
    """Keep the damaged segment `path`, which the log is about to delete as applied, as
    `<path>.broken` (`.broken.N` when that name is taken): renamed, not deleted, so that the
    evidence of damage stays. When a copy holding these very bytes exists (recovery copied it),
    `path` is deleted. Returns the copy; the directory is the caller's to fsync."""
    with open(path, "rb") as f:
        data = f.read()
    dst, done = _kept_name(path + ".broken", data)
    if done:
        fs.unlink(path)
    else:
        fs.rename(path, dst)
    log.error(
        "WAL segment %s is damaged (its SEAL record does not check); its records were applied "
        "already, and it is moved aside as %s instead of deleted",
        os.path.basename(path), os.path.basename(dst),
    )
    return dst


def repair(directory: str, *, fs=None, applied_lsn: Optional[int] = None) -> RepairResult:
    """Cut the log at its first damage (torn tail or corruption). A clean log is left alone.

    `applied_lsn`: every record below it is applied elsewhere (the consumer's checkpoint + 1).
    A cut below it would leave a log that ends before what the consumer holds, and that no
    writer can continue: then the segments left (every record in them applied, their damaged
    one copied) are removed and `APPLIED` is set to `applied_lsn`, so the log continues there."""
    fs = fs or OsFileSystem()
    lock_fd = acquire_dir_lock(os.path.abspath(directory), fs)
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
        top = _top_lsn_cut(copies, cut_at)
        skip = top + 1 if top is not None and continue_at(fs, directory, top + 1) else None
        return RepairResult(
            damage,
            last_lsn,
            None if cut_at is None else cut_path,
            cut_at,
            tuple(removed),
            tuple(copies),
            skip,
        )
    finally:
        os.close(lock_fd)
