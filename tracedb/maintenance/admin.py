"""Maintenance of a data directory: what the `tracedb` commands other than the reads run.

Each call takes a `Config`. prune, pin, unpin, invalidate, migrate and the WAL scan work without
the WAL's lock, so they run next to a recorder; compact, recover, fork without a recorder, import
and WAL repair take it (StoreInUseError, exit 5, while a recorder runs). Execution ids are taken
by unique prefix, as the reads take them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import sqlalchemy as sa
import wal

from tracedb.maintenance import verify_store as damage
from tracedb.projection import db
from tracedb.maintenance import retention
from tracedb.reads import sqlite as sqlite_reads
from tracedb.maintenance import wal_repair as salvaging
from tracedb.config import Config
from tracedb.errors import (
    EXIT_ERROR,
    EXIT_INTEGRITY,
    ArgumentError,
    ExecutionNotFoundError,
    InvalidInputError,
    StoreInUseError,
    StoreNotFoundError,
    TraceDBError,
    file_error,
    path_exists,
)
from tracedb.reads.reader import Reader, missing_seqs
from tracedb.records.record import STATUS_INVALIDATED, STATUS_RUNNING
from tracedb.replay.exact import record_problems
from tracedb.maintenance.verify import VerifyResult
from tracedb.maintenance.recovery import RecoverResult
from tracedb.replay.forking import Fork, check_fork_point, fork as fork_execution
from tracedb.maintenance.retention import PruneResult
from tracedb.imports import on_first_use
from tracedb.projection.models import compaction_checkpoint as cp
from tracedb.reads.wal_tail import recorder_id_of
from tracedb.recorder.store import Store
from tracedb.sidecar.client import Client, resolve_sidecar

if TYPE_CHECKING:
    from tracedb.interop import intentusnet
    from tracedb.interop.intentusnet import ImportResult
else:
    # Lazy seam (`tracedb.imports`): the IntentusNet adapter loads IntentusNet's own package,
    # which only `tracedb import intentusnet` needs.
    intentusnet = on_first_use("tracedb.interop.intentusnet")

Progress = Optional[Callable[[int, int], None]]

# How many of the executions left running `verify`'s note names (its JSON lists every one).
LEFT_RUNNING_SHOWN = 3


@dataclass(frozen=True)
class Failure:
    """How the command line reports an error: message, hint, exit code."""

    message: str
    hint: Optional[str]
    exit_code: int


def failure_of(error: BaseException, config: Optional[Config] = None) -> Optional[Failure]:
    """The report of a tracedb or WAL error (a damaged WAL exits 4), or of a database file SQLite
    cannot read (exit 4, naming the file and, with `config`, how to rebuild it); None for any
    other error."""
    if damage.is_damaged_database(error):
        if config is None or db.is_url(config.database):
            return Failure(f"the database is damaged: {getattr(error, 'orig', error)}", None, EXIT_INTEGRITY)
        error = damage.damaged_database_error(config, error)
    if isinstance(error, TraceDBError):
        return Failure(error.message, error.hint, error.exit_code)
    if isinstance(error, wal.WalError):
        code = EXIT_INTEGRITY if isinstance(error, wal.WalCorruptionError) else EXIT_ERROR
        return Failure(error.message, error.hint, code)
    if config is not None and not db.is_url(config.database):
        named = sqlite_reads.access_error(config.database, error, config.data_dir)
        if named is not None:
            return failure_of(named)
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        if config is not None and _inside(str(error.filename), config):
            # A file of the store itself: which one, and what to run (its owner, its mode).
            return failure_of(file_error(error, config.data_dir))
        # A file a command was told to read or write (an output path, a backup directory).
        return Failure(f"{error.filename}: {error.strerror}", "check the path and its permissions", EXIT_ERROR)
    return None


def _inside(path: str, config: Config) -> bool:
    """Whether `path` is the data directory, its database, or under either's directory."""
    path = os.path.abspath(path)
    places = {os.path.abspath(config.data_dir), os.path.abspath(config.wal_dir)}
    if not db.is_url(config.database):
        places.add(os.path.dirname(os.path.abspath(config.database)))
    return any(path == p or path.startswith(p + os.sep) for p in places)


def recorder_running(config: Config) -> bool:
    """True while a recorder holds the data directory's WAL."""
    return wal.is_locked(config.wal_dir)


