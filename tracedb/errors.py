"""tracedb's errors: one root with a stable code and a hint, one subclass per condition."""

from __future__ import annotations

import errno
import os
import pwd
from typing import Optional

# CLI exit codes, stable: documented in the README.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
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

    def __init__(self, execution_id: str, *, hint: Optional[str] = None):
        super().__init__(f"execution {execution_id!r} already exists", hint=hint)
        self.execution_id = execution_id


class InvalidInputError(TraceDBError):
    """Wrong types or values from a caller (not JSON-serialisable, bad event type, ...)."""

    code = "bad_request"


class ArgumentError(InvalidInputError):
    """A command's argument that the stored data rules out (a fork point past the end of the
    execution): a usage error, exit 2."""

    exit_code = EXIT_USAGE


class IntegrityError(TraceDBError):
    """A stored record fails verification (envelope hash, event order, database check)."""

    code = "integrity"
    exit_code = EXIT_INTEGRITY


class DatabaseDamagedError(IntegrityError):
    """The database file itself is damaged (SQLite: "database disk image is malformed").

    `path` is the file; the hint says how to rebuild the projection from the WAL, where the WAL
    still holds every record, or what only the file held."""

    code = "database_damaged"

    def __init__(self, path: str, detail: str, *, hint: Optional[str] = None):
        super().__init__(f"the database file {path} is damaged: {detail}", hint=hint)
        self.path = path
        self.detail = detail


class FileAccessError(TraceDBError):
    """A file or directory of the store this process may not read or write (EACCES, EPERM, a
    read-only filesystem). `path` names it; the hint says what to run. Made by `file_error`."""

    code = "file_access"

    def __init__(self, path: str, detail: str, *, hint: Optional[str] = None):
        super().__init__(f"cannot use {path}: {detail}", hint=hint)
        self.path = path
        self.detail = detail


_IO_HINT = (
    "the disk or the filesystem failed: check the device and the kernel log (dmesg); copy the data "
    "directory to a healthy disk, or restore a backup (`tracedb restore --help`), before anything writes to it"
)


class FileReadError(IntegrityError):
    """A file of the store the system failed to read (EIO): the disk or the filesystem is
    damaged, and an answer without it would be partial (exit 4). Made by `file_error`."""

    code = "io_error"

    def __init__(self, path: str, detail: str, *, hint: Optional[str] = None):
        super().__init__(f"cannot read {path}: {detail}", hint=hint or _IO_HINT)
        self.path = path
        self.detail = detail


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def ownership_hint(path: str, data_dir: Optional[str] = None) -> str:
    """What to run when `path` (or, missing, the nearest directory above it) refuses this
    process: act as its owner, or give the data directory to this user."""
    where = os.path.abspath(data_dir or os.path.dirname(os.path.abspath(path)))
    me = _user(os.geteuid())
    probe = os.path.abspath(path)
    while True:
        try:
            st = os.stat(probe)
            break
        except OSError:
            parent = os.path.dirname(probe)
            if parent == probe:
                return f"give {me} read and write access to {where}: `chown -R {me} {where}`"
            probe = parent
    owner = _user(st.st_uid)
    if st.st_uid == os.geteuid():
        return (f"{probe} belongs to {me} but its mode {st.st_mode & 0o7777:04o} refuses {me}: "
                f"`chmod -R u+rwX {where}`")
    return (f"{probe} belongs to {owner} and this process runs as {me}: run tracedb as the user the "
            f"recorder's unit runs as, or, if that is {me} (after a restore run as {owner}, say), "
            f"`chown -R {me} {where}`")


def file_error(error: OSError, data_dir: Optional[str] = None, *, path: Optional[str] = None) -> TraceDBError:
    """The error for an OSError on a file of the store (`path`, else the one the OSError names):
    a permission or a read-only filesystem is FileAccessError (exit 1) with what to run; an I/O
    error is FileReadError (exit 4); anything else FileAccessError naming the file."""
    path = os.path.abspath(path or error.filename or data_dir or ".")
    detail = error.strerror or str(error)
    if error.errno == errno.EIO:
        return FileReadError(path, detail)
    if error.errno in (errno.EACCES, errno.EPERM):
        return FileAccessError(path, detail, hint=ownership_hint(path, data_dir))
    if error.errno == errno.EROFS:
        return FileAccessError(
            path, detail,
            hint="the filesystem holding it is mounted read-only: remount it read-write, or point "
            "--data-dir at a writable directory",
        )
    return FileAccessError(path, detail, hint=f"check {os.path.dirname(os.path.abspath(path))} and its permissions")


