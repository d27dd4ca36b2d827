"""Finding damage anywhere in a data directory, and rebuilding a damaged database from the WAL.

`check` is what `tracedb verify` runs: the traces (envelope hashes, event order, lifecycle), the
database's own integrity check, and the WAL (damage, records not compacted yet, executions left
running with no recorder). A database file that SQLite cannot read is reported, not raised: the
WAL is checked all the same.

A damaged SQLite file is a projection that can be made again when the WAL still holds every
record from LSN 1 (`rebuild`, `tracedb recover --rebuild`): the file is moved aside, never
deleted, and a new one is compacted from the WAL. Once the recorder has deleted compacted
segments, the records below the WAL's first LSN exist only in the file (or a backup), and the
error says so.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from typing import Optional

import sqlalchemy as sa

import wal

from tracedb.projection import db
from tracedb.config import Config
from tracedb.errors import (
    DatabaseDamagedError,
    IntegrityError,
    StoreInUseError,
    StoreNotFoundError,
    TraceDBError,
    UsageError,
)
from tracedb.projection.models import compaction_checkpoint
from tracedb.reads.reader import Reader
from tracedb.reads.wal_tail import recorder_id_of
from tracedb.maintenance.verify import VerifyResult

# What SQLite says of a file it cannot read as a database.
_DAMAGE_MARKERS = ("malformed", "not a database", "file is encrypted", "disk image")


def is_damaged_database(error: BaseException) -> bool:
    """True for SQLite's error of a damaged file (raised directly or wrapped by SQLAlchemy)."""
    orig = getattr(error, "orig", error)
    if not isinstance(orig, sqlite3.DatabaseError) or isinstance(orig, sqlite3.OperationalError):
        return False
    text = str(orig).lower()
    return any(m in text for m in _DAMAGE_MARKERS)


@dataclass(frozen=True)
class WalCoverage:
    """Which LSNs the WAL still holds: `complete` when it starts at LSN 1."""

    first_lsn: Optional[int]
    last_lsn: int
    complete: bool


def wal_coverage(config: Config) -> WalCoverage:
    """What the data directory's WAL holds (read-only, without its lock)."""
    if not os.path.isdir(config.wal_dir) or not wal.list_segments(config.wal_dir):
        return WalCoverage(None, 0, False)
    r = wal.scan(config.wal_dir, mode="point_in_time")
    first = r.first_lsn if r.first_lsn is not None else wal.list_segments(config.wal_dir)[0].first_lsn
    complete = (
        wal.list_segments(config.wal_dir)[0].first_lsn == 1
        and wal.read_applied_lsn(config.wal_dir) <= 1
        and not any(not d.torn_tail for d in r.damages)
    )
    return WalCoverage(first, r.last_lsn, complete)


def kept_tail_note(tail) -> str:
    """The note `verify` gives a kept torn tail whose records are all in the database (or that
    holds none): evidence, not a loss."""
    held = f"its {tail.records} record(s) with a valid CRC are in the database" if tail.records else "no record in it has a valid CRC"
    return (
        f"WAL tail kept in {tail.file}: bytes cut as a torn tail when the log opened; {held} "
        "(the file is evidence: it is never deleted by tracedb)"
    )


def damaged_database_error(config: Config, error: BaseException) -> DatabaseDamagedError:
    """The error for a damaged database file, with what to do: rebuild it from the WAL where the
    WAL holds every record, else restore it, naming what only the file held."""
    path = config.database
    detail = str(getattr(error, "orig", error))
    try:
        cover = wal_coverage(config)
    except (OSError, wal.WalError):
        cover = WalCoverage(None, 0, False)
    if cover.complete:
        hint = (
            f"the WAL still holds every record (LSN 1..{cover.last_lsn}): stop the recorder and run "
            "`tracedb recover --rebuild`, which moves the damaged file aside and rebuilds the "
            "database from the WAL"
        )
    elif cover.first_lsn is not None:
        hint = (
            f"the WAL holds only LSN {cover.first_lsn}..{cover.last_lsn}: the records below "
            f"{cover.first_lsn} were compacted and exist only in this file. Restore it from a backup "
            "(see `tracedb restore --help`; `tracedb recover` then applies the WAL on top); `tracedb recover "
            "--rebuild --partial` rebuilds from the WAL alone, without those records"
        )
    else:
        hint = "restore it from a backup (see `tracedb restore --help`): the data directory has no WAL to rebuild it from"
    return DatabaseDamagedError(path, detail, hint=hint)


@dataclass(frozen=True)
class Rebuilt:
    """Where the damaged file went, and what the new database was compacted from."""

    moved_to: tuple[str, ...]
    first_lsn: Optional[int]
    applied_lsn: int
    records: int
    marked_incomplete: int


def _aside(path: str) -> str:
    dst = path + ".damaged"
    n = 0
    while os.path.exists(dst):
        n += 1
        dst = f"{path}.damaged.{n}"
    return dst


