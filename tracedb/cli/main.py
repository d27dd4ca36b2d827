"""`tracedb`: a thin command line over the library.

Read commands (inspect, trace get, verify) and prune, pin, unpin, invalidate go to the database
directly, without the WAL's lock, so they work next to a running recorder. compact and recover
open the store, which takes the lock: with a recorder running they exit 5 (it does both itself).

Exit codes: 0 ok, 1 other error, 2 usage, 3 not found, 4 integrity failure, 5 data directory in
use, 6 not replayable (`tracedb replay`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
from datetime import datetime, timezone
from typing import Optional

import click
import orjson

from . import errors
from .config import Config, load_config, parse_duration_s
from .errors import TraceDBError

# Other command groups register themselves here if their module exists (see the end of the file).
OPTIONAL_COMMAND_MODULES = ("tracedb.replay.cli", "tracedb.sidecar.cli", "tracedb.interop.cli")


class TraceDBGroup(click.Group):
    """Turns tracedb's and the WAL's known errors into a message, a hint and a stable exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except TraceDBError as e:
            _fail(e.message, e.hint, e.exit_code)
        except Exception as e:
            import wal

            if isinstance(e, wal.WalError):
                code = errors.EXIT_INTEGRITY if isinstance(e, wal.WalCorruptionError) else errors.EXIT_ERROR
                _fail(e.message, e.hint, code)
            raise


class _Exit(click.ClickException):
    def __init__(self, message: str, hint: Optional[str], code: int):
        super().__init__(message)
        self.hint = hint
        self.exit_code = code

    def show(self, file=None) -> None:
        click.echo(f"error: {self.message}", err=True)
        if self.hint:
            click.echo(f"hint: {self.hint}", err=True)


def _fail(message: str, hint: Optional[str], code: int):
    raise _Exit(message, hint, code)


def config_of(ctx: click.Context) -> Config:
    """The resolved configuration (flags > env > file > defaults), for any command module."""
    return ctx.find_root().obj["config"]


def _emit_json(value, compact: bool) -> None:
    opts = orjson.OPT_SORT_KEYS if compact else orjson.OPT_INDENT_2
    click.echo(orjson.dumps(value, option=opts).decode())


def read_engine(cfg: Config, *, write: bool = False):
    """An engine on the store's database without the WAL lock; StoreNotFoundError (exit 3) if none."""
    from . import db

    db.require_store(cfg.sqlite_path)
    engine = db.create_engine(cfg.sqlite_path, busy_timeout_ms=cfg.busy_timeout_ms, write=write)
    writer = db.create_engine(cfg.sqlite_path, busy_timeout_ms=cfg.busy_timeout_ms, write=True)
    try:
        db.migrate(writer)  # a no-op read when the schema is current
    finally:
        writer.dispose()
    return engine


# Earlier names of the two helpers above, kept for command modules written against them.
_config = config_of
_engine = read_engine


@contextlib.contextmanager
def _progress(label: str):
    """A progress bar on a terminal, nothing otherwise; yields a progress(done, total) callback."""
    if not sys.stderr.isatty():
        yield None
        return
    state: dict = {}

    def update(done: int, total: int) -> None:
        bar = state.get("bar")
        if bar is None:
            bar = state["bar"] = click.progressbar(length=max(total, 1), label=label, file=sys.stderr)
            bar.__enter__()
        bar.length = max(total, done, 1)
        bar.update(done - bar.pos)

    try:
        yield update
    finally:
        if "bar" in state:
            state["bar"].__exit__(None, None, None)


