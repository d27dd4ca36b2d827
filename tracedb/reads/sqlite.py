"""The read API's common reads of a SQLite file, through the sqlite3 module alone.

Finding an execution by id or prefix, a page of executions, what judging that page reads,
one whole record and what the pending view of the WAL needs are a few short queries; loading
SQLAlchemy to build them cost a read command more than all the rest of its work (about 130 ms
of start-up, on any size of store). `tracedb.reads.reader.Reader` reads a SQLite file whose schema is current through these, and
through SQLAlchemy's engine for everything else and for PostgreSQL. The SQL is what the
engine's statements compile to on SQLite (same plans, same indexes); a test holds both paths to
the same results. Values come back as the engine gives them: JSON columns decoded, booleans as
bool.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import urllib.parse
from typing import Iterable, Iterator, Mapping, NamedTuple, Optional, Sequence

import orjson

from tracedb.errors import FileReadError, file_error
from tracedb.projection.checksums import damaged_columns, of_stored
from tracedb.projection.schema import BOOL_COLUMNS, HEAD_REVISION, JSON_COLUMNS, TRACES

# The columns a listing shows, and the time of each execution's last event.
SUMMARY_COLUMNS = (
    "execution_id", "created_at_ns", "updated_at_ns", "intent", "status", "replayable",
    "replayable_reason", "last_seq", "pinned", "parent_execution_id", "outcome", "error_seq",
    "error_type", "error_code", "error_message", "models", "input_tokens", "output_tokens", "cost_usd",
)
_LAST_EVENT_AT = (
    "(SELECT trace_steps.recorded_at_ns FROM trace_steps WHERE trace_steps.execution_id = "
    "traces.execution_id AND trace_steps.seq = traces.last_seq)"
)
_SUMMARY_SQL = ", ".join(f"traces.{c}" for c in SUMMARY_COLUMNS) + f", {_LAST_EVENT_AT} AS last_event_at_ns"
# Every column of `traces` (tracedb.projection.schema).
TRACE_COLUMNS = TRACES
_TRACE_SQL = "SELECT " + ", ".join(TRACE_COLUMNS) + " FROM traces WHERE execution_id = ?"
# What a loaded step reads of `trace_steps`: `checked_step` builds a Step from them by name.
STEP_COLUMNS = ("seq", "type", "payload", "recorded_at_ns", "payload_crc")
_STEPS_SQL = f"SELECT {', '.join(STEP_COLUMNS)} FROM trace_steps WHERE execution_id = ? ORDER BY seq"
_IN_CHUNK = 500  # ids per IN (...) list


class Step(NamedTuple):
    """One stored event: its payload decoded; `intact`: the payload matches its checksum."""

    seq: int
    type: str
    payload: object
    recorded_at_ns: int
    intact: bool = True


def json_value(value):
    """A JSON column's value as SQLite hands it back, decoded. A column declared JSON has
    NUMERIC affinity: a document that is a bare number comes back as that number."""
    if value is None or isinstance(value, (int, float)):
        return value
    return orjson.loads(value)


# SQLite's primary result codes for a file it could not open, write or read.
_CANTOPEN, _READONLY, _IOERR = 14, 8, 10
_CODE_OF_TEXT = (("unable to open database file", _CANTOPEN), ("readonly database", _READONLY),
                 ("disk i/o error", _IOERR))


def _primary_code(error: sqlite3.Error) -> Optional[int]:
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF
    text = str(error).lower()
    return next((c for t, c in _CODE_OF_TEXT if t in text), None)


def _refusing(path: str, write: bool) -> Optional[OSError]:
    """The OSError of the first of the database's directory, the file, its -wal and its -shm
    that refuses what a connection needs of it (`write`: to change the database; else to read
    it), None when none does."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.access(directory, os.X_OK):
        return OSError(errno.EACCES, os.strerror(errno.EACCES), directory)
    if write and os.statvfs(directory).f_flag & os.ST_RDONLY:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), directory)
    if write and not os.access(directory, os.W_OK):
        # Readers need it too: SQLite makes the -wal and -shm files there when they are missing
        # (a recorder's clean stop removes them).
        name = os.path.basename(path)
        return OSError(errno.EACCES, f"{os.strerror(errno.EACCES)} (SQLite makes {name}-wal and {name}-shm there)",
                       directory)
    for name in (path, path + "-wal", path + "-shm"):
        try:
            fd = os.open(name, (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        except OSError as e:
            return e
        try:
            os.pread(fd, 1, 0)
        except OSError as e:
            return OSError(e.errno, e.strerror, name)
        finally:
            os.close(fd)
    return None


def access_error(path: str, error: BaseException, data_dir: Optional[str] = None, *, write: bool = False):
    """For SQLite's error of a file it could not open, write or read (raised by sqlite3, or
    wrapped by SQLAlchemy), the `tracedb.errors.file_error` of the file that refuses (the
    database, its -wal or -shm, or their directory); an I/O error no file shows again names the
    database (FileReadError, exit 4). None for any other error, and when no file refuses (a
    connection that refuses writes by itself, a missing directory)."""
    orig = getattr(error, "orig", None) or error
    if not isinstance(orig, sqlite3.Error):
        return None
    code = _primary_code(orig)
    if code not in (_CANTOPEN, _READONLY, _IOERR):
        return None
    refused = _refusing(path, write or code == _READONLY)
    if refused is not None:
        return file_error(refused, data_dir or os.path.dirname(os.path.abspath(path)))
    if code == _IOERR:
        return FileReadError(os.path.abspath(path), str(orig))
    return None


def connect(path: str, *, busy_timeout_ms: int = 5000) -> Optional[sqlite3.Connection]:
    """A connection to the existing SQLite file `path` that refuses writes, when its schema is at
    the current revision; None when it is not (the engine's path migrates it first). A file it
    may not read is the error `access_error` makes."""
    try:
        return _connect(path, busy_timeout_ms)
    except sqlite3.Error as e:
        err = access_error(path, e)
        if err is None:
            raise
        raise err from None


def read_uri(path: str, *, make_files: bool = False) -> str:
    """The URI a read connection opens the SQLite file `path` with. SQLite itself refuses writes
    (`mode=ro`), unless `make_files`: then it may make the -wal and -shm files a recorder's clean
    stop removed (`mode=rw`), and `open_read` refuses writes with `PRAGMA query_only`."""
    return "file:" + urllib.parse.quote(os.path.abspath(path)) + ("?mode=rw" if make_files else "?mode=ro")


def open_read(path: str, *, timeout_s: float, make_files: bool = False, cached_statements: int = 128) -> sqlite3.Connection:
    """A connection that reads the existing SQLite file `path` and refuses writes: every read of
    tracedb through the sqlite3 module opens its connection here (this module's `connect`, the
    store's `RecordReader`, the sidecar's point lookups; the web view's aiosqlite engine opens
    `read_uri`). Autocommit (a read takes its snapshot with an explicit BEGIN), usable from any
    thread, `timeout_s` to wait on a lock. `make_files`: see `read_uri`. SQLite's errors are
    raised as they are (`access_error` names the file that refuses)."""
    conn = sqlite3.connect(read_uri(path, make_files=make_files), uri=True, timeout=timeout_s, isolation_level=None,
                           check_same_thread=False, cached_statements=cached_statements)
    if make_files:
        try:
            conn.execute("PRAGMA query_only = ON")
        except BaseException:
            conn.close()
            raise
    return conn


def _connect(path: str, busy_timeout_ms: int) -> Optional[sqlite3.Connection]:
    conn = open_read(path, timeout_s=busy_timeout_ms / 1000.0, make_files=True)
    try:
        try:
            revisions = [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]
        except sqlite3.OperationalError as e:
            if "no such table" not in str(e):
                raise
            revisions = []
    except BaseException:
        conn.close()
        raise
    if revisions != [HEAD_REVISION]:
        conn.close()
        return None
    return conn


def exists(conn: sqlite3.Connection, execution_id: str) -> bool:
    """True when the database has the execution `execution_id`."""
    return conn.execute("SELECT 1 FROM traces WHERE execution_id = ?", (execution_id,)).fetchone() is not None


def ids_with_prefix(conn: sqlite3.Connection, prefix: str, limit: int) -> list[str]:
    """Up to `limit` execution ids that start with `prefix`, in order: a range of the primary
    key (exact under SQLite's BINARY collation, which compares UTF-8 bytes: code point order)."""
    if not prefix:
        return []
    if ord(prefix[-1]) == 0x10FFFF:
        sql = "SELECT execution_id FROM traces WHERE substr(execution_id, 1, ?) = ? ORDER BY execution_id LIMIT ?"
        args: tuple = (len(prefix), prefix, limit)
    else:
        sql = "SELECT execution_id FROM traces WHERE execution_id >= ? AND execution_id < ? ORDER BY execution_id LIMIT ?"
        args = (prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1), limit)
    return [r[0] for r in conn.execute(sql, args)]


def _escaped(text: str) -> str:
    return text.replace("/", "//").replace("%", "/%").replace("_", "/_")


def page_rows(
    conn: sqlite3.Connection,
    *,
    status: Optional[str] = None,
    since_ns: Optional[int] = None,
    until_ns: Optional[int] = None,
    intent: Optional[str] = None,
    search: Optional[str] = None,
    replayable: Optional[bool] = None,
    outcome: Optional[str] = None,
    model_json: Optional[str] = None,
    error: Optional[str] = None,
    min_cost: Optional[float] = None,
    slower_than_ns: Optional[int] = None,
    before: Optional[tuple[int, str]] = None,
    limit: int,
    leave_out: Sequence[str] = (),
) -> list[dict]:
    """Up to `limit` listed executions (SUMMARY_COLUMNS and last_event_at_ns), newest first, that
    match every filter given, older than the position `before` (created_at_ns, execution_id),
    none of `leave_out`. A keyset served by the (status,) created_at_ns, execution_id indexes."""
    where: list[str] = []
    args: list = []
    for value, clause in (
        (None if replayable is None else int(replayable), "traces.replayable = ?"),
        (status, "traces.status = ?"),
        (since_ns, "traces.created_at_ns >= ?"),
        (until_ns, "traces.created_at_ns < ?"),
        (intent, "traces.intent = ?"),
        (outcome, "traces.outcome = ?"),
        (error, "traces.error_code = ?"),
        (min_cost, "traces.cost_usd >= ?"),
        (slower_than_ns, "(traces.outcome != 'running' AND traces.last_event_ns - traces.created_at_ns > ?)"),
    ):
        if value is not None:
            where.append(clause)
            args.append(value)
    if search:
        where.append("(lower(traces.intent) LIKE '%' || lower(?) || '%' ESCAPE '/')")
        args.append(_escaped(search))
    if model_json is not None:
        where.append("(traces.models LIKE '%' || ? || '%' ESCAPE '/')")
        args.append(_escaped(model_json))
    if before is not None:
        where.append("(traces.created_at_ns, traces.execution_id) < (?, ?)")
        args.extend(before)
    ids = list(leave_out)
    for i in range(0, len(ids), _IN_CHUNK):
        chunk = ids[i : i + _IN_CHUNK]
        where.append(f"(traces.execution_id NOT IN ({', '.join('?' * len(chunk))}))")
        args.extend(chunk)
    sql = f"SELECT {_SUMMARY_SQL} FROM traces"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY traces.created_at_ns DESC, traces.execution_id DESC LIMIT ?"
    args.append(limit)
    names = (*SUMMARY_COLUMNS, "last_event_at_ns")
    out = []
    for r in conn.execute(sql, args):
        d = dict(zip(names, r))
        d["replayable"], d["pinned"] = bool(d["replayable"]), bool(d["pinned"])
        out.append(d)
    return out


def checked_row(d: dict) -> dict:
    """A `traces` row (every column, JSON values undecoded, as the database hands them back)
    decoded, with `damaged_columns`: the value columns that no longer match their checksums."""
    damaged = damaged_columns(d)
    d = _decoded_row(d)
    d["damaged_columns"] = damaged
    return d


def checked_step(r: Mapping) -> Step:
    """A step from a row of its STEP_COLUMNS by name: its stored (undecoded) payload decoded and
    checked against the payload's checksum."""
    stored = r["payload"]
    return Step(r["seq"], r["type"], json_value(stored), r["recorded_at_ns"], of_stored(stored) == r["payload_crc"])


def _decoded_row(d: dict) -> dict:
    for c in JSON_COLUMNS:
        d[c] = json_value(d[c])
    for c in BOOL_COLUMNS:
        d[c] = bool(d[c])
    return d


def load(conn: sqlite3.Connection, execution_id: str, *, trace: bool = True) -> tuple[Optional[dict], list[Step]]:
    """The `traces` row of an execution (a dict of every column and `damaged_columns`, see
    `checked_row`; None if there is none) and its steps in seq order (`Step.intact` says whether
    each payload matches its checksum), from one snapshot. Without `trace`, the steps alone."""
    conn.execute("BEGIN")
    try:
        row = conn.execute(_TRACE_SQL, (execution_id,)).fetchone() if trace else None
        steps = conn.execute(_STEPS_SQL, (execution_id,)).fetchall() if row is not None or not trace else ()
    finally:
        conn.execute("COMMIT")
    return (
        None if row is None else checked_row(dict(zip(TRACE_COLUMNS, row))),
        [checked_step(dict(zip(STEP_COLUMNS, s))) for s in steps],
    )


class Judged(NamedTuple):
    """What judging a listed row reads of its execution, without decoding its events: the
    `traces` values a verdict needs (JSON decoded), the value columns that no longer match their
    checksums, its steps' seqs in order, and whether every step's payload matches its checksum."""

    replayable_reason: Optional[str]
    envelope: object
    envelope_hash: Optional[str]
    meta: object
    final_response: object
    damaged_columns: list
    seqs: list
    steps_intact: bool


JUDGED_COLUMNS = (
    "execution_id", "replayable_reason", "envelope", "envelope_hash", "meta", "final_response", "router_decision",
    "router_decision_crc", "final_response_crc", "meta_crc",
)


def _in_lists(ids: Sequence[str]) -> Iterator[tuple[str, list]]:
    """(an IN list of placeholders, its ids) for every _IN_CHUNK ids of `ids`."""
    for i in range(0, len(ids), _IN_CHUNK):
        chunk = list(ids[i : i + _IN_CHUNK])
        yield ", ".join("?" * len(chunk)), chunk


def status_notes(conn: sqlite3.Connection, ids: Sequence[str]) -> dict[str, Optional[str]]:
    """{id: its status note} of the executions of `ids` the database holds."""
    out: dict = {}
    for marks, chunk in _in_lists(ids):
        out.update(conn.execute(f"SELECT execution_id, status_note FROM traces WHERE execution_id IN ({marks})", chunk))
    return out


def judged_rows(conn: sqlite3.Connection, ids: Sequence[str]) -> dict[str, Judged]:
    """For each of `ids` the database has: what a verdict on it reads (`Judged`), from one
    snapshot: one query of `traces` and one of the steps of every id, their payloads checked
    against their checksums as text, never decoded."""
    rows: list = []
    step_rows: list = []
    conn.execute("BEGIN")
    try:
        for marks, chunk in _in_lists(ids):
            sql = f"SELECT {', '.join(JUDGED_COLUMNS)} FROM traces WHERE execution_id IN ({marks})"
            rows += conn.execute(sql, chunk)
        for marks, chunk in _in_lists([r[0] for r in rows]):
            sql = (f"SELECT {', '.join(JUDGED_STEP_COLUMNS)} FROM trace_steps "
                   f"WHERE execution_id IN ({marks}) ORDER BY execution_id, seq")
            step_rows += conn.execute(sql, chunk)
    finally:
        conn.execute("COMMIT")
    return judged_from(rows, step_rows)


def judged_from(rows: Iterable[Sequence], step_rows: Iterable[Sequence]) -> dict[str, Judged]:
    """`judged_rows`' answer from rows of JUDGED_COLUMNS (JSON as stored, text) and of
    JUDGED_STEP_COLUMNS in execution id and seq order, each execution's steps together: of
    SQLite here, of PostgreSQL in `tracedb.reads.sql.judged_rows`."""
    found = {r[0]: dict(zip(JUDGED_COLUMNS, r)) for r in rows}
    steps: dict[str, tuple[list, bool]] = {}
    _checked_steps_into(steps, step_rows)
    return {eid: _judged(d, *steps.get(eid, ([], True))) for eid, d in found.items()}


JUDGED_STEP_COLUMNS = ("execution_id", "seq", "payload", "payload_crc")
# Where each of them sits in a row (the loop reads many rows: an index, not a dict per row).
_JS_ID, _JS_SEQ, _JS_PAYLOAD, _JS_CRC = (
    JUDGED_STEP_COLUMNS.index(n) for n in ("execution_id", "seq", "payload", "payload_crc")
)


def _checked_steps_into(steps: dict, rows: Iterable[tuple]) -> None:
    """Rows of JUDGED_STEP_COLUMNS in execution id and seq order into `steps`: execution id ->
    (its seqs, whether every payload matches its checksum)."""
    current, seqs, intact = None, [], True
    for r in rows:
        eid, seq, stored, crc = r[_JS_ID], r[_JS_SEQ], r[_JS_PAYLOAD], r[_JS_CRC]
        if eid != current:
            current, seqs, intact = eid, [], True
            steps[eid] = (seqs, intact)
        seqs.append(seq)
        if intact and of_stored(stored) != crc:
            intact = False
            steps[eid] = (seqs, intact)


def _judged(d: dict, seqs: list, intact: bool) -> Judged:
    return Judged(
        d["replayable_reason"], json_value(d["envelope"]), d["envelope_hash"], json_value(d["meta"]),
        json_value(d["final_response"]), damaged_columns(d), seqs, intact,
    )


def applied_lsn(conn: sqlite3.Connection, recorder_id: str) -> Optional[int]:
    """The highest applied LSN in the compaction checkpoints (of `recorder_id` when given); None
    when there is no checkpoint (of that recorder) in this database."""
    sql = "SELECT max(applied_lsn) FROM compaction_checkpoint"
    args: tuple = ()
    if recorder_id:
        sql, args = sql + " WHERE recorder_id = ?", (recorder_id,)
    return conn.execute(sql, args).fetchone()[0]


def running_with_rows(conn: sqlite3.Connection, recorder_id: str, ids: Iterable[str]) -> tuple[set, dict]:
    """(ids of the executions stored as running (of `recorder_id` when given), and the `traces`
    rows of those and of `ids`: execution id -> dict of every column with `_last_event_at_ns`),
    from one snapshot."""
    conn.execute("BEGIN")
    try:
        sql = "SELECT execution_id FROM traces WHERE status = 'running'"
        args: tuple = ()
        if recorder_id:
            sql, args = sql + " AND recorder_id = ?", (recorder_id,)
        running = {r[0] for r in conn.execute(sql, args)}
        wanted = list({*ids, *running})
        rows: dict = {}
        names = (*TRACE_COLUMNS, "_last_event_at_ns")
        head = "SELECT " + ", ".join(f"traces.{c}" for c in TRACE_COLUMNS) + f", {_LAST_EVENT_AT} FROM traces"
        for i in range(0, len(wanted), _IN_CHUNK):
            chunk = wanted[i : i + _IN_CHUNK]
            sql = f"{head} WHERE traces.execution_id IN ({', '.join('?' * len(chunk))})"
            for r in conn.execute(sql, chunk):
                d = _decoded_row(dict(zip(names, r)))
                rows[d["execution_id"]] = d
    finally:
        conn.execute("COMMIT")
    return running, rows