def rebuild(config: Config, *, partial: bool = False, open_store=None) -> Rebuilt:
    """Move the SQLite file aside (with its -wal and -shm) and compact a new one from the WAL.

    Refused (IntegrityError, exit 4) when the WAL no longer starts at LSN 1, unless `partial`:
    then the new database holds what the WAL holds, and the error said what it lacks.
    `open_store(config)` opens the store that recovers (the caller's; it takes the lock). If
    that fails, the error (a TraceDBError) says where the files are: the damaged one kept aside,
    the new one holding what was compacted before the failure."""
    if db.is_url(config.database):
        raise UsageError(
            "--rebuild makes a new SQLite file; a server database is rebuilt by its own tools",
            hint="restore the server database from its backup; `tracedb recover` then applies the WAL",
        )
    if not os.path.isdir(config.data_dir):
        raise StoreNotFoundError(config.data_dir)
    if os.path.isdir(config.wal_dir) and wal.is_locked(config.wal_dir):
        raise StoreInUseError(
            f"data directory {config.data_dir} is in use by a running recorder", hint="stop the recorder first"
        )
    cover = wal_coverage(config)
    if cover.first_lsn is None and not cover.complete:
        raise IntegrityError(
            f"the data directory {config.data_dir} has no WAL records to rebuild the database from",
            hint="restore the database from a backup (see `tracedb restore --help`)",
        )
    if not cover.complete and not partial:
        raise IntegrityError(
            f"the WAL holds only LSN {cover.first_lsn}..{cover.last_lsn}: a database rebuilt from it "
            f"lacks every record below {cover.first_lsn}",
            hint="restore the database from a backup instead (see `tracedb restore --help`), or accept the loss "
            "with `tracedb recover --rebuild --partial`",
        )
    moved = []
    path = config.database
    target = _aside(path)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, target + suffix)
            moved.append(target + suffix)
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if not cover.complete:
        # The new database starts its checkpoint below the WAL's first record, and the WAL's
        # APPLIED mark comes down to that record: every record the WAL holds is applied again.
        _start_checkpoint(config, cover.first_lsn - 1)
        if wal.read_applied_lsn(config.wal_dir) > cover.first_lsn:
            wal.fs.write_file_atomic(
                wal.OsFileSystem(), config.wal_dir, wal.reader.APPLIED_FILE, f"{cover.first_lsn}\n".encode()
            )
    try:
        store = open_store(config)
    except TraceDBError as e:
        e.hint = f"{e.hint}; {_left_as(config, moved)}" if e.hint else _left_as(config, moved)
        raise
    except Exception as e:  # noqa: BLE001 - said with where the rebuild left the files
        raise TraceDBError(
            f"the rebuild stopped: {getattr(e, 'orig', None) or e}", hint=_left_as(config, moved)
        ) from e
    try:
        r = store.last_recovery
        applied = store.applied_lsn
    finally:
        store.close()
    return Rebuilt(tuple(moved), cover.first_lsn, applied, r.compacted_records, r.marked_incomplete)


def _left_as(config: Config, moved: list) -> str:
    """Where a rebuild that stopped left the files."""
    kept = f"the damaged file is kept as {moved[0]}; " if moved else ""
    return (
        f"{kept}{config.database} holds what was compacted before it stopped: once the cause is fixed, "
        "`tracedb recover` goes on from there (`tracedb recover --rebuild` starts over, moving it aside too)"
    )


def _start_checkpoint(config: Config, applied_lsn: int) -> None:
    engine = db.create_engine(config.database, busy_timeout_ms=config.busy_timeout_ms, write=True)
    try:
        db.migrate(engine)
        rid = recorder_id_of(config)
        if not rid:
            return
        with engine.begin() as conn:
            conn.execute(sa.delete(compaction_checkpoint).where(compaction_checkpoint.c.recorder_id == rid))
            conn.execute(sa.insert(compaction_checkpoint).values(recorder_id=rid, applied_lsn=applied_lsn, updated_at_ns=0))
    finally:
        engine.dispose()


@dataclass(frozen=True)
class Checkup:
    """What `tracedb verify` found: the traces, the database file, the WAL."""

    traces: Optional[VerifyResult]
    database_problems: tuple[str, ...] = ()
    database_hint: Optional[str] = None
    wal_records: int = 0
    wal_first_lsn: Optional[int] = None
    wal_last_lsn: int = 0
    applied_lsn: Optional[int] = None
    wal_damages: tuple = ()  # admin.WalDamage
    wal_live: bool = False
    uncompacted_records: int = 0
    left_running: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    database_path: Optional[str] = None
    kept_tails: tuple = ()  # salvage.KeptTailReport: torn tails the writer cut and kept

    @property
    def problems(self) -> tuple[str, ...]:
        """Every problem: of the traces, of the database file, WAL corruption, and kept torn
        tails holding records the database lacks."""
        out = list(self.traces.problems if self.traces is not None else ())
        out.extend(self.database_problems)
        out.extend(
            f"WAL {d.segment} at offset {d.offset}: expected {d.expected}, found {d.found}"
            for d in self.wal_damages if d.corruption
        )
        out.extend(
            f"WAL tail kept in {t.file} holds {t.not_in_database} record(s) with a valid CRC that the "
            "database lacks: `tracedb wal repair --salvage` applies them"
            for t in self.kept_tails if t.not_in_database
        )
        return tuple(out)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        t = self.traces
        return {
            "ok": self.ok,
            "checked_traces": t.checked_traces if t else 0,
            "checked_steps": t.checked_steps if t else 0,
            "problems": list(self.problems),
            "database": {
                "path": self.database_path, "ok": not self.database_problems, "problems": list(self.database_problems),
                "hint": self.database_hint,
            },
            "wal": {
                "records": self.wal_records, "first_lsn": self.wal_first_lsn, "last_lsn": self.wal_last_lsn,
                "applied_lsn": self.applied_lsn, "uncompacted_records": self.uncompacted_records,
                "live": self.wal_live,
                "damages": [
                    {"path": d.segment, "offset": d.offset, "expected": d.expected, "found": d.found,
                     "torn_tail": d.torn_tail, "live_tail": d.live_tail, "corruption": d.corruption}
                    for d in self.wal_damages
                ],
                "kept_tails": [t.to_dict() for t in self.kept_tails],
            },
            "left_running": list(self.left_running),
            "notes": list(self.notes),
        }