def _parse_time(text: Optional[str]) -> Optional[datetime]:
    if text is None:
        return None
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        try:
            return datetime.fromtimestamp(time.time() - parse_duration_s(text), tz=timezone.utc)
        except TraceDBError:
            raise click.BadParameter(f"{text!r}: give an ISO time (2024-01-15T10:30:00Z) or an age (2h, 7d)")
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def _note_unrecovered(cfg: Config, engine) -> None:
    """Tell the user when what they read is not the whole truth yet (no recorder, WAL pending)."""
    import fcntl

    import sqlalchemy as sa

    import wal

    from .models import compaction_checkpoint, traces

    recorder_id = cfg.recorder_id
    if not recorder_id:
        try:
            with open(os.path.join(cfg.data_dir, "RECORDER_ID"), encoding="ascii") as f:
                recorder_id = f.read().strip()
        except OSError:
            recorder_id = ""
    if engine.dialect.name != "sqlite" and not recorder_id:
        return  # a shared database: only this data directory's recorder is ours to speak of
    lock = os.path.join(cfg.wal_dir, "LOCK")
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return  # a recorder runs: it compacts and recovers by itself
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    running_q = sa.select(sa.func.count()).select_from(traces).where(traces.c.status == "running")
    applied_q = sa.select(sa.func.max(compaction_checkpoint.c.applied_lsn))
    if recorder_id:
        # Many recorders may share the database: count only this data directory's.
        running_q = running_q.where(traces.c.recorder_id == recorder_id)
        applied_q = applied_q.where(compaction_checkpoint.c.recorder_id == recorder_id)
    with engine.connect() as conn:
        running = conn.execute(running_q).scalar()
        applied = conn.execute(applied_q).scalar() or 0
    try:
        last = wal.scan(cfg.wal_dir, mode="point_in_time").last_lsn
    except Exception:  # noqa: BLE001 - only a note; `tracedb recover` reports real problems
        last = applied
    if running or last > applied:
        click.echo(
            f"note: no recorder is running, and {running} execution(s) are still marked running "
            f"and {max(0, last - applied)} WAL record(s) are not compacted; run `tracedb recover`",
            err=True,
        )


def _open_store(cfg: Config, progress=None):
    from .store import Store

    return Store(cfg.replace(compact_interval_ms=0, idle_timeout_s=0), recovery_progress=progress)


# -- the group ----------------------------------------------------------------------------
@click.group(cls=TraceDBGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--data-dir",
    envvar="TRACEDB_DATA_DIR",
    type=click.Path(file_okay=False),
    default=None,
    help="Data directory holding traces.db and wal/ (env TRACEDB_DATA_DIR; default ./.tracedb).",
)
@click.option(
    "--config",
    "config_path",
    envvar="TRACEDB_CONFIG",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML configuration file (env TRACEDB_CONFIG); see config/tracedb.toml.",
)
@click.option(
    "--db",
    "db_url",
    envvar="TRACEDB_DB_URL",
    default=None,
    metavar="URL",
    help="Database URL, SQLAlchemy form (postgresql+psycopg://user@host/db) for a fleet's shared "
    "database (env TRACEDB_DB_URL; default: the SQLite file in the data directory).",
)
@click.pass_context
def main(ctx: click.Context, data_dir: Optional[str], config_path: Optional[str], db_url: Optional[str]) -> None:
    """Record, inspect and maintain AI agent execution traces.

    \b
    Example:
      tracedb --data-dir /var/lib/tracedb inspect --list
      tracedb --db postgresql+psycopg://tracedb@db.internal/traces inspect --list
    """
    try:
        cfg = load_config(config_path, overrides={"data_dir": data_dir, "db_url": db_url})
    except TraceDBError as e:
        _fail(e.message, e.hint, e.exit_code)
    if data_dir is not None and cfg.db_path and os.path.dirname(cfg.db_path) != data_dir:
        cfg = cfg.replace(db_path="")
    ctx.ensure_object(dict)
    ctx.obj["config"] = cfg