def recovery_note(config: Config, reader: Reader) -> Optional[str]:
    """A note for the user when what they read is not in the database yet: no recorder runs,
    and the read showed WAL records not compacted, or executions left running as incomplete
    (`tracedb.reads.wal_tail`). None otherwise."""
    return reader.pending.note()


def verify_store(config: Config, execution_id: Optional[str] = None) -> damage.Checkup:
    """Check everything: the traces and the database file (SQLite's integrity check), and,
    for the whole store, the WAL (damage, records not compacted, executions left running with
    no recorder). A damaged database file is reported in the result, not raised."""
    path = None if db.is_url(config.database) else config.database
    traces_result = None
    db_problems: tuple = ()
    db_hint = None
    applied = None
    uncompacted = 0
    left: tuple = ()
    try:
        with Reader.open(config) as reader:
            try:
                traces_result = reader.verify(execution_id)
            except ExecutionNotFoundError:
                eid = reader.resolve(execution_id)
                if eid not in reader.pending.rows:
                    raise
                # Only in the WAL (no recorder compacted it): the record's own checks.
                record = reader.get(eid)
                problems = [f"{eid}: {p}" for p in record_problems(record)]
                problems += [f"{eid}: event seq {s} is missing" for s in missing_seqs(record)]
                traces_result = VerifyResult(1, len(record.events), tuple(problems))
                notes = (f"{eid} is only in the WAL (not compacted yet): `tracedb recover` applies it",)
                return damage.Checkup(traces_result, notes=notes, database_path=path)
            except Exception as e:  # noqa: BLE001 - a damaged file is reported, the WAL still checked
                if not damage.is_damaged_database(e):
                    raise
                err = damage.damaged_database_error(config, e)
                db_problems, db_hint = _database_problems(reader, err.message), err.hint
            if execution_id is None and not db_problems:
                p = reader.pending
                applied, uncompacted = (p.applied_lsn, p.uncompacted_records) if os.path.isdir(config.wal_dir) else (None, 0)
                if applied is not None and wal.is_locked(config.wal_dir):
                    applied = None  # a recorder compacts as it goes: no one figure to report
                left = p.left_running
    except Exception as e:  # noqa: BLE001
        if not damage.is_damaged_database(e):
            raise
        err = damage.damaged_database_error(config, e)
        db_problems, db_hint = (err.message,), err.hint
    if execution_id is not None or not os.path.isdir(config.wal_dir):
        return damage.Checkup(traces_result, db_problems, db_hint, applied_lsn=applied, database_path=path)
    try:
        w = scan_wal(config)
    except wal.WalError as e:
        bad = WalDamage(os.path.basename(getattr(e, "path", config.wal_dir) or config.wal_dir),
                        getattr(e, "offset", 0) or 0, "a readable WAL", e.message, False, False)
        return damage.Checkup(traces_result, db_problems, db_hint, applied_lsn=applied, wal_damages=(bad,),
                              database_path=path)
    notes = []
    if uncompacted:
        notes.append(f"{uncompacted} WAL record(s) are not compacted yet: `tracedb recover` applies them")
    if left:
        shown = ", ".join(left[:LEFT_RUNNING_SHOWN]) + (", ..." if len(left) > LEFT_RUNNING_SHOWN else "")
        notes.append(f"{len(left)} execution(s) were left running with no recorder ({shown}): `tracedb recover` "
                     "marks them incomplete")
    for d in w.damages:
        if d.corruption:
            notes.append(f"WAL damage in {d.segment} at offset {d.offset}: `tracedb wal repair --dry-run` "
                         "says what a repair would keep and drop")
            break
    tails = salvaging.kept_tails(config)
    notes += [damage.kept_tail_note(t) for t in tails if not t.not_in_database]
    return damage.Checkup(
        traces_result, db_problems, db_hint, w.records, w.first_lsn, w.last_lsn, applied, w.damages, w.live,
        uncompacted, left, tuple(notes), path, tails,
    )


def _database_problems(reader: Reader, first: str) -> tuple[str, ...]:
    """`first`, then SQLite's integrity check of a file that failed a read, as far as it runs."""
    out = [first]
    try:
        with reader.engine.connect() as conn:
            rows = [r[0] for r in conn.exec_driver_sql("PRAGMA integrity_check(20)").fetchall()]
        out.extend(f"sqlite integrity_check: {r}" for r in rows if r != "ok")
    except Exception as e:  # noqa: BLE001 - the check itself may not get far in a damaged file
        out.append(f"sqlite integrity_check could not run: {getattr(e, 'orig', e)}")
    return tuple(out)


