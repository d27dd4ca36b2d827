"""`tracedb export`: executions as JSON, in tracedb's record shape, IntentusNet's or OTLP/JSON
(`tracedb import intentusnet DIR`, a write, is in `tracedb.cli.maintenance`)."""

from __future__ import annotations

import json
import os
from typing import Optional

import click
from wal.fs import PRIVATE_FILE, OsFileSystem, make_dirs, make_private

from tracedb.errors import EXIT_ERROR
from tracedb.otel.export import to_otlp_json
from tracedb.cli.main import emit_json, json_option, non_empty_ids, progress_bar
from tracedb.cli.read import reading


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: str, text: str) -> None:
    # Written aside, flushed, then renamed: a reader (or IntentusNet) never sees half a file;
    # the directory is synced so that the rename itself survives a crash. The file is private
    # (0600, whatever the umask), as the store it comes from is.
    tmp = f"{path}.tmp-{os.getpid()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, PRIVATE_FILE)
    except FileExistsError:  # left by a killed export with this pid
        os.unlink(tmp)
        fd = os.open(tmp, flags, PRIVATE_FILE)
    with open(fd, "w", encoding="utf-8") as f:
        make_private(f.fileno())
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def file_name_of(execution_id: str) -> Optional[str]:
    """`<id>.json`, or None when that would not be a visible file inside the directory. Every id
    accepted now is a safe name (tracedb.records.validation.validate_id); ids recorded under the looser
    rule of earlier versions may not be ("a/b", "../x", ".hidden")."""
    if "/" in execution_id or "\\" in execution_id or execution_id.startswith("."):
        return None
    return f"{execution_id}.json"


@click.command("export")
@click.argument("execution_ids", nargs=-1, metavar="[ID]...", callback=non_empty_ids)
@click.option("--all", "all_", is_flag=True, help="Every execution in the store.")
@click.option("--format", "fmt", type=click.Choice(["tracedb", "intentusnet", "otlp-json"]), default="tracedb",
              show_default=True, help="tracedb: the `trace get` record; intentusnet: IntentusNet's ExecutionRecord "
              "JSON; otlp-json: an OTLP/JSON trace export request per execution, for any OpenTelemetry tool "
              "(docs/otel.md).")
@click.option("--output", "-o", type=click.Path(), default=None,
              help="A file for one execution, or a directory (<id>.json per execution, the layout "
              "IntentusNet's FileExecutionStore reads). Default: standard output.")
@json_option("Compact one-line JSON on standard output.")
@click.pass_context
def export_command(ctx, execution_ids, all_, fmt, output, as_json):
    """Write executions as JSON, in tracedb's record shape, IntentusNet's, or OTLP/JSON.

    To standard output, one execution is indented JSON (one line with --json) and several (ids,
    or --all) are JSON lines, one execution per line. In IntentusNet's shape the header's envelopeHash is IntentusNet's hash of the envelope
    (bare hex), so its ReplayEngine verifies and replays the record as its own, and each event
    carries recordedUtcIso, the time it was recorded, which `tracedb import intentusnet` keeps
    (IntentusNet reads past it; a record imported without event times is exported without). In OTLP/JSON, an
    execution recorded from OpenTelemetry gives its spans back; any other is one span with its
    events (docs/otel.md); --all to standard output is the JSON-lines file OpenTelemetry's
    file exporter writes.

    \b
    Example:
      tracedb export exec-a1b2c3d4 --format intentusnet
      tracedb export --all --format intentusnet -o .intentusnet/records
      tracedb export --all | gzip > executions.jsonl.gz
      tracedb export --all --format otlp-json > traces.jsonl
    """
    if all_ and execution_ids:
        raise click.UsageError("give execution ids or --all, not both")
    if not all_ and not execution_ids:
        raise click.UsageError("give one or more execution ids, or --all")
    if fmt == "intentusnet":
        # Lazy seam: the IntentusNet adapter loads IntentusNet's own package, which no other format needs.
        from tracedb.interop.intentusnet import to_intentusnet_dict

    to_dir: Optional[str] = None
    if output is not None and (all_ or len(execution_ids) > 1 or os.path.isdir(output) or output.endswith(os.sep)):
        to_dir = output
    elif output is not None and not os.path.isdir(os.path.dirname(os.path.abspath(output))):
        raise click.UsageError(f"--output {output}: the directory {os.path.dirname(os.path.abspath(output))} "
                               "does not exist")

    n = 0
    skipped: list = []
    with reading(ctx) as reader, progress_bar("exporting") as progress:
        # With --all the ids come a page at a time: memory holds a page of ids and one record.
        ids = (i.execution_id for i in reader.each(judge=False)) if all_ else map(reader.resolve, execution_ids)
        total = reader.count() if all_ and progress is not None else len(execution_ids)
        if to_dir is not None:
            make_dirs(OsFileSystem(), to_dir)  # private, as the files written into it; fsynced into its parent
        for eid in ids:
            name = file_name_of(eid) if to_dir is not None else None
            if to_dir is not None and name is None:
                # The id becomes a file name: one that would point outside the directory (or
                # hide there) is named and left out; the others are written.
                skipped.append(eid)
                click.echo(f"skipped: {eid!r} cannot be a file name in {to_dir}; "
                           f"export it alone with --output FILE", err=True)
                continue
            if fmt in ("otlp-json", "intentusnet"):
                timeline = reader.timeline(eid)
                times = {t.seq: t.recorded_at_ns for t in timeline.event_times}
                convert = to_otlp_json if fmt == "otlp-json" else to_intentusnet_dict
                doc = convert(timeline.record, times)
            else:
                record = reader.get(eid)
                doc = to_intentusnet_dict(record) if fmt == "intentusnet" else record.to_dict()
            n += 1
            if progress is not None:
                progress(n, total)
            if output is None:
                # One execution: indented unless --json. Several: one JSON document per line.
                emit_json(doc, as_json or all_ or len(execution_ids) > 1)
                continue
            # IntentusNet's FileExecutionStore writes json.dump(..., ensure_ascii=False, indent=2).
            text = json.dumps(doc, ensure_ascii=False, indent=2)
            _write_atomic(os.path.join(to_dir, name) if to_dir else output, text)
    if output is not None:
        where = to_dir if to_dir is not None else output
        click.echo(f"wrote {n} execution(s) to {where}" + (f"; skipped {len(skipped)}" if skipped else ""), err=True)
    if skipped:
        ctx.exit(EXIT_ERROR)
