"""tracedb's errors: one root with a stable code and a hint, one subclass per condition."""

from __future__ import annotations

from typing import Optional

# CLI exit codes, stable: documented in the README.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_NOT_FOUND = 3
EXIT_INTEGRITY = 4
EXIT_IN_USE = 5
EXIT_NOT_REPLAYABLE = 6


class TraceDBError(Exception):
    """Root of tracedb's errors. `code` is stable; `hint` tells the user what to do."""

    code = "error"
    exit_code = EXIT_ERROR

    def __init__(self, message: str, *, hint: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} (hint: {self.hint})"
        return self.message


class ExecutionNotFoundError(TraceDBError):
    code = "unknown_execution"
    exit_code = EXIT_NOT_FOUND

    def __init__(self, execution_id: str, *, hint: Optional[str] = None):
        super().__init__(
            f"no execution {execution_id!r}",
            hint=hint or "list executions with `tracedb inspect --list`",
        )
        self.execution_id = execution_id


class ExecutionClosedError(TraceDBError):
    """An event for an execution that is completed, incomplete or invalidated."""

    code = "execution_closed"

    def __init__(self, execution_id: str, status: str):
        super().__init__(
            f"execution {execution_id!r} is {status}; it accepts no more events",
            hint="start a new execution, or fork this one with `tracedb fork`",
        )
        self.execution_id = execution_id
        self.status = status


class ExecutionExistsError(TraceDBError):
    code = "execution_exists"

    def __init__(self, execution_id: str):
        super().__init__(f"execution {execution_id!r} already exists")
        self.execution_id = execution_id


class InvalidInputError(TraceDBError):
    """Wrong types or values from a caller (not JSON-serialisable, bad event type, ...)."""

    code = "bad_request"


class IntegrityError(TraceDBError):
    """A stored record fails verification (envelope hash, event order, database check)."""

    code = "integrity"
    exit_code = EXIT_INTEGRITY


class StoreInUseError(TraceDBError):
    """The data directory's WAL is held by another process (a running recorder)."""

    code = "in_use"
    exit_code = EXIT_IN_USE


class RecordingFailedError(TraceDBError):
    """The WAL failed (EIO, ENOSPC, ...): nothing more can be recorded until the store reopens."""

    code = "unavailable"


class ConfigError(TraceDBError):
    code = "config"
