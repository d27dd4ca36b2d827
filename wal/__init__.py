"""tracedb's write-ahead log: durable appends with group commit, recovery modes, repair.

The byte layout and the recovery rules are specified in wal/FORMAT.md. This package knows
nothing of traces.
"""

from .dir_lock import acquire_dir_lock, is_locked
from .errors import (
    PayloadTooLargeError,
    WalClosedError,
    WalCorruptionError,
    WalError,
    WalFailedError,
    WalLockedError,
    WalUsageError,
)
from .format import MAX_PAYLOAD_BYTES
from .fs import OsFileSystem
from .reader import (
    Damage,
    DamagedRange,
    FileSalvage,
    Record,
    RecoveryMode,
    ScanResult,
    WalReader,
    last_record_lsn,
    list_segments,
    read_applied_lsn,
    read_gaps,
    read_records,
    recover_salt,
    salvage_file,
    salvage_tail,
    scan,
    segment_of,
    tail_of,
)
from .repair import KeptTail, RepairResult, repair

# The writer (asyncio, threads, native AIO) loads on first use: a process that only reads the
# log (every read command) does not pay for it.
_LAZY = {
    "DEFAULT_SEGMENT_SIZE_BYTES": "writer", "AsyncWal": "writer", "OpenResult": "writer", "Wal": "writer",
    "WalStats": "writer", "open_async": "writer", "open_wal": "writer",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'wal' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value

__all__ = [
    "acquire_dir_lock",
    "is_locked",
    "AsyncWal",
    "Damage",
    "DamagedRange",
    "FileSalvage",
    "KeptTail",
    "DEFAULT_SEGMENT_SIZE_BYTES",
    "MAX_PAYLOAD_BYTES",
    "OpenResult",
    "OsFileSystem",
    "PayloadTooLargeError",
    "Record",
    "RecoveryMode",
    "RepairResult",
    "ScanResult",
    "Wal",
    "WalClosedError",
    "WalCorruptionError",
    "WalError",
    "WalFailedError",
    "WalLockedError",
    "WalReader",
    "WalStats",
    "WalUsageError",
    "last_record_lsn",
    "list_segments",
    "open_async",
    "open_wal",
    "read_applied_lsn",
    "read_gaps",
    "read_records",
    "recover_salt",
    "repair",
    "salvage_file",
    "salvage_tail",
    "scan",
    "segment_of",
    "tail_of",
]