# -- reading ------------------------------------------------------------------------------
@main.command()
@click.argument("execution_id", required=False)
@click.option("--list", "list_", is_flag=True, help="List executions, one per line.")
@click.option("--status", type=click.Choice(["running", "completed", "incomplete", "invalidated"]))
@click.option("--since", help="Created at or after: ISO time or an age such as 2h or 7d.")
@click.option("--until", help="Created before: ISO time or an age.")
@click.option("--limit", type=click.IntRange(min=0), help="At most this many lines.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@click.pass_context
def inspect(ctx, execution_id, list_, status, since, until, limit, as_json):
    """List executions (--list), or show one execution's state (seed 002).

    Each line of --list: execution id, creation time, intent, status, replayability.
    With an id: JSON with execution_id, status, last_event, replayable, replayable_reason.

    \b
    Example:
      tracedb inspect --list --status incomplete --since 1d
      tracedb inspect exec-e5f6g7h8
    """
    from . import queries

    cfg = config_of(ctx)
    if execution_id is None and not list_:
        raise click.UsageError("give an execution id, or --list")
    if execution_id is not None and list_:
        raise click.UsageError("give either an execution id or --list, not both")
    engine = read_engine(cfg)
    try:
        if list_:
            rows = queries.list_traces(
                engine, status=status, since=_parse_time(since), until=_parse_time(until), limit=limit
            )
            if as_json:
                _emit_json([r.to_dict() for r in rows], True)
            else:
                width = max((len(r.execution_id) for r in rows), default=0)
                iwidth = max((len(r.intent or "-") for r in rows), default=0)
                for r in rows:
                    from .record import utc_iso

                    click.echo(
                        f"{r.execution_id:<{width}}  {utc_iso(r.created_at_ns, timespec='seconds')}  "
                        f"{(r.intent or '-'):<{iwidth}}  {r.status:<11}  "
                        f"{'replayable' if r.replayable else 'not-replayable'}"
                    )
        else:
            record = queries.read_record(engine, execution_id)
            _emit_json(queries.inspect_view(record), as_json)
        _note_unrecovered(cfg, engine)
    finally:
        engine.dispose()


@main.group()
def trace():
    """Whole execution records.

    \b
    Example:
      tracedb trace get exec-a1b2c3d4
    """


@trace.command("get")
@click.argument("execution_id")
@click.option("--json", "as_json", is_flag=True, help="Compact one-line JSON instead of indented.")
@click.pass_context
def trace_get(ctx, execution_id, as_json):
    """Print an execution's whole record in seed 000's shape.

    header{executionId, createdUtcIso, envelopeHash, replayable, replayableReason}, envelope,
    routerDecision, events[{seq, type, payload}], finalResponse, plus status and intent.

    \b
    Example:
      tracedb trace get exec-a1b2c3d4 --json | jq .events
    """
    from . import queries

    cfg = config_of(ctx)
    engine = read_engine(cfg)
    try:
        _emit_json(queries.read_record(engine, execution_id).to_dict(), as_json)
    finally:
        engine.dispose()


@main.command()
@click.argument("execution_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@click.pass_context
def verify(ctx, execution_id, as_json):
    """Check envelope hashes, event order and database integrity; exit 4 on any problem.

    \b
    Example:
      tracedb verify && tracedb verify exec-a1b2c3d4
    """
    from .verify import verify as run_verify

    cfg = config_of(ctx)
    engine = read_engine(cfg)
    try:
        result = run_verify(engine, execution_id)
    finally:
        engine.dispose()
    if as_json:
        _emit_json(
            {"ok": result.ok, "checked_traces": result.checked_traces,
             "checked_steps": result.checked_steps, "problems": list(result.problems)},
            True,
        )
    else:
        for p in result.problems:
            click.echo(f"problem: {p}")
        click.echo(
            f"{'ok' if result.ok else 'FAILED'}: {result.checked_traces} trace(s), "
            f"{result.checked_steps} step(s), {len(result.problems)} problem(s)"
        )
    if not result.ok:
        ctx.exit(errors.EXIT_INTEGRITY)


# -- maintenance --------------------------------------------------------------------------
@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@click.pass_context
def compact(ctx, as_json):
    """Apply every WAL record to the database now (a running recorder does this itself).

    \b
    Example:
      tracedb compact
    """
    cfg = config_of(ctx)
    with _progress("compacting") as progress:
        # Opening recovers, which compacts everything durable; compact() then finds the rest.
        store = _open_store(cfg, progress)
        try:
            result = store.compact(progress=progress)
            opened = store.last_recovery
        finally:
            store.close()
    out = {
        "records": result.records + opened.compacted_records,
        "marked_incomplete": opened.marked_incomplete,
        "applied_lsn": store.applied_lsn,
    }
    if as_json:
        _emit_json(out, True)
    else:
        click.echo(
            f"compacted {out['records']} WAL record(s); applied LSN {out['applied_lsn']}; "
            f"{out['marked_incomplete']} execution(s) marked incomplete"
        )


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@click.pass_context
def recover(ctx, as_json):
    """Repair a torn WAL tail, compact, mark unfinished executions incomplete (seed 002).

    Runs on its own whenever a store opens; no execution is retried.

    \b
    Example:
      tracedb recover && tracedb inspect --list --status incomplete
    """
    cfg = config_of(ctx)
    with _progress("recovering") as progress:
        store = _open_store(cfg, progress)
        try:
            r = store.last_recovery
        finally:
            store.close()
    if as_json:
        _emit_json(
            {"wal_truncated_bytes": r.wal_truncated_bytes, "compacted_records": r.compacted_records,
             "marked_incomplete": r.marked_incomplete, "incomplete_ids": list(r.incomplete_ids)},
            True,
        )
    else:
        click.echo(
            f"truncated {r.wal_truncated_bytes} byte(s) of torn WAL tail; compacted "
            f"{r.compacted_records} record(s); marked {r.marked_incomplete} execution(s) incomplete"
        )
        for eid in r.incomplete_ids:
            click.echo(f"incomplete: {eid}")


@main.command()
@click.option("--older-than", "older_than", help="Age such as 30d, 12h (default: retention days).")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@click.pass_context
def prune(ctx, older_than, dry_run, as_json):
    """Delete terminal traces older than N (not pinned, not the parent of a fork), reclaim space.

    Safe next to a running recorder and from cron; running it twice deletes nothing more.

    \b
    Example:
      tracedb prune --older-than 30d --dry-run
    """
    from . import retention

    cfg = config_of(ctx)
    seconds = parse_duration_s(older_than) if older_than else cfg.retention_days * 86400.0
    engine = read_engine(cfg, write=True)
    try:
        with _progress("pruning") as progress:
            r = retention.prune(
                engine, seconds, now_ns=time.time_ns(), dry_run=dry_run,
                batch_traces=cfg.prune_batch_traces, progress=progress,
            )
    finally:
        engine.dispose()
    out = {
        "dry_run": r.dry_run, "deleted_traces": r.deleted_traces, "deleted_steps": r.deleted_steps,
        "kept_pinned": r.kept_pinned, "kept_parents": r.kept_parents, "bytes_freed": r.bytes_freed,
    }
    if as_json:
        _emit_json(out, True)
    else:
        verb = "would delete" if dry_run else "deleted"
        click.echo(
            f"{verb} {r.deleted_traces} trace(s) and {r.deleted_steps} step(s); kept "
            f"{r.kept_pinned} pinned and {r.kept_parents} fork parent(s); freed {r.bytes_freed} byte(s)"
        )


def _set_pin(ctx, execution_id: str, pinned: bool) -> None:
    from . import retention

    cfg = config_of(ctx)
    engine = read_engine(cfg, write=True)
    try:
        retention.set_pinned(engine, execution_id, pinned)
    finally:
        engine.dispose()
    click.echo(f"{'pinned' if pinned else 'unpinned'} {execution_id}")


@main.command()
@click.argument("execution_id")
@click.pass_context
def pin(ctx, execution_id):
    """Keep a trace forever: prune never deletes a pinned trace.

    \b
    Example:
      tracedb pin exec-a1b2c3d4
    """
    _set_pin(ctx, execution_id, True)


@main.command()
@click.argument("execution_id")
@click.pass_context
def unpin(ctx, execution_id):
    """Let prune delete a trace again once it is old enough.

    \b
    Example:
      tracedb unpin exec-a1b2c3d4
    """
    _set_pin(ctx, execution_id, False)


@main.command()
@click.argument("execution_id")
@click.option("--reason", required=True, help="Why, kept with the trace.")
@click.pass_context
def invalidate(ctx, execution_id, reason):
    """Mark an execution invalidated: not replayable, manually_invalidated (seed 000 state 4).

    Works next to a running recorder: it stops accepting events for the execution.

    \b
    Example:
      tracedb invalidate exec-a1b2c3d4 --reason "agent had a bug"
    """
    from . import retention

    cfg = config_of(ctx)
    engine = read_engine(cfg, write=True)
    try:
        changed = retention.invalidate_in_db(engine, execution_id, reason, time.time_ns())
    finally:
        engine.dispose()
    click.echo(f"invalidated {execution_id}" if changed else f"{execution_id} was already invalidated")


@main.command()
@click.pass_context
def migrate(ctx):
    """Create or upgrade the database schema (opening a store does this too).

    \b
    Example:
      tracedb migrate
    """
    from . import db

    cfg = config_of(ctx)
    if not db.is_url(cfg.database):
        os.makedirs(os.path.dirname(os.path.abspath(cfg.database)), exist_ok=True)
    engine = db.create_engine(cfg.database, busy_timeout_ms=cfg.busy_timeout_ms, write=True)
    try:
        before = db.migrate(engine)
        after = db.current_revision(engine)
    finally:
        engine.dispose()
    click.echo(f"schema at {after}" + ("" if before == after else f" (was {before or 'empty'})"))


@main.group("wal")
def wal_group():
    """The write-ahead log itself.

    \b
    Example:
      tracedb wal scan
    """


@wal_group.command("scan")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@click.pass_context
def wal_scan(ctx, as_json):
    """Read the whole WAL and report records, LSNs and any damage (read-only).

    \b
    Example:
      tracedb wal scan --json
    """
    import wal

    from wal.writer import acquire_dir_lock

    cfg = config_of(ctx)
    live = False
    if os.path.isdir(cfg.wal_dir):
        try:
            os.close(acquire_dir_lock(cfg.wal_dir))
        except wal.WalLockedError:
            live = True  # a recorder is appending while we read
    for attempt in range(3):
        try:
            r = wal.scan(cfg.wal_dir, mode="point_in_time")
            break
        except FileNotFoundError:
            # The running recorder deleted a compacted segment under the scan: scan again.
            if not live or attempt == 2:
                raise
    segs = wal.list_segments(cfg.wal_dir)
    # With a live writer, the end of the log may be a group being written, or a segment being
    # sealed as the scan reached it: damage there is not judged.
    live_tail = {s.path for s in segs[-2:]} if live else set()
    out = {
        "records": r.records, "first_lsn": r.first_lsn, "last_lsn": r.last_lsn,
        "segments": r.segments, "live": live,
        "damages": [
            {"path": os.path.basename(d.path), "offset": d.offset, "expected": d.expected,
             "found": d.found, "torn_tail": d.torn_tail, "live_tail": d.path in live_tail}
            for d in r.damages
        ],
    }
    if as_json:
        _emit_json(out, True)
    else:
        click.echo(f"{r.records} record(s), LSN {r.first_lsn}..{r.last_lsn}, {r.segments} segment(s)"
                   + (" (a recorder is writing: the tail may be in progress)" if live else ""))
        for d in out["damages"]:
            kind = "live tail" if d["live_tail"] else "torn tail" if d["torn_tail"] else "CORRUPTION"
            click.echo(f"{kind}: {d['path']} at {d['offset']}: expected {d['expected']}, found {d['found']}")
    if any(not d["torn_tail"] and not d["live_tail"] for d in out["damages"]):
        ctx.exit(errors.EXIT_INTEGRITY)


@wal_group.command("repair")
@click.pass_context
def wal_repair(ctx):
    """Truncate the WAL at the last good record, keeping .broken copies (takes the lock).

    \b
    Example:
      tracedb wal repair && tracedb recover
    """
    import wal

    cfg = config_of(ctx)
    try:
        r = wal.repair(cfg.wal_dir)
    except wal.WalLockedError as e:
        _fail(str(e.message), "stop the recorder first", errors.EXIT_IN_USE)
    if r.damage is None:
        click.echo(f"nothing to repair; the log ends at LSN {r.last_lsn}")
    else:
        click.echo(
            f"truncated {os.path.basename(r.truncated_segment or '')} at {r.truncated_at}; "
            f"the log now ends at LSN {r.last_lsn}; copies: "
            + ", ".join(os.path.basename(c) for c in r.broken_copies)
        )


def _register_optional_commands() -> None:
    for name in OPTIONAL_COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            # Only "this module does not exist (yet)" is skipped; a broken import inside it is not.
            if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
                continue
            raise
        module.register(main)


_register_optional_commands()

if __name__ == "__main__":  # pragma: no cover
    main()
