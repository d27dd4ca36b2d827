"""Commands over `tracedb.maintenance`: compact, recover, prune, pin, unpin, invalidate, migrate,
wal scan, wal repair (--dry-run, --salvage), verify, fork, backup, restore, import intentusnet.

prune, pin, unpin and invalidate write the database in short transactions without the WAL's
lock, so they work next to a running recorder; compact and recover open the store, which takes
the lock: with a recorder running they exit 5 (it does both itself).
"""

from __future__ import annotations

import os
import shlex

import click

from tracedb.errors import EXIT_ERROR, EXIT_INTEGRITY
from tracedb.maintenance import admin, backup
from tracedb.program import as_invoked
from tracedb.sidecar.protocol import MAX_REASON_CHARS
from tracedb.cli.main import DurationParam, config_of, format_bytes, emit_json, execution_id_argument, json_option, progress_bar


@click.command()
@json_option()
@click.pass_context
def compact(ctx, as_json):
    """Apply every WAL record to the database now (a running recorder does this itself).

    \b
    Example:
      tracedb compact
    """
    with progress_bar("compacting") as progress:
        r = admin.compact(config_of(ctx), progress)
    if as_json:
        emit_json({"records": r.records, "marked_incomplete": r.marked_incomplete, "applied_lsn": r.applied_lsn}, True)
    else:
        click.echo(
            f"compacted {r.records} WAL record(s); applied LSN {r.applied_lsn}; "
            f"{r.marked_incomplete} execution(s) marked incomplete"
        )


@click.command()
@click.option("--rebuild", is_flag=True,
              help="Move a damaged database file aside (traces.db.damaged) and rebuild it from the WAL; "
              "refused when the WAL no longer starts at LSN 1.")
@click.option("--partial", is_flag=True,
              help="With --rebuild: rebuild from what the WAL holds even though compacted records below "
              "its first LSN are lost with the damaged file.")
@json_option()
@click.pass_context
def recover(ctx, rebuild, partial, as_json):
    """Repair a torn WAL tail, compact, mark unfinished executions incomplete.

    Runs on its own whenever a store opens; no execution is retried. With --rebuild, a database
    file SQLite cannot read (`tracedb verify` exits 4 naming it) is moved aside, never deleted,
    and a new one is compacted from the WAL.

    \b
    Example:
      tracedb recover && tracedb inspect --list --status incomplete
      tracedb recover --rebuild && tracedb verify
    """
    if partial and not rebuild:
        raise click.UsageError("--partial goes with --rebuild")
    if rebuild:
        with progress_bar("rebuilding") as progress:
            b = admin.rebuild(config_of(ctx), partial=partial, progress=progress)
        if as_json:
            emit_json({"moved_to": list(b.moved_to), "first_lsn": b.first_lsn, "applied_lsn": b.applied_lsn,
                       "compacted_records": b.records, "marked_incomplete": b.marked_incomplete}, True)
        else:
            click.echo(
                f"moved the damaged database to {', '.join(b.moved_to) or '(nothing: there was no file)'}; "
                f"rebuilt from WAL LSN {b.first_lsn}..{b.applied_lsn}: compacted {b.records} record(s), "
                f"marked {b.marked_incomplete} execution(s) incomplete"
            )
        return
    with progress_bar("recovering") as progress:
        r = admin.recover(config_of(ctx), progress)
    if as_json:
        emit_json(
            {"wal_truncated_bytes": r.wal_truncated_bytes, "compacted_records": r.compacted_records,
             "marked_incomplete": r.marked_incomplete, "incomplete_ids": list(r.incomplete_ids),
             "kept_copies": [os.path.basename(c) for c in r.kept_copies]},
            True,
        )
    else:
        click.echo(
            f"truncated {format_bytes(r.wal_truncated_bytes)} of torn WAL tail; compacted "
            f"{r.compacted_records} record(s); marked {r.marked_incomplete} execution(s) incomplete"
        )
        for eid in r.incomplete_ids:
            click.echo(f"incomplete: {eid}")
        for c in r.kept_copies:
            click.echo(
                f"kept {c}: a damaged WAL segment, moved out of the log (`tracedb wal repair --salvage "
                "--dry-run` says whether it holds records the database lacks; remove it once looked at)"
            )