def rebuild(config: Config, *, partial: bool = False, progress: Progress = None) -> damage.Rebuilt:
    """Move a damaged SQLite file aside and compact a new one from the WAL (see tracedb.maintenance.verify_store)."""
    return damage.rebuild(config, partial=partial, open_store=lambda cfg: _open_store(cfg, progress))


def _require_data_dir(config: Config) -> None:
    """Maintenance never makes a data directory out of a typo: a missing one is not found (one
    hidden by permissions is the error that says so)."""
    if not path_exists(config.data_dir, config.data_dir) or not os.path.isdir(config.data_dir):
        raise StoreNotFoundError(config.data_dir)


def _require_wal_dir(config: Config) -> None:
    if not path_exists(config.wal_dir, config.data_dir) or not os.path.isdir(config.wal_dir):
        raise StoreNotFoundError(config.wal_dir)


def _open_store(config: Config, progress: Progress = None, *, doing: Optional[str] = None) -> Store:
    """The store, for this process's one job; `doing`: the command, named in the hint when a
    running recorder holds the data directory."""
    _require_data_dir(config)
    # No background threads: this process does one job and closes the store.
    try:
        return Store(
            config.replace(compact_interval_ms=0, idle_timeout_s=0), recovery_progress=progress, warn_if_shared=False
        )
    except StoreInUseError as e:
        if doing is None:
            raise
        raise StoreInUseError(
            e.message, hint=f"the running recorder does this itself: it compacts continuously and recovers "
            f"when it starts. To run `tracedb {doing}` yourself, stop the recorder first",
        ) from None


@dataclass(frozen=True)
class CompactReport:
    """What `compact` applied: WAL records, executions recovery marked incomplete, the LSN reached."""

    records: int
    marked_incomplete: int
    applied_lsn: int


def compact(config: Config, progress: Progress = None) -> CompactReport:
    """Apply every durable WAL record to the database now (a running recorder does it itself)."""
    # Opening recovers, which compacts everything durable; compact() then finds the rest.
    store = _open_store(config, progress, doing="compact")
    try:
        result = store.compact(progress=progress)
        opened = store.last_recovery
        applied = store.applied_lsn
    finally:
        store.close()
    return CompactReport(result.records + opened.compacted_records, opened.marked_incomplete, applied)


def recover(config: Config, progress: Progress = None) -> RecoverResult:
    """Repair a torn WAL tail, compact, mark unfinished executions incomplete; retry nothing."""
    try:
        store = _open_store(config, progress, doing="recover")
    except wal.WalCorruptionError as e:
        moved = _moved_aside(e.path)
        if moved is None:
            raise
        # The damage lies after every record of the segment (its SEAL): the records were applied,
        # and the log moved the segment aside before the reader reached its end.
        raise e.with_hint(
            f"every record in it was applied before the damage was found, and it was moved out of "
            f"the log as {moved}: run `tracedb recover` again, which goes on after it"
        ) from None
    try:
        return store.last_recovery
    finally:
        store.close()


def _moved_aside(path: str) -> Optional[str]:
    """The `.broken` copy the log moved the segment `path` aside to (the newest, when there are
    several), if the segment is gone; else None."""
    if os.path.exists(path):
        return None
    copies = [path + ".broken"]
    while os.path.exists(copies[-1]):
        copies.append(f"{path}.broken.{len(copies)}")
    return copies[-2] if len(copies) > 1 else None


def prune(
    config: Config, older_than_s: Optional[float] = None, *, dry_run: bool = False, progress: Progress = None
) -> PruneResult:
    """Delete terminal, unpinned traces older than `older_than_s` (default: the retention days)."""
    seconds = config.retention_days * 86400.0 if older_than_s is None else older_than_s
    engine = db.open_store_engine(config.database, busy_timeout_ms=config.busy_timeout_ms, write=True)
    try:
        return retention.prune(
            engine, seconds, now_ns=time.time_ns(), dry_run=dry_run,
            batch_traces=config.prune_batch_traces, progress=progress,
            outside_parents=retention.UncompactedForks(config.wal_dir, _applied_lsn(config, engine)),
        )
    finally:
        engine.dispose()


