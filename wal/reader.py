"""Reading the log: iterate records from an LSN, tell a torn tail from corruption.

See wal/FORMAT.md, "Reading and recovery", for the rules this module implements.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import os
import re
import struct
import weakref
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, Optional

from . import format as fmt
from .errors import WalCorruptionError, WalUsageError

APPLIED_FILE = "APPLIED"
GAPS_FILE = "LSN_GAPS"  # gaps in the LSN sequence a cut left legal (see FORMAT.md)
TAIL_MARK = ".tail-"  # `<segment>.tail-<offset>`: the bytes of a torn tail the writer cut

_U64 = struct.Struct("<Q")
_MAX = fmt.MAX_PAYLOAD_BYTES
_NO_LIMIT = 1 << 64
_CHUNK_BYTES = 8 << 20  # a segment is read in pieces: a preallocated one is mostly zeros
_ZERO_HEAD = bytes(fmt.RECORD_HEADER_SIZE)
_NONZERO = re.compile(rb"[^\x00]")
_ZERO_BLOCK = bytes(1 << 20)
# records() checks at most this many records ahead of its consumer, a record costing one more
# for each 4 KiB of payload (so about 2 MiB of payloads at most, or one larger record).
_RECORDS_AHEAD = 512
_RECORDS_AHEAD_SHIFT = 12
_COUNT_ONLY = 64  # a shift that leaves one per record whatever its size
_SCAN_BATCH = 65536


def _zeros_from(path: str, offset: int) -> bool:
    """True if every byte of the file from `offset` on is zero (preallocated, never written)."""
    # Comparing with a block of zeros is a memcmp: a 64 MiB preallocated tail takes a few ms,
    # where a regular expression hunting for a non-zero byte took about 200 ms.
    buf = bytearray(len(_ZERO_BLOCK))
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        while True:
            n = f.readinto(buf)
            if not n:
                return True
            if (buf != _ZERO_BLOCK) if n == len(buf) else (buf[:n] != _ZERO_BLOCK[:n]):
                return False


class RecoveryMode(str, enum.Enum):
    """What a reader does with damage; after RocksDB's WAL recovery modes."""

    TOLERATE_TAIL = "tolerate_tail"
    ABSOLUTE = "absolute"
    POINT_IN_TIME = "point_in_time"
    SALVAGE = "salvage"


class Record(NamedTuple):
    lsn: int
    payload: bytes
    segment: str
    offset: int


_new_record = tuple.__new__  # Record(...) without NamedTuple's Python-level __new__: hot path


class SegmentInfo(NamedTuple):
    path: str
    name: str
    number: int
    first_lsn: int


@dataclass(frozen=True)
class Damage:
    """One damaged place: `torn_tail` is the benign end of an unacknowledged group."""

    path: str
    offset: int
    expected: str
    found: str
    torn_tail: bool
    skipped_bytes: int = 0
    # Whole segments are missing (not damaged bytes): repair has nothing to cut.
    missing_segments: bool = False

    def error(self) -> WalCorruptionError:
        return WalCorruptionError(self.path, self.offset, self.expected, self.found)


def list_segments(directory: str) -> list[SegmentInfo]:
    """Segment files of `directory`, sorted by number."""
    out = []
    for name in os.listdir(directory):
        parsed = fmt.parse_segment_name(name)
        if parsed is not None:
            out.append(SegmentInfo(os.path.join(directory, name), name, parsed[0], parsed[1]))
    out.sort(key=lambda s: s.number)
    return out