@click.command()
@click.option("--older-than", "older_than", type=DurationParam(), help="Age such as 30d, 12h, 90m, 45s, 2w; a bare number is days (default: the retention days).")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@json_option()
@click.pass_context
def prune(ctx, older_than, dry_run, as_json):
    """Delete terminal traces older than N (not pinned, not the parent of a fork), reclaim space.

    Safe next to a running recorder and from cron; running it twice deletes nothing more.

    \b
    Example:
      tracedb prune --older-than 30d --dry-run
    """
    with progress_bar("pruning") as progress:
        r = admin.prune(config_of(ctx), older_than, dry_run=dry_run, progress=progress)
    if as_json:
        emit_json(
            {"dry_run": r.dry_run, "deleted_traces": r.deleted_traces, "deleted_steps": r.deleted_steps,
             "kept_pinned": r.kept_pinned, "kept_parents": r.kept_parents, "bytes_freed": r.bytes_freed},
            True,
        )
    else:
        verb = "would delete" if dry_run else "deleted"
        # A dry run deletes nothing and so frees nothing: it says nothing of space.
        freed = "" if dry_run else f"; freed {format_bytes(r.bytes_freed)}"
        click.echo(
            f"{verb} {r.deleted_traces} trace(s) and {r.deleted_steps} step(s); kept "
            f"{r.kept_pinned} pinned and {r.kept_parents} fork parent(s){freed}"
        )


def _pin_command(pinned: bool, name: str, help_text: str) -> click.Command:
    """`pin` and `unpin`: one command body, two directions."""

    @click.command(name, help=help_text)
    @execution_id_argument()
    @json_option()
    @click.pass_context
    def command(ctx, execution_id, as_json):
        full_id = admin.set_pinned(config_of(ctx), execution_id, pinned)
        if as_json:
            emit_json({"execution_id": full_id, "pinned": pinned}, True)
        else:
            click.echo(f"{'pinned' if pinned else 'unpinned'} {full_id}")

    return command


pin = _pin_command(True, "pin", """Keep a trace forever: prune never deletes a pinned trace.

    \b
    Example:
      tracedb pin exec-a1b2c3d4
    """)
unpin = _pin_command(False, "unpin", """Let prune delete a trace again once it is old enough.

    \b
    Example:
      tracedb unpin exec-a1b2c3d4
    """)


@click.command()
@execution_id_argument()
@click.option("--reason", required=True, help="Why, kept with the trace.")
@json_option()
@click.pass_context
def invalidate(ctx, execution_id, reason, as_json):
    """Mark an execution invalidated: not replayable, manually_invalidated.

    Next to a running recorder, the recorder does it: the execution's next event is refused at
    once. With no recorder running, it is written to the database (an execution only the WAL
    holds needs `tracedb recover` first).

    \b
    Example:
      tracedb invalidate exec-a1b2c3d4 --reason "agent had a bug"
    """
    if not reason.strip() or len(reason) > MAX_REASON_CHARS:
        raise click.BadParameter(f"give a reason of 1 to {MAX_REASON_CHARS} characters", param_hint="--reason")
    r = admin.invalidate(config_of(ctx), execution_id, reason)
    if as_json:
        emit_json({"execution_id": r.execution_id, "changed": r.changed}, True)
    else:
        click.echo(f"invalidated {r.execution_id}" if r.changed else f"{r.execution_id} was already invalidated")


@click.command()
# Accepted as before; a missing data directory is made without it.
@click.option("--create", is_flag=True, hidden=True)
@json_option()
@click.pass_context
def migrate(ctx, create, as_json):
    """Create or upgrade the database schema (opening a store does this too).

    A data directory that does not exist yet is made, with its database.

    \b
    Example:
      tracedb migrate
      tracedb --data-dir /var/lib/tracedb migrate
    """
    r = admin.migrate(config_of(ctx))
    if as_json:
        emit_json({"before": r.before, "after": r.after}, True)
    else:
        click.echo(f"schema at {r.after}" + ("" if r.before == r.after else f" (was {r.before or 'empty'})"))


@click.group("wal")
def wal_group():
    """The write-ahead log itself.

    \b
    Example:
      tracedb wal scan
    """


