"""The WAL's errors. `WalError` is the root; each condition a caller may handle has its class."""

from __future__ import annotations

from typing import Optional


class WalError(Exception):
    """Root of every error the `wal` package raises."""

    default_hint: Optional[str] = None  # what to do about it, unless the raiser gives a hint

    def __init__(self, message: str, *, hint: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.hint = self.default_hint if hint is None else hint

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message

    def with_hint(self, hint: str) -> "WalError":
        """The same error with another hint (returns self)."""
        self.hint = hint
        return self


class WalLockedError(WalError):
    """Another writer holds the directory's LOCK file."""

    default_hint = "one writer per directory: stop that process, or point this one at another directory"

    def __init__(self, directory: str, holder: str):
        super().__init__(f"WAL directory {directory} is locked by another writer ({holder})")
        self.directory = directory
        self.holder = holder


class WalFailedError(WalError):
    """A write or fsync failed; the writer refuses every further append (fail closed)."""

    default_hint = (
        "fix the disk (space, I/O errors), then reopen the log: recovery keeps every acknowledged record"
    )

    def __init__(self, op: str, cause: BaseException):
        super().__init__(f"WAL {op} failed: {cause}; no further appends are accepted")
        self.op = op
        self.errno = getattr(cause, "errno", None)
        self.__cause__ = cause


class WalClosedError(WalError):
    """An append on a closed writer."""


class WalCorruptionError(WalError):
    """Damage that is not a torn tail: names the file, the byte offset and what was expected."""

    default_hint = (
        "stop the recorder; `tracedb wal repair --dry-run` says what a repair would keep and drop, "
        "`tracedb wal repair --salvage` keeps every record with a valid CRC (a plain `tracedb wal "
        "repair` truncates at the damage); each keeps a .broken copy"
    )

    def __init__(self, path: str, offset: int, expected: str, found: str):
        super().__init__(f"WAL corruption in {path} at offset {offset}: expected {expected}, found {found}")
        self.path = path
        self.offset = offset
        self.expected = expected
        self.found = found


class WalUsageError(WalError):
    """An API used the wrong way (a sync call inside a running event loop, a payload too big)."""


class PayloadTooLargeError(WalUsageError):
    def __init__(self, size: int, limit: int):
        super().__init__(f"WAL payload of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit
