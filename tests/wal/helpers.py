"""Small helpers for the WAL tests: build logs, list records, and edit bytes in place."""

from __future__ import annotations

import os
import struct
from typing import NamedTuple, Optional, Sequence

import wal
from wal import format as fmt


def payload_for(i: int) -> bytes:
    """A distinct payload whose length walks through every padding remainder."""
    return (f"p{i}:" + "x" * (i * 7 % 45)).encode()


def write_log(
    directory, payloads: Sequence[bytes], *, segment_size_bytes: int = 256, batch: int = 1
) -> list[int]:
    """Append `payloads` (in batches of `batch`) to the WAL in `directory`; return their LSNs."""
    lsns: list[int] = []
    with wal.Wal(str(directory), segment_size_bytes=segment_size_bytes) as w:
        for i in range(0, len(payloads), batch):
            chunk = list(payloads[i : i + batch])
            lsns.extend(w.append_many(chunk) if batch > 1 else [w.append(chunk[0])])
    return lsns


def read_all(directory, mode: str = "tolerate_tail", from_lsn: int = 1) -> list[wal.Record]:
    return list(wal.read_records(str(directory), mode=mode, from_lsn=from_lsn))


def segment_paths(directory) -> list[str]:
    return [s.path for s in wal.list_segments(str(directory))]


def read_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write_bytes(path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


class Span(NamedTuple):
    """Where one framed record (DATA or SEAL) sits in a segment file."""

    offset: int
    end: int
    lsn: int
    rtype: int


def record_spans(path) -> list[Span]:
    """The records of an undamaged segment, in file order (SEAL included)."""
    data = read_bytes(path)
    out = []
    off = fmt.SEGMENT_HEADER_SIZE
    while off < len(data):
        _crc, n, lsn, rtype, pad, _res = fmt.REC_HEAD.unpack_from(data, off)
        end = off + fmt.RECORD_HEADER_SIZE + n + pad
        out.append(Span(off, end, lsn, rtype))
        off = end
    return out


def span_containing(path, byte_offset: int) -> int:
    """The offset of the record holding `byte_offset` (0 for the segment header)."""
    if byte_offset < fmt.SEGMENT_HEADER_SIZE:
        return 0
    for span in record_spans(path):
        if span.offset <= byte_offset < span.end:
            return span.offset
    raise ValueError(f"offset {byte_offset} is past the last record of {path}")


def salt_of(path) -> int:
    header = fmt.decode_segment_header(read_bytes(path)[: fmt.SEGMENT_HEADER_SIZE])
    assert not isinstance(header, str), header
    return header.salt


# -- byte editing -------------------------------------------------------------------------
def flip_bit(path, byte_offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(byte_offset)
        (b,) = f.read(1)
        f.seek(byte_offset)
        f.write(bytes([b ^ (1 << bit)]))


def put(path, offset: int, data: bytes) -> None:
    """Overwrite bytes at `offset`."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def put_u32(path, offset: int, value: int) -> None:
    put(path, offset, struct.pack("<I", value))


def put_u64(path, offset: int, value: int) -> None:
    put(path, offset, struct.pack("<Q", value))


def truncate(path, size: int) -> None:
    os.truncate(path, size)


def append_bytes(path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def shrink_length(path, record_offset: int, by: int) -> None:
    """Make the record at `record_offset` claim `by` fewer payload bytes."""
    n = struct.unpack_from("<I", read_bytes(path), record_offset + 4)[0]
    put_u32(path, record_offset + 4, n - by)


def fix_record_crc(path, record_offset: int) -> None:
    """Recompute the stored CRC of the record at `record_offset` after its bytes were edited."""
    data = read_bytes(path)
    n = struct.unpack_from("<I", data, record_offset + 4)[0]
    body = data[record_offset + 4 : record_offset + fmt.RECORD_HEADER_SIZE + n]
    crc = fmt.crc32c(body, fmt.salt_seed(salt_of(path)))
    put_u32(path, record_offset, fmt.mask(crc))


def fix_header_crc(path) -> None:
    """Recompute the segment header's CRC after its bytes were edited."""
    head = read_bytes(path)[:36]
    put_u32(path, 36, fmt.mask(fmt.crc32c(head)))


def build_segment(
    directory,
    number: int,
    first_lsn: int,
    records: Sequence[tuple[int, int, bytes]] = (),
    *,
    salt: int = 0x5A17_5A17,
    seal: Optional[tuple[int, int]] = None,
) -> str:
    """Write a segment file by hand: `records` are (lsn, type, payload); `seal` (last, count)."""
    seed = fmt.salt_seed(salt)
    parts = [fmt.encode_segment_header(salt, number, first_lsn)]
    parts += [fmt.encode_record(seed, lsn, rtype, p) for lsn, rtype, p in records]
    if seal is not None:
        parts.append(fmt.encode_seal(seed, *seal))
    path = os.path.join(str(directory), fmt.segment_name(number, first_lsn))
    write_bytes(path, b"".join(parts))
    return path


def data_records(first_lsn: int, payloads: Sequence[bytes]) -> list[tuple[int, int, bytes]]:
    return [(first_lsn + i, fmt.TYPE_DATA, p) for i, p in enumerate(payloads)]