@wal_group.command("scan")
@json_option()
@click.pass_context
def wal_scan(ctx, as_json):
    """Read the whole WAL and report records, LSNs and any damage (read-only).

    \b
    Example:
      tracedb wal scan --json
    """
    r = admin.scan_wal(config_of(ctx))
    if as_json:
        emit_json(
            {"records": r.records, "first_lsn": r.first_lsn, "last_lsn": r.last_lsn,
             "segments": r.segments, "live": r.live,
             "damages": [
                 {"path": d.segment, "offset": d.offset, "expected": d.expected, "found": d.found,
                  "torn_tail": d.torn_tail, "live_tail": d.live_tail}
                 for d in r.damages
             ]},
            True,
        )
    else:
        click.echo(f"{r.records} record(s), LSN {r.first_lsn}..{r.last_lsn}, {r.segments} segment(s)"
                   + (" (a recorder is writing: the tail may be in progress)" if r.live else ""))
        for d in r.damages:
            kind = "live tail" if d.live_tail else "torn tail" if d.torn_tail else "CORRUPTION"
            click.echo(f"{kind}: {d.segment} at {d.offset}: expected {d.expected}, found {d.found}")
    if r.corrupt:
        if not as_json:
            click.echo(as_invoked(
                "hint: stop the recorder; `tracedb wal repair --dry-run` says what a repair would keep "
                "and drop, and `tracedb wal repair --salvage` keeps every record with a valid CRC"),
                err=True,
            )
        ctx.exit(EXIT_INTEGRITY)


# Executions a repair's report names one per line before it summarises the rest.
SHOWN = 20


@wal_group.command("repair")
@click.option("--dry-run", is_flag=True,
              help="Change nothing: say what a repair would cut or keep, how many records and which "
              "executions it would drop. Takes no lock: it runs next to a recorder, whose write in "
              "progress at the end of the log it does not judge.")
@click.option("--salvage", is_flag=True,
              help="Keep every record with a valid CRC: skip only the damaged bytes, also from the "
              ".broken copies of an earlier repair; executions that lost an event become "
              "not replayable (record_corrupted).")
@json_option()
@click.pass_context
def wal_repair(ctx, dry_run, salvage, as_json):
    """Repair a damaged WAL (takes the lock: stop the recorder first; --dry-run reads next to it).

    Without --salvage (fail-closed): cut the log at its first damage, keeping a .broken copy of
    every file it changes; the records after the damage are not applied. With --salvage: keep
    every record whose CRC is valid, resyncing on the next valid record after each damaged
    range, compact them, and mark each execution that lost an event not replayable
    (record_corrupted; `tracedb inspect ID` names its missing seqs). Either way the report names
    each damaged range (file, offset, length, LSNs lost), and the data directory opens again
    afterwards: damage below the applied LSN is already in the database, and the log continues
    after it.

    \b
    Example:
      tracedb wal repair --dry-run
      tracedb wal repair --salvage && tracedb verify
      tracedb wal repair && tracedb recover
    """
    r = admin.repair_wal(config_of(ctx), dry_run=dry_run, salvage=salvage)
    if as_json:
        emit_json(r.to_dict(), True)
        return
    if not r.repaired:
        click.echo(f"nothing to repair; the log ends at LSN {r.last_lsn}")
        for n in r.notes:
            click.echo(f"note: {n}")
        return
    would = "would " if r.dry_run else ""
    for d in r.damaged:
        click.echo(as_invoked(d.describe(r.applied_lsn)))
    for n in r.notes:
        click.echo(f"note: {as_invoked(n)}")
    if r.salvage:
        click.echo(
            f"salvage {would}keep {r.kept_records} record(s) found after the damage; "
            f"{would}append {r.relogged_records} the database lacks, and compact them"
        )
        for eid, missing in r.corrupted[:SHOWN]:
            lost = ("seqs " + ", ".join(map(str, missing))) if missing else "a record it cannot name: its start, or what came after its last event"
            click.echo(f"{'would mark' if r.dry_run else 'marked'} record_corrupted: {eid} (lost {lost})")
        if len(r.corrupted) > SHOWN:
            click.echo(f"... and {len(r.corrupted) - SHOWN} more (--json lists every one)")
    else:
        lost = r.lost_records
        click.echo(
            f"{would}cut {r.cut_segment} at {r.cut_offset}; {would}drop {r.dropped_records} record(s) with a "
            f"valid CRC after the damage, of {len(r.dropped_executions)} execution(s)"
            + ("" if lost is None else f", and {lost} record(s) in the damaged bytes")
        )
        for eid in r.dropped_executions[:SHOWN]:
            click.echo(f"{would}lose events of: {eid}")
        if len(r.dropped_executions) > SHOWN:
            click.echo(f"... and {len(r.dropped_executions) - SHOWN} more (--json lists every one)")
    if r.broken_copies:
        click.echo("copies kept: " + ", ".join(r.broken_copies))
    if r.dry_run:
        click.echo("dry run: nothing was changed")
    elif not r.salvage:
        click.echo(as_invoked("next: `tracedb recover` compacts what the log holds"
                   + ("; `tracedb wal repair --salvage` keeps the dropped records from the copies"
                      if r.dropped_records else "")))