def read_applied_lsn(directory: str) -> int:
    """The LSN below which every record was applied elsewhere (1 if none was declared)."""
    try:
        with open(os.path.join(directory, APPLIED_FILE), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return 1
    text = raw.decode("ascii", errors="replace").strip()
    try:
        return max(1, int(text))
    except ValueError:
        raise WalCorruptionError(
            os.path.join(directory, APPLIED_FILE), 0, "a decimal LSN", repr(text[:40])
        ) from None


def read_gaps(directory: str) -> dict[int, int]:
    """{last LSN before a gap: the LSN the log continues at} for every gap a cut left (the
    records a cut removed, kept in copies, had the LSNs in between: they are never reused)."""
    path = os.path.join(directory, GAPS_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return {}
    gaps = {}
    for line in raw.decode("ascii", errors="replace").splitlines():
        parts = line.split()
        if not parts:
            continue
        try:
            before, after = int(parts[0]), int(parts[1])
        except (ValueError, IndexError):
            raise WalCorruptionError(path, 0, "lines of two decimal LSNs", repr(line[:40])) from None
        gaps[before] = after
    return gaps


def _gap_allows(directory: str, expected: int, found: int) -> bool:
    """True if a recorded gap lets the log continue at `found` where `expected` was due."""
    return found > expected and read_gaps(directory).get(expected - 1) == found


def _flags_fit(reserved: int, rtype: int) -> bool:
    """True for the reserved field a record of type `rtype` may carry: zero, or on a DATA record
    the group-start flag (see FORMAT.md)."""
    return not reserved or (reserved == fmt.FLAG_GROUP_START and rtype == fmt.TYPE_DATA)


def _written_data_ends(data: bytes, off: int, end: int, at_eof: bool, path: str, base: int) -> bool:
    """Whether the written data of the segment at `path` ends at `off` of `data` (its bytes
    from file offset `base`, up to `end`): zeros from there to the end of the file, which is
    preallocated space. Fewer zero bytes than a record header at the end of the file are too (a
    segment sealed short of its SEAL when the writer stopped): no record fits there."""
    if data.count(0, off, end) != end - off:
        return False
    if at_eof and end - off < fmt.RECORD_HEADER_SIZE:
        return True
    return data[off : off + fmt.RECORD_HEADER_SIZE] == _ZERO_HEAD and (at_eof or _zeros_from(path, base + end))


def _check_record(buf, off: int, end: int, seed: int, expected_lsn: int):
    """Validate the record at `off`. Returns (lsn, type, n, record_end) or a string of what's wrong.

    `expected_lsn` None accepts any LSN (used when hunting for a valid record after damage).
    """
    if end - off < fmt.RECORD_HEADER_SIZE:
        return f"a {fmt.RECORD_HEADER_SIZE}-byte record header, found {end - off} bytes"
    crc, n, lsn, rtype, pad, reserved = fmt.REC_HEAD.unpack_from(buf, off)
    if n > fmt.MAX_PAYLOAD_BYTES:
        return f"a payload length at most {fmt.MAX_PAYLOAD_BYTES}, found {n}"
    rec_end = off + fmt.RECORD_HEADER_SIZE + n + pad
    if rec_end > end:
        return f"a record of {rec_end - off} bytes, found {end - off} bytes to end of file"
    if rtype not in fmt.RECORD_TYPES:
        return f"record type 1 or 2, found {rtype}"
    if pad != (-(fmt.RECORD_HEADER_SIZE + n) % fmt.ALIGN) or not _flags_fit(reserved, rtype):
        return (
            f"padding {(-(fmt.RECORD_HEADER_SIZE + n) % fmt.ALIGN)} and zero reserved bytes (or, on a "
            "DATA record, the group-start flag)"
        )
    if fmt.mask(fmt.crc32c(buf[off + 4 : off + fmt.RECORD_HEADER_SIZE + n], seed)) != crc:
        return "a record with a valid CRC"
    if pad and any(buf[rec_end - pad : rec_end]):
        return "zero padding"
    if expected_lsn is not None:
        want = expected_lsn if rtype == fmt.TYPE_DATA else expected_lsn - 1
        if lsn != want:
            return f"LSN {want} (the record carries LSN {lsn})"
    return lsn, rtype, n, rec_end


_SECTOR = 512
_ZERO_SECTOR = bytes(_SECTOR)


def _looks_lost(buf, off: int, end: int, base: int) -> bool:
    """True if the damaged record at `off` reads like a write that never reached the disk: an
    all-zero record header, or a whole 512-byte sector of zeros inside the record. Over
    preallocated (or newly allocated) blocks a lost write reads back as zeros; a bit flip or
    other damage to bytes that were once durable does not."""
    if buf[off : off + fmt.RECORD_HEADER_SIZE] == _ZERO_HEAD:
        return True
    if end - off < fmt.RECORD_HEADER_SIZE:
        return False
    n = fmt.REC_HEAD.unpack_from(buf, off)[1]
    stop = min(end, off + fmt.RECORD_HEADER_SIZE + min(n, fmt.MAX_PAYLOAD_BYTES) + fmt.ALIGN)
    pos = off + (-(base + off) % _SECTOR)
    while pos + _SECTOR <= stop:
        if buf[pos : pos + _SECTOR] == _ZERO_SECTOR:
            return True
        pos += _SECTOR
    return False


def _zeros_in(buf, start: int, end: int) -> bool:
    """True if buf[start:end] holds only zeros (compared a block at a time: a memcmp)."""
    step = len(_ZERO_BLOCK)
    for pos in range(start, end, step):
        stop = min(end, pos + step)
        if buf[pos:stop] != _ZERO_BLOCK[: stop - pos]:
            return False
    return True


def _looks_flipped(buf, off: int, end: int, base: int) -> bool:
    """True if the damaged record at `off`, the last thing in its file, reads like durable bytes
    that changed (a flipped bit) rather than a write that never landed: it is whole (a header
    of its shape, its full length present), its payload's last byte is not zero, only zeros
    follow it, and each 512-byte sector it overlaps holds a non-zero byte of it. A write that
    never landed leaves a shorter file, or zeros where its sectors (or, torn within a sector,
    its last bytes) should be; a torn write never leaves a whole record of other bytes."""
    if end - off < fmt.RECORD_HEADER_SIZE:
        return False
    _crc, n, _lsn, rtype, pad, reserved = fmt.REC_HEAD.unpack_from(buf, off)
    rec_end = off + fmt.RECORD_HEADER_SIZE + n + pad
    if rtype not in fmt.RECORD_TYPES or not _flags_fit(reserved, rtype) or n > _MAX or pad != fmt.padding_for(n) or rec_end > end:
        return False
    if n == 0 or buf[rec_end - pad - 1] == 0:
        return False
    if not _zeros_in(buf, rec_end, end):
        return False
    pos = off
    while pos < rec_end:
        stop = min(rec_end, pos + _SECTOR - (base + pos) % _SECTOR)
        if _zeros_in(buf, pos, stop):
            return False
        pos = stop
    return True


def _synced_before(buf, pos: Optional[int], end: int, seed: int, lsn: int) -> Optional[int]:
    """The offset of the first valid record, from the valid record at `pos` on, that was written
    only after the record of LSN `lsn` was synced: a SEAL (a segment is sealed after an
    fdatasync), or the first record of a later group (flagged; one group is written and synced
    at a time). None if there is none: the damage may lie in the last group."""
    while pos is not None:
        _crc, n, rec_lsn, rtype, pad, flags = fmt.REC_HEAD.unpack_from(buf, pos)
        if rtype == fmt.TYPE_SEAL or (flags == fmt.FLAG_GROUP_START and rec_lsn > lsn):
            return pos
        # The next record starts where this one ends, unless damage follows it too.
        pos = _find_valid_after(buf, pos + fmt.RECORD_HEADER_SIZE + n + pad - 1, end, seed, 1)
    return None


def _find_valid_after(buf, off: int, end: int, seed: int, min_lsn: int) -> Optional[int]:
    """The first 8-byte-aligned offset after `off` holding a valid record with LSN >= min_lsn."""
    pos = off + fmt.ALIGN - (off % fmt.ALIGN)
    while pos + fmt.RECORD_HEADER_SIZE <= end:
        m = _NONZERO.search(buf, pos)
        if m is None:
            return None
        # A record header is never all zeros (type 0 is invalid): jump over zero runs, to the
        # first aligned offset whose header reaches the next non-zero byte.
        first = m.start() - fmt.RECORD_HEADER_SIZE + 1
        if first > pos:
            pos = first + (-first % fmt.ALIGN)
            if pos + fmt.RECORD_HEADER_SIZE > end:
                return None
        got = _check_record(buf, pos, end, seed, None)
        if not isinstance(got, str) and got[0] >= min_lsn:
            return pos
        pos += fmt.ALIGN
    return None


@dataclass
class ScanResult:
    """What a full scan found: counts, the LSN range, the end of valid data, every damage."""

    records: int = 0
    first_lsn: Optional[int] = None
    last_lsn: int = 0
    segments: int = 0
    sealed_last: bool = False
    end_segment: Optional[str] = None
    end_offset: int = 0
    damages: list[Damage] = field(default_factory=list)

    @property
    def torn_tail(self) -> Optional[Damage]:
        for d in self.damages:
            if d.torn_tail:
                return d
        return None


class WalReader:
    """Iterates DATA records in LSN order, from `from_lsn`, under a recovery mode.

    The reader can be called again after the log has grown: `records(to_lsn)` continues where the
    previous call stopped. `to_lsn` bounds what is read to what the writer has acknowledged, so a
    group still being written is never looked at.
    """

    def __init__(
        self,
        directory: str,
        *,
        from_lsn: int = 1,
        mode: RecoveryMode | str = RecoveryMode.TOLERATE_TAIL,
    ):
        self.directory = directory
        self.mode = RecoveryMode(mode)
        self.from_lsn = max(1, from_lsn)
        self.damages: list[Damage] = []
        self.records_read = 0
        self.last_lsn = 0
        self.sealed_last = False
        self._seg: Optional[SegmentInfo] = None
        self._seed = 0
        self._offset = 0
        self._expected = 0
        self._need = 0
        self._stopped = False
        self._iteration: Optional[weakref.ref] = None  # the last iteration begun (_begin)

    # -- segment bookkeeping -------------------------------------------------------------
    def _segments(self) -> list[SegmentInfo]:
        segs = list_segments(self.directory)
        if not segs:
            return segs
        applied = read_applied_lsn(self.directory)
        # mark_applied deletes segments below the applied LSN; a crash before its directory fsync
        # may bring back any subset of them. Segments before a gap whose next segment starts at
        # or below the applied LSN hold only applied records: the sequence starts after the gap.
        for i in range(len(segs) - 1, 0, -1):
            if segs[i].number != segs[i - 1].number + 1 and segs[i].first_lsn <= applied:
                segs = segs[i:]
                break
        first = segs[0]
        if first.first_lsn > 1 and first.first_lsn > applied and not any(
            before < applied and after == first.first_lsn for before, after in read_gaps(self.directory).items()
        ):
            self._missing(
                first.path,
                f"segments covering LSN {applied}..{first.first_lsn - 1} (not declared applied)",
                "them missing",
            )
            return []
        for i in range(1, len(segs)):
            if segs[i].number != segs[i - 1].number + 1:
                self._missing(segs[i].path, f"segment number {segs[i - 1].number + 1}", f"{segs[i].number}")
                return segs[:i]
        return segs

    def _missing(self, path: str, expected: str, found: str) -> None:
        """Missing segments are corruption: raised, or the end of the log (point_in_time, salvage)."""
        if Damage(path, 0, expected, found, False, 0, True) not in self.damages:
            self._damage(path, 0, expected, found, False, missing=True)

    def _open_segment(self, seg: SegmentInfo, expected_first: Optional[int]) -> bool:
        with open(seg.path, "rb") as f:
            head = f.read(fmt.SEGMENT_HEADER_SIZE)
        got = fmt.decode_segment_header(head)
        if isinstance(got, str):
            return self._damage(seg.path, 0, got, "a damaged segment header", False)
        if got.segment_number != seg.number or got.first_lsn != seg.first_lsn:
            return self._damage(
                seg.path,
                0,
                f"header for segment {seg.number} first LSN {seg.first_lsn}",
                f"segment {got.segment_number} first LSN {got.first_lsn}",
                False,
            )
        if (
            expected_first is not None and got.first_lsn != expected_first
            and not _gap_allows(self.directory, expected_first, got.first_lsn)
        ):
            return self._damage(
                seg.path, 0, f"first LSN {expected_first}", f"{got.first_lsn}", False
            )
        self._seg = seg
        self._seed = fmt.salt_seed(got.salt)
        self._offset = fmt.SEGMENT_HEADER_SIZE
        self._expected = got.first_lsn
        return True

    def _damage(self, path, offset, expected, found, torn, skipped=0, missing=False) -> bool:
        d = Damage(path, offset, expected, found, torn, skipped, missing)
        self.damages.append(d)
        if self.mode is RecoveryMode.ABSOLUTE or (
            self.mode is RecoveryMode.TOLERATE_TAIL and not torn
        ):
            raise d.error()
        return False

    def _start(self) -> bool:
        segs = self._segments()
        if not segs:
            return False
        start = segs[0]
        for s in segs:
            if s.first_lsn <= self.from_lsn:
                start = s
        return self._open_segment(start, None)

    # -- iteration -----------------------------------------------------------------------
    def records(self, to_lsn: Optional[int] = None) -> Iterator[Record]:
        """Yield DATA records with from_lsn <= lsn <= to_lsn, continuing from the last call.

        The reader checks records a stretch ahead of its consumer (at most 512 records, or
        about 2 MiB of payloads). A consumer that stops early (closing the generator, or
        dropping it) leaves the reader just after the last record it was given: the next call
        starts there, and so does a new call (of this or `batches`, `skip_to_end`) while an
        earlier iteration is left suspended: that one is closed. `last_lsn` and `records_read`
        count the stretch already checked while an iteration runs; once it is done or closed
        they count what was given.
        """
        return self._begin(self._records(to_lsn))

    def _begin(self, gen: Iterator) -> Iterator:
        """Make `gen` the reader's one iteration: an earlier one left suspended is closed
        (a records() generator steps the reader back to what its consumer took)."""
        earlier = self._iteration() if self._iteration is not None else None
        if earlier is not None:
            earlier.close()
        self._iteration = weakref.ref(gen)
        return gen

    def _records(self, to_lsn: Optional[int]) -> Iterator[Record]:
        for batch in self._batches(to_lsn, _RECORDS_AHEAD, _RECORDS_AHEAD_SHIFT, True):
            given = 0
            try:
                for rec in batch:
                    given += 1
                    yield rec
            finally:
                if given < len(batch):
                    self._rewind(batch[given], len(batch) - given)

    def batches(self, max_records: int, to_lsn: Optional[int] = None) -> Iterator[list[Record]]:
        """Yield the same records as `records`, in lists of at most `max_records` (shorter at
        the end of a segment); the reader's progress is saved at the end of each list."""
        if max_records < 1:
            raise WalUsageError(f"max_records must be at least 1, not {max_records}")
        return self._begin(self._batches(to_lsn, max_records, _COUNT_ONLY, True))

    def skip_to_end(self) -> int:
        """Read (and check) every record to the end of the log, keeping none; how many DATA
        records from `from_lsn` on were read. `last_lsn`, `damages` and `sealed_last` say the
        rest, as after iterating `records`."""
        lists = self._begin(self._batches(None, _SCAN_BATCH, _COUNT_ONLY, False))
        return sum(len(lsns) for lsns in lists)

    def _rewind(self, first_unread: Record, unread: int) -> None:
        """Step back to `first_unread`, the first of `unread` records handed over in a batch
        but never consumed (the batch came from the current segment)."""
        self._offset = first_unread.offset
        self._expected = first_unread.lsn
        self.last_lsn = first_unread.lsn - 1
        self.records_read -= unread
        self._need = 0

    def _batches(
        self, to_lsn: Optional[int], budget: int, shift: int, payloads: bool
    ) -> Iterator[list]:
        """The reading loop: lists of Records (of LSNs when not `payloads`), never spanning
        two segments. A record of n payload bytes costs 1 + (n >> shift) of a list's `budget`
        (a shift of 64 or more: one each); a list ends once its budget is spent.

        Progress is saved before each list is handed over, so a consumer may stop after any
        list. Records checked for the next list are never lost: if anything raises before that
        list is handed over, the reader steps back to its first record."""
        if self._stopped:
            return
        if self._seg is None and not self._start():
            if self.damages:
                self._stopped = True
            return
        if self.sealed_last:
            # The last call ended at the SEAL of the last segment: the writer creates the next
            # segment just after it writes a SEAL, so look for it again.
            nxt = self._next_segment(self._seg)
            if nxt is None:
                return
            self.sealed_last = False
            if not self._open_segment(nxt, self._expected):
                self._stopped = True
                return
        out: list = []
        left = budget  # what is left of the budget of the list being filled
        handed = (self._offset, self._expected, self.last_lsn)  # the end of the last list
        try:
            while True:
                if to_lsn is not None and self._expected > to_lsn:
                    if out:
                        self.records_read += len(out)
                        yield out
                    return
                seg = self._seg
                try:
                    f = open(seg.path, "rb")
                except FileNotFoundError:
                    if out:  # records of this segment read before: theirs, whatever comes next
                        self.records_read += len(out)
                        batch, out = out, []
                        left = budget
                        handed = (self._offset, self._expected, self.last_lsn)
                        yield batch
                    # Every record of it was read, then it was deleted as applied (mark_applied):
                    # go on in the segment that starts where this one ended.
                    nxt = self._successor_starting_at(self._expected)
                    if nxt is None:
                        raise
                    if not self._open_segment(nxt, self._expected):
                        self._stopped = True
                        return
                    continue
                with f:
                    size = os.fstat(f.fileno()).st_size
                    f.seek(self._offset)
                    data = f.read(max(_CHUNK_BYTES, self._need))
                self._need = 0
                base = self._offset
                buf = memoryview(data)
                end = len(data)
                at_eof = base + end >= size
                zero_end = False
                off = 0
                seed = self._seed
                expected = self._expected
                last = self.last_lsn
                from_lsn = self.from_lsn
                sealed = 0  # the end of the SEAL record, once found
                damage = None
                check = _check_record
                limit = to_lsn if to_lsn is not None else _NO_LIMIT
                unpack = fmt.REC_HEAD.unpack_from
                crc32c = fmt.crc32c
                DELTA = fmt.MASK_DELTA  # fmt.mask, inlined below: this loop runs once per record
                # The record layout (FORMAT.md), bound to locals for the loop below.
                HEAD, CRC_SIZE, ALIGN = fmt.RECORD_HEADER_SIZE, fmt.RECORD_CRC_SIZE, fmt.ALIGN
                DATA, GROUP_START = fmt.TYPE_DATA, fmt.FLAG_GROUP_START
                word = _U64.unpack_from
                name = seg.name
                add = out.append
                while off < end:
                    if expected > limit:
                        break
                    if left <= 0:
                        # A full list: hand it over, then go on in this piece of the file.
                        self._offset = base + off
                        self._expected = expected
                        self.last_lsn = last
                        self.records_read += len(out)
                        batch, out = out, []
                        add = out.append
                        left = budget
                        handed = (self._offset, expected, last)
                        yield batch
                    # Fast path, inlined: a valid DATA record with the expected LSN. Anything
                    # else goes through _check_record, which says precisely what is wrong.
                    valid = False
                    if end - off >= HEAD:
                        crc, n, lsn, rtype, pad, res = unpack(buf, off)
                        rec_end = off + HEAD + n + pad
                        if (
                            rtype == DATA
                            and lsn == expected
                            and rec_end <= end
                            and n <= _MAX
                            and res <= GROUP_START  # zero, or the group-start flag (fmt.RECORD_FLAGS)
                            and pad == (-(HEAD + n)) % ALIGN
                            # zero padding: the top `pad` bytes of the record's last 8-byte word
                            and (not pad or not word(buf, rec_end - ALIGN)[0] >> (64 - 8 * pad))
                        ):
                            c = crc32c(buf[off + CRC_SIZE : off + HEAD + n], seed)
                            valid = ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + DELTA) & 0xFFFFFFFF == crc
                    if not valid:
                        if not at_eof:
                            # A record cut by the end of this piece of the file: read on from it.
                            if end - off < HEAD:
                                self._need = 2 * _CHUNK_BYTES
                                break
                            n = unpack(buf, off)[1]
                            if n <= _MAX and off + HEAD + ALIGN + n > end:
                                self._need = HEAD + ALIGN + n
                                break
                        if _written_data_ends(data, off, end, at_eof, seg.path, base):
                            zero_end = True
                            break
                        got = check(buf, off, end, seed, expected)
                        if got.__class__ is str:
                            if not at_eof:
                                # Classify damage against the whole rest of the file.
                                with open(seg.path, "rb") as f:
                                    f.seek(base)
                                    data = f.read()
                                buf = memoryview(data)
                                end = len(data)
                                at_eof = True
                                got = check(buf, off, end, seed, expected)
                                if got.__class__ is not str:
                                    continue
                            damage = got
                            break
                        lsn, rtype, n, rec_end = got
                        if rtype == fmt.TYPE_SEAL:
                            # Checked below, once the records before it are handed over. Progress
                            # stays at the SEAL until the next segment is open: a consumer that
                            # stops at that list reads the SEAL again next time.
                            sealed = rec_end
                            break
                    expected = last = lsn
                    expected += 1
                    if lsn >= from_lsn:
                        left -= 1 + (n >> shift)
                        if payloads:
                            add(_new_record(Record, (lsn, bytes(buf[off + HEAD : off + HEAD + n]), name, base + off)))
                        else:
                            add(lsn)
                    off = rec_end
                self._offset = base + off
                self._expected = expected
                self.last_lsn = last
                if self._need or (
                    not at_eof and not zero_end and damage is None and not sealed and expected <= limit
                ):
                    continue  # the next piece of this segment: the list goes on
                if out:
                    # Before the damage is reported, or the next segment is opened: what was
                    # read up to here is handed over first.
                    self.records_read += len(out)
                    batch, out = out, []
                    left = budget
                    handed = (self._offset, self._expected, self.last_lsn)
                    yield batch
                # Zeros after the SEAL: preallocated space the writer had not yet cut when it
                # stopped, possible only before it created the next segment.
                if sealed and base + sealed != size and not (
                    self._is_last(seg) and _zeros_from(seg.path, base + sealed)
                ):
                    damage = f"end of segment after its SEAL record, found {size - base - sealed} more bytes"
                    sealed = 0
                if damage is not None:
                    if not self._handle_damage(seg, buf, base, off, end, seed, expected, damage):
                        return
                    continue
                if sealed:
                    self._offset = base + sealed
                    self.sealed_last = True
                    nxt = self._next_segment(seg)
                    if nxt is None:
                        return
                    self.sealed_last = False
                    if not self._open_segment(nxt, expected):
                        self._stopped = True
                        return
                    continue
                if to_lsn is not None and expected > to_lsn:
                    return
                if not at_eof and not zero_end:
                    continue  # the next piece of this segment
                if not self._is_last(seg):
                    # Only the last segment may be unsealed. The writer seals a segment before
                    # it creates the next one, so a segment that grew since it was read is
                    # re-read.
                    if os.path.getsize(seg.path) > size:
                        continue
                    if not self._handle_damage(
                        seg, buf, base, off, end, seed, expected,
                        "a SEAL record at the end of a segment that has a successor",
                    ):
                        return
                    continue
                return  # clean end of the segment's current bytes
        except BaseException:
            if out:  # checked, never handed over: the next call reads them again
                self._offset, self._expected, self.last_lsn = handed
                self._need = 0
            raise

    def _successor_starting_at(self, lsn: int) -> Optional[SegmentInfo]:
        after_gap = read_gaps(self.directory).get(lsn - 1)
        for s in self._segments():
            if s.first_lsn in (lsn, after_gap) and (self._seg is None or s.number > self._seg.number):
                return s
        return None

    def _next_segment(self, seg: SegmentInfo) -> Optional[SegmentInfo]:
        for s in self._segments():
            if s.number == seg.number + 1:
                return s
        return None

    def _is_last(self, seg: SegmentInfo) -> bool:
        return self._next_segment(seg) is None

    def _handle_damage(self, seg, buf, base, off, end, seed, expected, what) -> bool:
        """Classify damage at `base + off`; True if reading continues (salvage) in this segment."""
        after = _find_valid_after(buf, off, end, seed, expected - 1 if expected > 1 else 1)
        # A torn write cannot leave a whole record with a valid CRC: one there with the wrong
        # LSN is damage of durable bytes, even at the very end of the log.
        whole = not isinstance(_check_record(buf, off, end, seed, None), str)
        # Only the last group can be partly on disk after a crash, and its pages may land in any
        # order: a lost write (zeros) with later records of that group after it is still a torn
        # tail, unless a SEAL or a later group follows (written only after it was synced). A log
        # written before groups were flagged shows no later group: a SEAL alone tells.
        lost = after is not None and _looks_lost(buf, off, end, base)
        synced_at = _synced_before(buf, after, end, seed, expected) if lost else None
        lost_write = lost and synced_at is None
        # A whole last record that fails its check with no zeros in it was durable and changed
        # (a flipped bit): corruption, not the end of an unacknowledged group.
        flipped = after is None and _looks_flipped(buf, off, end, base)
        torn = (after is None or lost_write) and not whole and not flipped and self._is_last(seg)
        found = "a damaged record" if after is None else f"a valid record at offset {base + after}"
        if flipped:
            found = "a whole record that fails its check, no sector of it zeros (a changed byte, not a torn write)"
        elif synced_at is not None:
            found = (
                f"zeros (a lost write), then at offset {base + synced_at} a record written only after "
                "the damaged bytes were synced (a later group's first record, or a SEAL)"
            )
        if off >= end:
            found = "the end of the file"
        self._damage(seg.path, base + off, what, found, torn, (after or end) - off)
        if self.mode is RecoveryMode.SALVAGE:
            if after is not None:
                _crc, _n, lsn, rtype, _pad, _res = fmt.REC_HEAD.unpack_from(buf, after)
                self._offset = base + after
                # A SEAL carries the LSN of the record before it, not its own.
                self._expected = lsn if rtype == fmt.TYPE_DATA else lsn + 1
                return True
            nxt = self._next_segment(seg)
            if nxt is not None and self._open_segment(nxt, None):
                return True
        self._stopped = True
        return False


@dataclass(frozen=True)
class SegmentEnd:
    """Where the valid records of a log's last segment end (`scan_last_segment`)."""

    segment: SegmentInfo
    end_offset: int  # just past its last valid record, or its SEAL
    next_lsn: int  # the LSN the next record appended to the log carries
    seed: int  # the CRC seed of the segment's salt
    sealed: bool  # it ends with a SEAL record
    torn_tail: Optional[Damage]  # the torn tail found at end_offset, if any


class _OneSegmentReader(WalReader):
    """A reader that sees one segment only, as if the log held no other."""

    def __init__(self, directory: str, segment: SegmentInfo, mode: RecoveryMode | str):
        super().__init__(directory, from_lsn=segment.first_lsn, mode=mode)
        self._segment = segment

    def _segments(self) -> list[SegmentInfo]:
        return [self._segment]


def scan_last_segment(directory: str, segments: Optional[list[SegmentInfo]] = None) -> SegmentEnd:
    """Check the last of `segments` (by default the directory's) to its end under TOLERATE_TAIL
    and say where its valid records end: what opening the log for appending needs.

    Earlier segments are not read: they are the compactor's to read. A log of one segment is
    read as any reader reads it from its start (missing segments before it not declared applied
    are corruption). Past the end there may be a torn tail (`torn_tail`), the zeros of a
    preallocated segment, or bytes after a SEAL. Raises WalCorruptionError for damage that is not
    a torn tail, a damaged segment header included."""
    segs = list_segments(directory) if segments is None else segments
    if not segs:
        raise WalUsageError(f"no segment in {directory}")
    last = segs[-1]
    if len(segs) > 1:
        reader = _OneSegmentReader(directory, last, RecoveryMode.TOLERATE_TAIL)
    else:
        reader = WalReader(directory, from_lsn=last.first_lsn, mode=RecoveryMode.TOLERATE_TAIL)
    reader.skip_to_end()
    if reader._seg is None:
        # The last segment's header is damaged: never a torn tail (see FORMAT.md).
        d = reader.damages[0] if reader.damages else None
        raise WalCorruptionError(last.path, 0, "a valid segment header", d.found if d else "?")
    return SegmentEnd(
        last,
        reader._offset,
        reader._expected,
        reader._seed,
        reader.sealed_last,
        reader.damages[0] if reader.damages else None,
    )


def read_records(
    directory: str,
    *,
    from_lsn: int = 1,
    to_lsn: Optional[int] = None,
    mode: RecoveryMode | str = RecoveryMode.TOLERATE_TAIL,
) -> Iterator[Record]:
    """Yield every DATA record from `from_lsn` (to `to_lsn`), in LSN order, under `mode`."""
    return WalReader(directory, from_lsn=from_lsn, mode=mode).records(to_lsn)


def scan(directory: str, *, mode: RecoveryMode | str = RecoveryMode.TOLERATE_TAIL) -> ScanResult:
    """Read the whole log and summarise it; raises WalCorruptionError as `mode` says."""
    if not os.path.isdir(directory):
        raise WalUsageError(f"no WAL directory at {directory}")
    reader = WalReader(directory, mode=mode)
    result = ScanResult()
    for lsns in reader._batches(None, _SCAN_BATCH, _COUNT_ONLY, False):
        if result.first_lsn is None:
            result.first_lsn = lsns[0]
        result.records += len(lsns)
    result.last_lsn = reader.last_lsn
    result.segments = len(list_segments(directory))
    result.sealed_last = reader.sealed_last
    result.damages = list(reader.damages)
    if reader._seg is not None:
        result.end_segment = reader._seg.path
        result.end_offset = reader._offset
    return result


# -- salvage of one segment file ---------------------------------------------------------------


def _solve_salt(buf, off: int, n: int, stored_crc: int) -> Optional[int]:
    """The salt under which the record at `off` (payload length `n`) has the CRC `stored_crc`.

    A record's CRC covers salt + header + payload; CRC-32C is affine in its input bits, so the
    32 salt bits follow from one record by solving 32 linear equations over GF(2)."""
    rest = bytes(buf[off + 4 : off + fmt.RECORD_HEADER_SIZE + n])
    crc = fmt.crc32c
    base = crc(bytes(4) + rest)
    target = fmt.unmask(stored_crc) ^ base
    # Columns of the linear map salt -> CRC; eliminate to find the salt bits.
    rows = []  # (column bits as an int over 32 equations) per salt bit
    for i in range(32):
        rows.append(crc((1 << i).to_bytes(4, "little") + rest) ^ base)
    # Solve sum(bit_i * rows[i]) == target: Gaussian elimination on the 32 columns.
    pivots: dict[int, tuple[int, int]] = {}  # pivot bit -> (column, combination of salt bits)
    for i, col in enumerate(rows):
        combo = 1 << i
        for bit, (pcol, pcombo) in pivots.items():
            if col >> bit & 1:
                col ^= pcol
                combo ^= pcombo
        if col == 0:
            continue
        bit = col.bit_length() - 1
        for b, (pcol, pcombo) in list(pivots.items()):
            if pcol >> bit & 1:
                pivots[b] = (pcol ^ col, pcombo ^ combo)
        pivots[bit] = (col, combo)
    salt = 0
    rem = target
    for bit, (pcol, pcombo) in pivots.items():
        if rem >> bit & 1:
            rem ^= pcol
            salt ^= pcombo
    return salt if rem == 0 else None


def recover_salt(path: str, first_lsn: int) -> Optional[int]:
    """The salt of a segment whose header is damaged, found from its records: the first two
    consecutive records (LSN first_lsn or later) that both check under one salt. None if the
    file holds no such pair (one record alone could fit any salt)."""
    with open(path, "rb") as f:
        data = f.read()
    buf = memoryview(data)
    end = len(data)
    pos = fmt.SEGMENT_HEADER_SIZE
    while pos + fmt.RECORD_HEADER_SIZE <= end:
        crc, n, lsn, rtype, pad, res = fmt.REC_HEAD.unpack_from(buf, pos)
        rec_end = pos + fmt.RECORD_HEADER_SIZE + n + pad
        if (
            rtype == fmt.TYPE_DATA and res in fmt.RECORD_FLAGS and n <= fmt.MAX_PAYLOAD_BYTES and rec_end <= end
            and pad == fmt.padding_for(n) and lsn >= first_lsn
        ):
            salt = _solve_salt(buf, pos, n, crc)
            if salt is not None:
                seed = fmt.salt_seed(salt)
                if not isinstance(_check_record(buf, pos, end, seed, None), str):
                    nxt = _check_record(buf, rec_end, end, seed, lsn + 1)
                    if not isinstance(nxt, str):
                        return salt
        pos += fmt.ALIGN
    return None


@dataclass(frozen=True)
class DamagedRange:
    """Bytes of a segment file that hold no valid record, and the LSNs lost with them.

    `first_lost_lsn`..`last_lost_lsn`: the records those bytes held (none when the damage was
    only padding or a header whose salt was recovered); `last_lost_lsn` None: unknown (the end of
    the last segment). `torn_tail`: the unacknowledged end of the log, not a loss."""

    path: str
    offset: int
    length: int
    first_lost_lsn: Optional[int]
    last_lost_lsn: Optional[int]
    torn_tail: bool
    expected: str
    found: str

    @property
    def lost_records(self) -> Optional[int]:
        if self.first_lost_lsn is None:
            return 0
        if self.last_lost_lsn is None:
            return None
        return self.last_lost_lsn - self.first_lost_lsn + 1


@dataclass(frozen=True)
class FileSalvage:
    """Every record with a valid CRC in one segment file, and each damaged range."""

    path: str
    number: int
    first_lsn: int
    records: tuple[Record, ...]
    damages: tuple[DamagedRange, ...]
    sealed: bool
    size: int


class _SalvageReader(_OneSegmentReader):
    """A one-segment reader in SALVAGE mode that also reads a segment whose header is damaged,
    when the salt can be found from its records."""

    def _open_segment(self, seg: SegmentInfo, expected_first: Optional[int]) -> bool:
        with open(seg.path, "rb") as f:
            head = f.read(fmt.SEGMENT_HEADER_SIZE)
        got = fmt.decode_segment_header(head)
        if not isinstance(got, str) and got.segment_number == seg.number and got.first_lsn == seg.first_lsn:
            return super()._open_segment(seg, expected_first)
        salt = recover_salt(seg.path, seg.first_lsn)
        what = got if isinstance(got, str) else "a header naming this segment"
        if salt is None:
            return self._damage(seg.path, 0, what, "a damaged segment header (no salt found)", False)
        self.damages.append(Damage(seg.path, 0, what, "a damaged segment header (salt found from its records)", False))
        self._seg = seg
        self._seed = fmt.salt_seed(salt)
        self._offset = fmt.SEGMENT_HEADER_SIZE
        self._expected = seg.first_lsn
        return True


def segment_of(path: str) -> Optional[SegmentInfo]:
    """The segment a file is, or was a copy of (`<name>.wal.broken[.N]`), from its name."""
    name = os.path.basename(path)
    base = name.split(".wal", 1)[0] + ".wal" if ".wal" in name else name
    parsed = fmt.parse_segment_name(base)
    if parsed is None:
        return None
    return SegmentInfo(path, name, parsed[0], parsed[1])


def salvage_file(path: str, *, next_first_lsn: Optional[int] = None, last: bool = True) -> FileSalvage:
    """Read one segment file (a segment, or a `.broken` copy) in salvage mode: every record with
    a valid CRC, resyncing after damage on the next valid record header (the segment's salt, an
    LSN that continues the chain), and each damaged range with the LSNs it held.

    `next_first_lsn`: the first LSN of the segment after it, which bounds the LSNs lost at its
    end; `last`: it is the log's last segment (where a torn tail can be)."""
    seg = segment_of(path)
    if seg is None:
        raise WalUsageError(f"{path} is not named as a segment or a copy of one")
    return _salvage(path, seg, next_first_lsn, last)


def tail_of(path: str) -> Optional[tuple[SegmentInfo, int]]:
    """The segment a kept torn tail (`<segment>.tail-<offset>[.N]`) was cut from, and the
    offset it was cut at; None for any other name."""
    name = os.path.basename(path)
    base, mark, rest = name.partition(TAIL_MARK)
    seg = segment_of(os.path.join(os.path.dirname(path), base)) if mark and base.endswith(".wal") else None
    parts = rest.split(".")
    if seg is None or len(parts) > 2 or not all(p.isdigit() for p in parts):
        return None  # a `.tmp` being written is not one yet
    return SegmentInfo(path, name, seg.number, seg.first_lsn), int(parts[0])


def salvage_tail(path: str) -> FileSalvage:
    """Read a kept torn tail in salvage mode: every record with a valid CRC in it, and each
    damaged range (offsets are the segment's, where the bytes were before the cut).

    The file is the bytes cut, after a segment header naming the LSN the tail began at (see
    FORMAT.md), so it reads as a segment of its own."""
    found = tail_of(path)
    if found is None:
        raise WalUsageError(f"{path} is not named as a kept torn tail (<segment>.tail-<offset>)")
    seg, cut_at = found
    with open(path, "rb") as f:
        head = fmt.decode_segment_header(f.read(fmt.SEGMENT_HEADER_SIZE))
    if isinstance(head, str):
        raise WalCorruptionError(path, 0, "the header a kept tail starts with", head)
    got = _salvage(path, SegmentInfo(path, seg.name, head.segment_number, head.first_lsn), None, True)
    shift = cut_at - fmt.SEGMENT_HEADER_SIZE
    ranges = tuple(dataclasses.replace(d, offset=d.offset + shift) for d in got.damages)
    return dataclasses.replace(got, damages=ranges)


def _salvage(path: str, seg: SegmentInfo, next_first_lsn: Optional[int], last: bool) -> FileSalvage:
    reader = _SalvageReader(os.path.dirname(path) or ".", seg, RecoveryMode.SALVAGE)
    records = tuple(reader.records())
    sealed = reader.sealed_last
    size = os.path.getsize(path)
    lsns = [r.lsn for r in records]
    offsets = [r.offset for r in records]
    ranges = []
    for d in reader.damages:
        if d.missing_segments:
            continue
        i = bisect.bisect_left(offsets, d.offset)
        before = lsns[i - 1] if i > 0 else seg.first_lsn - 1
        stop = d.offset + max(d.skipped_bytes, 0)
        j = bisect.bisect_left(offsets, stop)
        if j < len(lsns):
            after: Optional[int] = lsns[j]
        elif sealed:
            after = reader._expected  # the SEAL carries the segment's last LSN
        else:
            after = next_first_lsn
        if d.offset == 0 and "salt found" in d.found:
            first_lost = last_lost = None
        elif after is None:
            first_lost, last_lost = before + 1, None
        elif after - 1 >= before + 1:
            first_lost, last_lost = before + 1, after - 1
        else:
            first_lost = last_lost = None
        length = (stop if stop > d.offset else size) - d.offset
        if d.offset == 0 and "salt found" in d.found:
            length = fmt.SEGMENT_HEADER_SIZE
        torn = d.torn_tail and last
        ranges.append(DamagedRange(path, d.offset, length, first_lost, last_lost, torn, d.expected, d.found))
    if next_first_lsn is not None:
        # A segment that ends short of its successor's first LSN without damage seen (zeros
        # where its last records and SEAL were read as the end of written data) lost the rest.
        top = max([lsns[-1] if lsns else seg.first_lsn - 1]
                  + [r.last_lost_lsn for r in ranges if r.last_lost_lsn is not None])
        gap_after = read_gaps(os.path.dirname(path) or ".").get(top)
        if top + 1 < next_first_lsn and gap_after != next_first_lsn and not any(r.last_lost_lsn is None for r in ranges):
            end_of_data = reader._offset if reader._seg is not None else fmt.SEGMENT_HEADER_SIZE
            ranges.append(DamagedRange(
                path, end_of_data, size - end_of_data, top + 1, next_first_lsn - 1, False,
                f"records up to LSN {next_first_lsn - 1} and a SEAL record", "zeros to the end of the file",
            ))
    return FileSalvage(path, seg.number, seg.first_lsn, records, tuple(ranges), sealed, size)


def last_record_lsn(directory: str, *, window_bytes: int = 1 << 20) -> Optional[int]:
    """The LSN of the last record of the log, read back from the end of its last segment
    without reading the segment from its start; None when it cannot be told that way (no
    segment, a damaged header, a torn or damaged end, a last record longer than `window_bytes`):
    read the log forward then.

    Read-only, and no judge of damage: it answers "does the log hold anything past LSN x?" in
    one short read where a forward read checks every record of the segment. The record found
    must pass every check a forward read makes (framing, salted CRC, padding) and end where the
    segment's data ends, so a partly written group is never taken for it. For a SEAL record
    the answer is the LSN it seals (the last DATA record's)."""
    segs = list_segments(directory)
    if not segs:
        return None
    seg = segs[-1]
    with open(seg.path, "rb", buffering=0) as f:
        got = fmt.decode_segment_header(f.read(fmt.SEGMENT_HEADER_SIZE))
        if isinstance(got, str) or got.segment_number != seg.number or got.first_lsn != seg.first_lsn:
            return None
        # Where the data ends: past it, a preallocated segment is zeros.
        pos = os.fstat(f.fileno()).st_size
        data_end = None
        buf = bytearray(len(_ZERO_BLOCK))
        while pos > fmt.SEGMENT_HEADER_SIZE:
            start = max(fmt.SEGMENT_HEADER_SIZE, pos - len(buf))
            f.seek(start)
            n = f.readinto(memoryview(buf)[: pos - start])
            if n != pos - start:
                return None  # the file changed under us
            block = bytes(buf[:n]).rstrip(b"\x00")
            if block:
                data_end = start + len(block)
                break
            pos = start
        if data_end is None:
            return None  # an empty segment: the log's last record is in another one, or none
        lo = max(fmt.SEGMENT_HEADER_SIZE, data_end - window_bytes)
        # Whole aligned words up to where the last record may end (its padding, and a payload
        # ending in zero bytes, lie beyond the last non-zero byte).
        hi = min(os.fstat(f.fileno()).st_size, data_end + fmt.RECORD_HEADER_SIZE + fmt.ALIGN + 16)
        f.seek(lo)
        tail = f.read(hi - lo)
    seed = fmt.salt_seed(got.salt)
    first = lo + (-(lo - fmt.SEGMENT_HEADER_SIZE) % fmt.ALIGN)
    off = data_end - fmt.RECORD_HEADER_SIZE
    off -= (off - fmt.SEGMENT_HEADER_SIZE) % fmt.ALIGN
    while off >= first:
        got_rec = _check_record(tail, off - lo, len(tail), seed, None)
        if not isinstance(got_rec, str):
            lsn, rtype, _n, rec_end = got_rec
            if rec_end + lo >= data_end:
                return lsn
            return None  # a valid record that ends before the data does: a torn or damaged end
        off -= fmt.ALIGN
    return None