def _applied_lsn(config: Config, engine) -> int:
    """This data directory's recorder's applied LSN (0 when it has compacted nothing yet)."""
    recorder_id = recorder_id_of(config)
    if not recorder_id:
        return 0
    with engine.connect() as conn:
        q = sa.select(cp.c.applied_lsn).where(cp.c.recorder_id == recorder_id)
        return int(conn.execute(q).scalar() or 0)


def _resolve_in_database(config: Config, engine, execution_id: str) -> str:
    """The full id of the execution `execution_id` names in the database. One that only the WAL
    holds (no recorder ran since it was recorded) is an error that says to recover first: a
    change written to the database now would be overwritten when its records are compacted."""
    try:
        return Reader(engine).resolve(execution_id)
    except ExecutionNotFoundError:
        with Reader.open(config) as reader:
            try:
                full_id = reader.resolve(execution_id)
            except ExecutionNotFoundError:
                raise
            if full_id in reader.pending.rows:
                raise ExecutionNotFoundError(
                    full_id,
                    hint="it is only in the WAL, not compacted yet: run `tracedb recover` (or start "
                    "`tracedb serve`), then try again",
                ) from None
            raise


def _recorder_address(config: Config) -> Optional[str]:
    """The local socket of the recorder holding this data directory, if one is running."""
    if not recorder_running(config):
        return None
    return resolve_sidecar(None, config.data_dir)


def set_pinned(config: Config, execution_id: str, pinned: bool) -> str:
    """Pin (prune never deletes it) or unpin an execution; returns its full id."""
    engine = db.open_store_engine(config.database, busy_timeout_ms=config.busy_timeout_ms, write=True)
    try:
        full_id = _resolve_in_database(config, engine, execution_id)
        retention.set_pinned(engine, full_id, pinned)
    finally:
        engine.dispose()
    return full_id


@dataclass(frozen=True)
class Invalidated:
    """The execution's full id, and False if it was invalidated already."""

    execution_id: str
    changed: bool


def invalidate(config: Config, execution_id: str, reason: str) -> Invalidated:
    """Mark an execution invalidated (not replayable, manually_invalidated). Next to a running
    recorder, through it: it refuses the execution's next event at once. Without one, in the
    database."""
    address = _recorder_address(config)
    if address is not None:
        return _invalidate_through(address, config, execution_id, reason)
    engine = db.open_store_engine(config.database, busy_timeout_ms=config.busy_timeout_ms, write=True)
    try:
        full_id = _resolve_in_database(config, engine, execution_id)
        changed = retention.invalidate_in_db(engine, full_id, reason, time.time_ns())
    finally:
        engine.dispose()
    return Invalidated(full_id, changed)


def _invalidate_through(address: str, config: Config, execution_id: str, reason: str) -> Invalidated:
    with Client(address, data_dir=config.data_dir) as client:
        try:
            with Reader.open(config) as reader:
                full_id = reader.resolve(execution_id)
        except ExecutionNotFoundError:
            full_id = execution_id  # recorded a moment ago: the recorder knows it by its whole id
        if client.get(full_id).status == STATUS_INVALIDATED:
            return Invalidated(full_id, False)
        client.invalidate(full_id, reason)
    return Invalidated(full_id, True)


@dataclass(frozen=True)
class Migrated:
    """The schema revision before (None: an empty database) and after."""

    before: Optional[str]
    after: Optional[str]


def migrate(config: Config) -> Migrated:
    """Create or upgrade the database schema; a SQLite file's directory is made when missing
    (creating a store is what `migrate` is asked for)."""
    if not db.is_url(config.database):
        try:
            wal.fs.make_dirs(wal.OsFileSystem(), os.path.dirname(os.path.abspath(config.database)))
        except OSError as e:
            raise file_error(e, config.data_dir) from None
    engine = db.create_engine(config.database, busy_timeout_ms=config.busy_timeout_ms, write=True)
    try:
        before = db.migrate(engine)
        return Migrated(before, db.current_revision(engine))
    finally:
        engine.dispose()


@dataclass(frozen=True)
class WalDamage:
    """A damaged place in the WAL; `live_tail`: where a running recorder may be writing."""

    segment: str
    offset: int
    expected: str
    found: str
    torn_tail: bool
    live_tail: bool

    @property
    def corruption(self) -> bool:
        """Neither the torn tail of an unacknowledged group nor a recorder's write in progress."""
        return not self.torn_tail and not self.live_tail