def path_exists(path: str, data_dir: Optional[str] = None) -> bool:
    """Whether `path` exists; a path that cannot be looked at (EACCES on a directory above it,
    EIO) is the error `file_error` makes, not "no": a store hidden by permissions is not a
    missing one."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise file_error(e, data_dir, path=path) from None
    return True


class StoreInUseError(TraceDBError):
    """The data directory's WAL is held by another process (a running recorder)."""

    code = "in_use"
    exit_code = EXIT_IN_USE


class RecordingFailedError(TraceDBError):
    """The WAL failed (EIO, ENOSPC, ...): nothing more can be recorded until the store reopens."""

    code = "unavailable"


class ConfigError(TraceDBError):
    code = "config"


class ExtraNotInstalledError(ConfigError, ModuleNotFoundError):
    """A module imported without the extra it needs. Also a ModuleNotFoundError, which is what
    code importing an optional integration catches; its hint says how to install the extra."""

    def __init__(self, module: str, extra: str, missing: Optional[str]):
        # Lazy seam: `import tracedb` does without tracedb.program (shutil) until an extra is missing.
        from tracedb.program import extra_hint

        super().__init__(f"{module} needs the {extra} extra ({missing or 'a package'} is not installed)",
                         hint=extra_hint(extra))
        self.name = missing
        self.extra = extra


# --- replay (tracedb/replay/) -------------------------------------------------------------------

_NOT_REPLAYABLE_HINTS = {
    "execution_incomplete": "the execution never recorded a final response; inspect it with "
    "`tracedb inspect ID`, or replay anyway with --force (the payload may be null)",
    "recording_failure": "the final response was not recorded properly; replay with --force only "
    "to debug (the data may be partial)",
    "manually_invalidated": "an operator invalidated this record; replay with --force only to debug",
    "record_corrupted": "check the record with `tracedb verify ID`",
}


class NotReplayableError(TraceDBError):
    """A record that may not be replayed: `reason` is one of the replayability states."""

    code = "not_replayable"
    exit_code = EXIT_NOT_REPLAYABLE

    def __init__(self, reason: Optional[str], *, execution_id: Optional[str] = None):
        who = f"execution {execution_id!r}" if execution_id else "the record"
        super().__init__(
            f"{who} is not replayable: {reason}",
            hint=_NOT_REPLAYABLE_HINTS.get(reason or "", "replay with --force only to debug"),
        )
        self.reason = reason
        self.execution_id = execution_id


class RecordCorruptedError(NotReplayableError, IntegrityError):
    """A record failing its integrity checks (envelope hash, event order, shape).

    It is a NotReplayableError (reason "record_corrupted", so batch replay reports it like any
    other non-replayable record) and an IntegrityError (the CLI exits 4).
    """

    code = "record_corrupted"
    exit_code = EXIT_INTEGRITY

    def __init__(self, problems: "list[str]", *, execution_id: Optional[str] = None):
        NotReplayableError.__init__(self, "record_corrupted", execution_id=execution_id)
        self.problems = list(problems)
        if self.problems:
            self.message = f"{self.message} ({'; '.join(self.problems)})"


class ReplayHashMismatchError(IntegrityError):
    """The envelope given for verification does not hash to the recorded envelope hash."""

    code = "envelope_mismatch"

    def __init__(self, recorded: Optional[str], provided: str):
        super().__init__(
            f"Envelope modified since original execution: recorded {recorded}, provided {provided}",
            hint="replay with the envelope the execution was recorded with (routingMetadata may differ)",
        )
        self.recorded = recorded
        self.provided = provided


class ReplayDivergenceError(TraceDBError):
    """Strict event-log replay saw a call that differs from the recording (event-log replay).

    `seq` is the seq of the first divergent recorded event, `expected` what the log holds there,
    `got` what the replayed code asked for.
    """

    code = "replay_divergence"

    def __init__(self, seq: Optional[int], expected: object, got: object):
        super().__init__(
            f"replay diverged at seq {seq}: expected {expected}, got {got}",
            hint="the code is not deterministic against this log (random, time, I/O outside the "
            "recorded calls?); replay with strict=False to run unmatched calls live",
        )
        self.seq = seq
        self.expected = expected
        self.got = got