@click.command("backup")
@click.argument("dest", type=click.Path(file_okay=False))
@json_option()
@click.pass_context
def backup_command(ctx, dest, as_json):
    """Copy the data directory into DEST (new or empty), online, next to a running recorder.

    The database is copied with SQLite's online backup API, then the WAL segments holding
    every record it has not applied, with the LSN gaps a repair left and the evidence of damage
    (.broken copies, kept torn tails) that salvage reads; every file is fsynced. `tracedb
    restore` makes a data directory of it again.

    \b
    Example:
      tracedb --data-dir /var/lib/tracedb backup /backups/tracedb-$(date +%F)
    """
    r = backup.backup(config_of(ctx), dest)
    if as_json:
        emit_json({"path": r.path, "applied_lsn": r.applied_lsn, "wal_segments": r.wal_segments,
                   "wal_bytes": r.wal_bytes, "database_bytes": r.database_bytes}, True)
    else:
        click.echo(
            f"backed up to {r.path}: database {format_bytes(r.database_bytes)} (applied LSN {r.applied_lsn}), "
            f"{r.wal_segments} WAL segment(s), {format_bytes(r.wal_bytes)}"
        )


@click.command("restore")
@click.argument("backup_dir", type=click.Path(exists=True, file_okay=False))
@json_option()
@click.pass_context
def restore_command(ctx, backup_dir, as_json):
    """Make the data directory (--data-dir, which must be new or empty) from a backup.

    Open it as usual afterwards (`tracedb serve`, `tracedb recover`): the first open compacts
    the backed-up WAL into the backed-up database, as recovery does. Only the regular files a
    backup is made of are copied: anything else in it (a symbolic link, a device, a FIFO, a
    socket, another file) is refused by name (exit 4) before anything is written.

    \b
    Example:
      tracedb --data-dir /var/lib/tracedb restore /backups/tracedb-2026-11-24
      tracedb --data-dir /var/lib/tracedb recover
    """
    where = backup.restore(backup_dir, config_of(ctx).data_dir)
    if as_json:
        emit_json({"restored": backup_dir, "data_dir": where}, True)
    else:
        click.echo(as_invoked(f"restored {backup_dir} into {where}; `tracedb --data-dir {shlex.quote(where)} recover` brings it up to date"))


@click.command()
@execution_id_argument(required=False)
@json_option("A JSON report to alert on: ok, problems, database{ok, problems, hint}, wal{records, "
             "first_lsn, last_lsn, applied_lsn, uncompacted_records, damages, kept_tails}, left_running, notes.")
@click.pass_context
def verify(ctx, execution_id, as_json):
    """Check everything; exit 4 on any damage.

    The traces: envelope hashes, event order, lifecycle. The database file: SQLite's own
    integrity check (a file SQLite cannot read is reported with how to rebuild it from the WAL).
    The WAL, without its lock: damage (a recorder's write in progress is not judged), records
    not compacted yet, executions left running with no recorder (those two are notes: `tracedb
    recover` settles them), torn tails the recorder kept when it cut them (a note, or a problem
    when one holds a record the database lacks: `tracedb wal repair --salvage` applies it).
    With an ID, that execution alone.

    \b
    Example:
      tracedb verify && tracedb verify exec-a1b2c3d4
      tracedb verify --json | jq .problems
    """
    r = admin.verify_store(config_of(ctx), execution_id)
    if as_json:
        emit_json(r.to_dict(), True)
    else:
        for p in r.problems:
            click.echo(f"problem: {as_invoked(p)}")
        if r.database_hint:
            click.echo(f"hint: {as_invoked(r.database_hint)}")
        t = r.traces
        click.echo(
            f"{'ok' if r.ok else 'FAILED'}: {t.checked_traces if t else 0} trace(s), "
            f"{t.checked_steps if t else 0} step(s), {len(r.problems)} problem(s)"
        )
        if r.wal_last_lsn or r.wal_records:
            click.echo(
                f"wal: {r.wal_records} record(s), LSN {r.wal_first_lsn}..{r.wal_last_lsn}"
                + (f", applied to the database up to {r.applied_lsn}" if r.applied_lsn is not None else "")
                + (" (a recorder is writing)" if r.wal_live else "")
            )
        for n in r.notes:
            click.echo(f"note: {as_invoked(n)}")
    if not r.ok:
        ctx.exit(EXIT_INTEGRITY)