@dataclass(frozen=True)
class WalReport:
    """What a scan of the whole WAL found; `live`: a recorder was appending meanwhile."""

    records: int
    first_lsn: Optional[int]
    last_lsn: int
    segments: int
    live: bool
    damages: tuple[WalDamage, ...]

    @property
    def corrupt(self) -> bool:
        return any(d.corruption for d in self.damages)


def scan_wal(config: Config) -> WalReport:
    """Read the whole WAL and report records, LSNs and damage, without its lock (read-only)."""
    _require_wal_dir(config)
    live = os.path.isdir(config.wal_dir) and recorder_running(config)
    for attempt in range(3):
        try:
            r = wal.scan(config.wal_dir, mode="point_in_time")
            break
        except (FileNotFoundError, wal.WalCorruptionError):
            # The running recorder deleted a compacted segment, or renamed a new one in, while
            # the scan listed the directory: scan again. Without a recorder, damage is damage.
            if not live or attempt == 2:
                raise
    # With a live writer, the end of the log may be a group being written, or a segment being
    # sealed as the scan reached it: damage there is not judged.
    live_tail = {s.path for s in wal.list_segments(config.wal_dir)[-2:]} if live else set()
    damages = tuple(
        WalDamage(os.path.basename(d.path), d.offset, d.expected, d.found, d.torn_tail, d.path in live_tail)
        for d in r.damages
    )
    return WalReport(r.records, r.first_lsn, r.last_lsn, r.segments, live, damages)


def repair_wal(config: Config, *, dry_run: bool = False, salvage: bool = False) -> salvaging.RepairReport:
    """Cut the WAL at its first damage keeping .broken copies, or with `salvage` keep every
    record with a valid CRC (tracedb.maintenance.wal_repair); `dry_run` says what it would do, read-only and
    without the lock, next to a recorder too. The repair itself needs the recorder stopped."""
    _require_wal_dir(config)
    try:
        if salvage:
            return salvaging.salvage(config, dry_run=dry_run, open_store=_open_store)
        return salvaging.repair(config, dry_run=dry_run)
    except wal.WalLockedError as e:
        raise StoreInUseError(e.message, hint="stop the recorder first") from None


@dataclass(frozen=True)
class Forked:
    """The fork made, and whether a running recorder holds it open (`live`)."""

    fork: Fork
    live: bool


def fork(
    config: Config, execution_id: str, at_seq: int, *, new_execution_id: Optional[str] = None,
    token: Optional[str] = None,
) -> Forked:
    """Fork an execution at `at_seq`: through the data directory's running recorder, which keeps
    the fork open, or recorded in-process and closed as incomplete when none runs."""
    try:
        with Reader.open(config) as reader:
            execution_id = reader.resolve(execution_id)
            parent = reader.get(execution_id)
    except ExecutionNotFoundError:
        parent = None  # maybe recorded a moment ago and not compacted yet: the recorder knows it
    if parent is not None and parent.status != STATUS_RUNNING:
        # A closed execution has all its events: a fork point it lacks is a mistake in the
        # command (exit 2). A running one may have more than the database shows yet.
        try:
            check_fork_point(parent, at_seq)
        except InvalidInputError as e:
            raise ArgumentError(e.message, hint=e.hint) from None
    address = resolve_sidecar(None, config.data_dir)
    if address is not None:
        with Client(address, token=token, data_dir=config.data_dir) as client:
            return Forked(fork_execution(client, execution_id, at_seq, new_execution_id=new_execution_id), True)
    store = _open_store(config)
    try:
        return Forked(fork_execution(store, execution_id, at_seq, new_execution_id=new_execution_id), False)
    finally:
        store.close()


def import_intentusnet(config: Config, directory: str, *, workers: int = 8, progress: Progress = None) -> ImportResult:
    """Import an IntentusNet FileExecutionStore directory through the WAL; nothing twice."""
    try:
        # The idle sweeper stays off: it must not mark an import in progress incomplete.
        store = Store(config.replace(idle_timeout_s=0), warn_if_shared=False)
    except StoreInUseError as e:
        raise StoreInUseError(
            e.message,
            hint="stop the recorder first, or import through another data directory (--data-dir) "
            "that compacts into the same database (--db)",
        ) from None
    try:
        return intentusnet.import_directory(store, directory, workers=workers, progress=progress)
    finally:
        store.close()
