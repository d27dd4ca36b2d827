"""What a read sees beyond the projection: WAL records not compacted yet, and executions that no
recorder will ever finish.

The database is a projection of the WAL. While a recorder runs it compacts within its interval,
and reads go to the database alone. When none runs (it crashed, or was stopped before it
compacted), the WAL may hold acknowledged records the database has not seen, and executions the
database calls `running` have nobody recording them. A read then shows the state recovery will
make permanent: the records above the applied LSN folded in exactly as the compactor folds them,
and every execution of this data directory still running read as incomplete (not replayable,
`execution_incomplete`, or `recording_failure` kept when it was flagged so). Nothing is written and no lock is taken: `tracedb recover` makes it so.

Only the WAL above the database's applied LSN is read (from the segment that holds it); a store
that is all compacted costs one read of the end of its last segment (`wal.last_record_lsn`).
"""

from __future__ import annotations

import errno
import os
import sqlite3
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Optional, Union

import orjson

import wal
from wal.dir_lock import LOCK_FILE

from tracedb.imports import on_first_use
from tracedb.reads import sqlite as sqlite_reads
from tracedb.config import Config
from tracedb.errors import file_error, path_exists
from tracedb.records.fold import STEP_WIDTH, close_left_running, fold, read_record
from tracedb.records.record import STATUS_RUNNING

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from tracedb.reads import sql as read_sql
else:
    # Lazy seam (`tracedb.imports`): SQLAlchemy, for a database `reads.sqlite` does not serve.
    read_sql = on_first_use("tracedb.reads.sql")

# What a read says of an execution left running with no recorder (the status note).
NO_RECORDER_NOTE = "no recorder is running; `tracedb recover` marks it incomplete"


def recorder_id_of(config: Config) -> str:
    """The recorder id of the data directory (its RECORDER_ID file), '' when it has none yet.
    A file this process may not read is an error (`tracedb.errors.file_error`): without the id,
    another recorder's rows would be taken for this one's."""
    if config.recorder_id:
        return config.recorder_id
    try:
        with open(os.path.join(config.data_dir, "RECORDER_ID"), encoding="ascii") as f:
            return f.read().strip()
    except (FileNotFoundError, NotADirectoryError):
        return ""
    except OSError as e:
        raise file_error(e, config.data_dir) from None


def unheld_wal(config: Config) -> bool:
    """Whether the data directory has a WAL that no recorder holds: what it holds beyond the
    database is then the read's to show (a recorder compacts and recovers by itself).

    A WAL directory, or its lock file, that this process may not read is an error
    (`tracedb.errors.file_error`), not "no WAL": a read cannot tell what the log holds beyond
    the database without reading it, and an answer from the database alone would be partial."""
    wal_dir = config.wal_dir
    if not path_exists(wal_dir, config.data_dir):
        return False
    if not os.access(wal_dir, os.R_OK | os.X_OK):
        raise file_error(PermissionError(errno.EACCES, os.strerror(errno.EACCES), wal_dir), config.data_dir)
    try:
        os.close(os.open(os.path.join(wal_dir, LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC))
    except FileNotFoundError:
        return True  # no writer ever opened this log
    except OSError as e:
        raise file_error(e, config.data_dir) from None
    return not wal.is_locked(wal_dir)


class PendingStep(NamedTuple):
    """An event read from the WAL: its payload as the JSON text the recorder wrote."""

    seq: int
    type: str
    payload_json: str
    recorded_at_ns: int
    lsn: int

    @property
    def payload(self):
        return orjson.loads(self.payload_json)


@dataclass
class Pending:
    """The executions whose state differs from the database's, as a read must show them.

    `rows`: execution id -> the whole `traces` row (a dict of its columns) as it reads now.
    `steps`: execution id -> the events read from the WAL, not in the database yet.
    `last_event_at_ns`: execution id -> the time of its last event.
    `replaced`: ids whose database row (and steps) belong to an earlier execution that a start
    in the WAL replaces (`tracedb.records.fold`): `steps` holds the newer execution's steps alone.
    """

    applied_lsn: int = 0
    last_lsn: int = 0
    uncompacted_records: int = 0
    left_running: tuple = ()  # ids of executions left running with no recorder
    damages: tuple = ()
    replaced: tuple = ()
    rows: dict = field(default_factory=dict)
    steps: dict = field(default_factory=dict)
    last_event_at_ns: dict = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.rows)

    def note(self) -> Optional[str]:
        """What a person reading should know, or None when the database is the whole truth."""
        lines = []
        if self.uncompacted_records or self.left_running:
            lines.append(
                f"note: no recorder is running: {self.uncompacted_records} WAL record(s) not compacted "
                f"yet are shown from the WAL, and {len(self.left_running)} execution(s) left running read as "
                "incomplete; `tracedb recover` makes this permanent"
            )
        damaged = [d for d in self.damages if not getattr(d, "torn_tail", False)]
        if damaged:
            d = damaged[0]
            lines.append(
                f"warning: the WAL is damaged in {os.path.basename(d.path)} at offset {d.offset}: the "
                "records after it are not shown; `tracedb verify` reports the damage, `tracedb wal "
                "repair --dry-run` says what a repair would keep, and `--salvage` keeps every intact record"
            )
        return "\n".join(lines) or None