@click.command("fork")
@execution_id_argument()
@click.option("--at", "at_seq", required=True, type=click.IntRange(min=0), help="The last seq the fork shares with its parent.")
@click.option("--id", "new_id", help="Execution id for the fork (default: a new one).")
@json_option()
@click.pass_context
def fork_command(ctx, execution_id, at_seq, new_id, as_json):
    """Start a new execution sharing the parent's events up to --at, with its lineage.

    With a recorder running (`tracedb serve`), the fork is made through it and stays open: record
    its next events by id (seq --at + 1 onwards). Without one, the fork is recorded in-process and
    closed as incomplete when this command exits; run the recorder to keep forks live, or call
    tracedb.fork() from the agent's own process. An --at that a closed parent has no event at, or
    at or past its final response, is a usage error (exit 2).

    \b
    Example:
      tracedb fork exec-a1b2c3d4 --at 7 --json
    """
    token = os.environ.get("TRACEDB_TOKEN") or None
    r = admin.fork(config_of(ctx), execution_id, at_seq, new_execution_id=new_id, token=token)
    made = r.fork
    out = dict(made.to_dict(), live=r.live)
    if as_json:
        emit_json(out, True)
    else:
        click.echo(
            f"forked {made.parent_execution_id} at seq {made.forked_at_seq} -> {made.execution_id} "
            f"({out['copied_events']} event(s) shared)"
        )
    if not r.live:
        click.echo(as_invoked(
            "note: no recorder is running, so the fork was closed as incomplete when this command "
            "finished; start `tracedb serve` to keep forks open"),
            err=True,
        )


@click.group("import")
def import_group():
    """Bring execution records recorded by other runtimes into tracedb.

    \b
    Example:
      tracedb import intentusnet .intentusnet/records
    """


@import_group.command("intentusnet")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.option("--workers", type=click.IntRange(1, 64), default=8, show_default=True,
              help="Records written at once (their WAL appends share fsyncs).")
@json_option()
@click.pass_context
def import_intentusnet(ctx, directory, workers, as_json):
    """Import an IntentusNet FileExecutionStore directory (DIR/<executionId>.json).

    Each record goes through the WAL like a live execution and keeps its id, creation time,
    envelope, events and final response (redacted by the [redaction] rules). Each event keeps
    the time it was recorded when the file gives it (recordedUtcIso, which `tracedb export
    --format intentusnet` writes); without it, the events take the record's creation time. Running it again
    imports nothing twice. A file that cannot be stored exactly (NaN, a changed record under an
    id already imported, see docs/intentusnet.md) is reported and nothing of it is written; the
    others go in, and the command exits 1.

    \b
    Example:
      tracedb --db postgresql+psycopg://tracedb@db/traces import intentusnet ./records
    """
    with progress_bar("importing") as progress:
        result = admin.import_intentusnet(config_of(ctx), directory, workers=workers, progress=progress)
    if as_json:
        emit_json(
            {"imported": result.imported, "already_present": result.already_present,
             "events": result.events,
             "failed": [{"file": f, "error": m} for f, m in result.failed]},
            True,
        )
    else:
        for name, message in result.failed:
            click.echo(f"failed: {name}: {message}", err=True)
        click.echo(
            f"imported {result.imported} record(s) with {result.events} event(s); "
            f"{result.already_present} already present; {len(result.failed)} failed"
        )
    if result.failed:
        ctx.exit(EXIT_ERROR)