class RecordedCallError(TraceDBError):
    """Event-log replay of an LLM or tool call whose recorded outcome was an error.

    Replay raises it where the live call raised, so a recorded failure replays as that failure.
    """

    code = "recorded_call_error"

    def __init__(self, seq: Optional[int], error_type: str, error_message: str):
        super().__init__(
            f"recorded call at seq {seq} failed: {error_type}: {error_message}",
            hint="this is the recorded failure replaying; fork before it to try the call again",
        )
        self.seq = seq
        self.error_type = error_type
        self.error_message = error_message


class StoreNotFoundError(TraceDBError):
    """No trace store exists where a read command looked."""

    code = "store_not_found"
    exit_code = EXIT_NOT_FOUND

    def __init__(self, path: str, *, hint: Optional[str] = None):
        super().__init__(
            f"no trace store at {path}",
            hint=hint
            or "point --data-dir (or TRACEDB_DATA_DIR) at the recorder's data directory (without "
            "one, tracedb looks for .tracedb in the working directory and its parents); "
            "`tracedb serve` or `tracedb migrate` makes a new one",
        )
        self.path = path


class DatabaseUnavailableError(TraceDBError):
    """The database server cannot be reached (or the connection to it broke).

    `target` is the database URL without its password. Nothing acknowledged is lost: the WAL
    keeps every record until it is compacted, and compaction resumes from its checkpoint.
    """

    code = "db_unavailable"

    def __init__(self, target: str, detail: str, *, hint: Optional[str] = None):
        super().__init__(
            f"cannot use the database {target}: {detail}",
            hint=hint
            or "check that the server is running and reachable at that host and port, that the "
            "user, password (in the URL or PGPASSWORD) and database name are right, and that "
            "pg_hba.conf lets this host in; set the URL with --db, TRACEDB_DB_URL or [store] db_url",
        )
        self.target = target
        self.detail = detail


class StoreClosedError(TraceDBError):
    """A call on a store that was closed."""

    code = "closed"

    def __init__(self, what: str = "the store"):
        super().__init__(f"{what} is closed", hint="open it again with tracedb.open(data_dir)")


class UsageError(TraceDBError):
    """The API used the wrong way (a blocking call inside a running event loop, ...)."""

    code = "usage"


class AmbiguousExecutionIdError(TraceDBError):
    """An execution id prefix that matches more than one execution (exit 2, a usage error)."""

    code = "ambiguous_execution"
    exit_code = EXIT_USAGE

    def __init__(self, prefix: str, candidates: "list[str]", more: bool):
        shown = ", ".join(candidates) + (", ..." if more else "")
        super().__init__(
            f"execution id prefix {prefix!r} matches more than one execution: {shown}",
            hint="give more characters of the id",
        )
        self.prefix = prefix
        self.candidates = tuple(candidates)


# -- errors of the backup, the compactor process, the sidecar and the IntentusNet adapter --------


class BackupError(TraceDBError):
    """A backup or restore that cannot be made as asked."""

    code = "backup"


class BackupDestinationError(BackupError):
    """A destination the command refuses before writing anything: a usage error (exit 2)."""

    exit_code = EXIT_USAGE


class WorkerGoneError(TraceDBError):
    """The compactor process exited or stopped answering; the recorder compacts in-process."""

    code = "compactor_gone"


class SidecarError(TraceDBError):
    """An error response of the sidecar without a more specific class; `code` is the wire code."""

    def __init__(self, code: str, message: str, *, hint: Optional[str] = None):
        super().__init__(message, hint=hint)
        self.code = code


class RecorderUnavailableError(RecordingFailedError):
    """The recorder could not be reached (or kept refusing) within `reconnect_timeout_s`."""

    code = "unavailable"


class OutcomeUnknownError(RecorderUnavailableError):
    """The connection failed after an `event` or `finish` without `seq` was sent: it may or may
    not be recorded, and resending it could record it twice."""


class SeqConflictError(InvalidInputError):
    """The event's expected seq does not fit the execution (another writer, or a skipped seq)."""

    code = "seq_conflict"


class ServerConfigError(TraceDBError):
    """The server was asked to listen somewhere it must not (or cannot)."""

    code = "config"


class RecordNotFoundError(ExecutionNotFoundError, FileNotFoundError):
    """No such execution (the IntentusNet adapter, tracedb.interop). Also a FileNotFoundError,
    which is what IntentusNet's code catches around `ExecutionStore.load` (its FileExecutionStore
    raises that)."""