def _failing_segment(wal_dir: str, error: OSError) -> OSError:
    """`error` (a read's, which names no file) with the segment that fails to read again, or
    the WAL directory when none does."""
    for seg in wal.list_segments(wal_dir):
        try:
            fd = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.pread(fd, 1 << 16, 0)
            finally:
                os.close(fd)
        except OSError as e:
            return OSError(e.errno, e.strerror, seg.path)
    return OSError(error.errno, error.strerror, wal_dir)


def load(config: Config, engine: Union[Engine, sqlite3.Connection]) -> Pending:
    """The executions a read must show differently from the database: empty while a recorder
    runs (it compacts and recovers by itself), or when the data directory has no WAL.

    `engine` may also be a sqlite3 connection to the data directory's SQLite file (what
    `tracedb.reads.sqlite` opens): a store that is all compacted is then checked without
    SQLAlchemy."""
    attempts = 3
    while True:
        if not unheld_wal(config):
            return Pending()
        try:
            return _load(config, engine)
        except FileNotFoundError as e:
            # A segment deleted between our look at the lock and our read of it: a recorder
            # started meanwhile and compacted it (the next look sees it), or the log is damaged.
            attempts -= 1
            if not attempts:
                raise file_error(e, config.data_dir) from None


def _load(config: Config, engine: Union[Engine, sqlite3.Connection]) -> Pending:
    lite = isinstance(engine, sqlite3.Connection)
    recorder_id = recorder_id_of(config)
    if not recorder_id:
        if not lite and engine.dialect.name != "sqlite":
            return Pending()  # a shared database: nothing of it is this directory's yet
    applied = sqlite_reads.applied_lsn(engine, recorder_id) if lite else read_sql.applied_lsn(engine, recorder_id)
    if applied is None:
        if recorder_id:
            # This directory's recorder never opened that database (`--db` names another store):
            # its WAL is not that store's to fold in.
            return Pending()
        applied = 0
    records = []
    try:
        last = wal.last_record_lsn(config.wal_dir)
        if last is not None and last <= applied:
            # The log ends at or below the applied LSN (one read of its end): nothing to fold in,
            # and no need to check the segment's records from its start up to the applied one.
            pending = Pending(applied_lsn=applied, last_lsn=applied)
        else:
            reader = wal.WalReader(config.wal_dir, from_lsn=applied + 1, mode="point_in_time")
            for rec in reader.records():
                records.append((rec.lsn, rec.payload))
            pending = Pending(applied_lsn=applied, last_lsn=max(applied, reader.last_lsn),
                              damages=tuple(reader.damages))
    except FileNotFoundError:
        raise  # see load
    except OSError as e:
        # A segment this process may not read (or the disk fails to): what it holds cannot be
        # shown, and a view without it would pass for the whole store.
        raise file_error(e if e.filename else _failing_segment(config.wal_dir, e), config.data_dir) from None
    pending.uncompacted_records = len(records)
    ids = {read_record(raw)[1] for _lsn, raw in records}
    if lite:
        running, rows = sqlite_reads.running_with_rows(engine, recorder_id, ids)
    else:
        running, rows = read_sql.running_with_rows(engine, recorder_id, ids)
    last_at = pending.last_event_at_ns
    for row in rows.values():
        last_at[row["execution_id"]] = row.pop("_last_event_at_ns")
    foreign = frozenset(eid for eid, row in rows.items() if recorder_id and row["recorder_id"] != recorder_id)
    held = frozenset(rows)
    # Folded exactly as the compactor folds them (tracedb.records.fold), into the database's rows.
    f = fold(records, recorder_id, rows, foreign, skip_unknown=True)
    rows.update(f.new)
    changed = {*f.new, *f.upd}
    for eid in f.new:
        last_at[eid] = None
    for i in range(0, len(f.steps), STEP_WIDTH):
        eid, seq, type_, text, t, lsn, _crc = f.steps[i : i + STEP_WIDTH]
        pending.steps.setdefault(eid, []).append(PendingStep(seq, type_, text, t, lsn))
        last_at[eid] = t
    pending.replaced = tuple(sorted(held.intersection(f.restarted)))
    left = []
    for eid, row in rows.items():
        if row["status"] == STATUS_RUNNING and (not recorder_id or row["recorder_id"] == recorder_id):
            close_left_running(row, NO_RECORDER_NOTE)
            left.append(eid)
            changed.add(eid)
    pending.left_running = tuple(sorted(left))
    pending.rows = {eid: rows[eid] for eid in changed}
    pending.last_event_at_ns = {eid: pending.last_event_at_ns.get(eid) for eid in changed}
    return pending
