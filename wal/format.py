"""Byte layout of segments and records; see wal/FORMAT.md. Pure functions, no I/O."""

from __future__ import annotations

import struct
from typing import NamedTuple

MAGIC = b"TDBWAL\x00\x01"
FORMAT_VERSION = 1
SEGMENT_HEADER_SIZE = 40
RECORD_HEADER_SIZE = 20
RECORD_CRC_SIZE = 4  # the masked CRC leads the header and covers the rest of the record
MAX_PAYLOAD_BYTES = 64 << 20
ALIGN = 8

TYPE_DATA = 1
TYPE_SEAL = 2
RECORD_TYPES = (TYPE_DATA, TYPE_SEAL)

# Record header bytes 18..20 (reserved, zero, before groups were flagged): flags. Bit 0 marks the
# first record of a group (one write, one fdatasync); no other bit is ever set. A SEAL carries none.
FLAG_GROUP_START = 1
RECORD_FLAGS = (0, FLAG_GROUP_START)  # the values the field may hold
_FLAGS_AT = 18

_SEG_HEAD = struct.Struct("<8sHHIQQI")  # magic, version, reserved, salt, segno, first_lsn, reserved
_SEG_CRC = struct.Struct("<I")
_REC_TAIL = struct.Struct("<IQBBH")  # length, lsn, type, padding, flags
_REC_HEAD = struct.Struct("<IIQBBH")  # crc + tail
_SEAL_PAYLOAD = struct.Struct("<QQ")  # last lsn, data record count
_U32 = struct.Struct("<I")
MASK_DELTA = 0xA282EAD8  # LevelDB's CRC mask: rotate right by 15 bits, add this (mod 2**32)



def _load_crc32c():
    """The crc32c package's `crc32c(data, value=0)`, from its C extension.

    The package's `__init__` asks importlib.metadata for its own version, about 20 ms that every
    read command would pay at start-up for a value nobody reads; the extension module is loaded
    by itself instead. Should the package's layout change, it is imported as usual."""
    try:
        import importlib.machinery
        import importlib.util
        import os

        spec = importlib.util.find_spec("crc32c")  # finds the package without running it
        for folder in (spec.submodule_search_locations if spec is not None else None) or ():
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = os.path.join(folder, "_crc32c" + suffix)
                if os.path.isfile(path):
                    loader = importlib.machinery.ExtensionFileLoader("crc32c._crc32c", path)
                    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
                    loader.exec_module(module)
                    return module.crc32c
    except (ImportError, OSError, AttributeError):
        pass
    from crc32c import crc32c as fn

    return fn


crc32c = _load_crc32c()


def mask(crc: int) -> int:
    """LevelDB's CRC mask: a CRC stored in data that is itself checksummed stays strong."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + MASK_DELTA) & 0xFFFFFFFF


def unmask(masked: int) -> int:
    rot = (masked - MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def segment_name(segment_number: int, first_lsn: int) -> str:
    return f"{segment_number:016x}-{first_lsn:016x}.wal"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """(segment number, first LSN) of a segment file name, or None if it is not one."""
    if len(name) != 37 or not name.endswith(".wal") or name[16] != "-":
        return None
    try:
        return int(name[:16], 16), int(name[17:33], 16)
    except ValueError:
        return None


def encode_segment_header(salt: int, segment_number: int, first_lsn: int) -> bytes:
    body = _SEG_HEAD.pack(MAGIC, FORMAT_VERSION, 0, salt, segment_number, first_lsn, 0)
    return body + _SEG_CRC.pack(mask(crc32c(body)))


class SegmentHeader(NamedTuple):
    salt: int
    segment_number: int
    first_lsn: int


def decode_segment_header(data: bytes) -> SegmentHeader | str:
    """The header, or a string saying what is wrong with it."""
    if len(data) < SEGMENT_HEADER_SIZE:
        return f"a {SEGMENT_HEADER_SIZE}-byte segment header, found {len(data)} bytes"
    body = bytes(data[:36])
    (stored,) = _SEG_CRC.unpack_from(data, 36)
    if mask(crc32c(body)) != stored:
        return "a segment header with a valid CRC"
    magic, version, r1, salt, segno, first_lsn, r2 = _SEG_HEAD.unpack(body)
    if magic != MAGIC:
        return f"magic {MAGIC!r}, found {magic!r}"
    if version != FORMAT_VERSION:
        return f"format version {FORMAT_VERSION}, found {version}"
    if r1 or r2:
        return "zero reserved header fields"
    return SegmentHeader(salt, segno, first_lsn)


def salt_seed(salt: int) -> int:
    """The CRC state after the salt: every record CRC of a segment starts from it."""
    return crc32c(_U32.pack(salt))


def padding_for(payload_len: int) -> int:
    return -(RECORD_HEADER_SIZE + payload_len) % ALIGN


_ZEROS = bytes(ALIGN)


def frame_record(out: bytearray, seed: int, lsn: int, rtype: int, payload) -> None:
    """Append one framed record to `out`; `seed` is `salt_seed(segment salt)`."""
    n = len(payload)
    pad = -(RECORD_HEADER_SIZE + n) % ALIGN
    tail = _REC_TAIL.pack(n, lsn, rtype, pad, 0)
    c = crc32c(payload, crc32c(tail, seed))
    out += _U32.pack(((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + MASK_DELTA) & 0xFFFFFFFF)  # mask()
    out += tail
    out += payload
    if pad:
        out += _ZEROS[:pad]


def encode_record(seed: int, lsn: int, rtype: int, payload: bytes) -> bytes:
    """One framed record, as bytes (see `frame_record`)."""
    out = bytearray()
    frame_record(out, seed, lsn, rtype, payload)
    return bytes(out)


def frame_data_records(out: bytearray, seed: int, first_lsn: int, payloads) -> int:
    """Append DATA records for `payloads`, LSNs from `first_lsn` on, to `out`; return the next
    LSN. Byte for byte what `encode_record` gives for each, in one loop: the writer's hot path."""
    pack_tail = _REC_TAIL.pack
    pack_crc = _U32.pack
    crc = crc32c
    zeros = _ZEROS
    lsn = first_lsn
    for payload in payloads:
        n = len(payload)
        pad = -(RECORD_HEADER_SIZE + n) % ALIGN
        tail = pack_tail(n, lsn, TYPE_DATA, pad, 0)
        c = crc(payload, crc(tail, seed))
        out += pack_crc(((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + MASK_DELTA) & 0xFFFFFFFF)  # mask()
        out += tail
        out += payload
        if pad:
            out += zeros[:pad]
        lsn += 1
    return lsn


def mark_group_start(group: bytearray, seed: int) -> None:
    """Flag the record at the start of `group` (framed with `seed`) as its group's first, and
    recompute its CRC: one CRC of one record per group."""
    n = _U32.unpack_from(group, 4)[0]
    group[_FLAGS_AT] |= FLAG_GROUP_START
    with memoryview(group) as view:
        c = crc32c(view[4 : RECORD_HEADER_SIZE + n], seed)
    _U32.pack_into(group, 0, mask(c))


def encode_seal(seed: int, last_lsn: int, data_records: int) -> bytes:
    """The SEAL record: takes no LSN of its own, its LSN field is the segment's last LSN."""
    return encode_record(seed, last_lsn, TYPE_SEAL, _SEAL_PAYLOAD.pack(last_lsn, data_records))


def decode_seal(payload: bytes) -> tuple[int, int]:
    return _SEAL_PAYLOAD.unpack(payload)


REC_HEAD = _REC_HEAD
