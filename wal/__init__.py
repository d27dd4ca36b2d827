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
from .writer import DEFAULT_SEGMENT_SIZE_BYTES, AsyncWal, OpenResult, Wal, WalStats, open_async, open_wal

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
