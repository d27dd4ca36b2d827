"""Read commands: `inspect`, `trace get`, `trace lineage`, `stats`, over `tracedb.reads.reader.Reader`.

They read the database without the WAL's lock, so they work next to a running recorder.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import sys
import time
from typing import TYPE_CHECKING, Iterable, Iterator, Optional

import click
import orjson

from tracedb import reads
from tracedb.humanize import format_duration
from tracedb.reads.paging import DEFAULT_PAGE_SIZE
from tracedb.reads.rows import event_dicts
from tracedb.program import as_invoked
from tracedb.records.outcomes import OUTCOMES
from tracedb.records.record import REASON_RECORDING_FAILURE, STATUS_RUNNING, STATUSES, LostRecords, lost_records, utc_iso
from tracedb.cli.main import (
    CursorParam,
    config_of,
    TimeParam,
    emit_json,
    execution_id_argument,
    json_option,
)

if TYPE_CHECKING:
    from tracedb.reads.rows import TraceSummary


@contextlib.contextmanager
def reading(ctx: click.Context) -> Iterator[reads.Reader]:
    """A Reader of the store; when it was read without error, the note that the store is not
    recovered yet (no recorder runs, WAL records not compacted) goes to stderr."""
    # `reads.Reader` loads the reader (and the replay engines it brings) here, when the command
    # runs: a usage error of a read command does without it.
    with reads.Reader.open(config_of(ctx)) as reader:
        yield reader
        # What admin.recovery_note says, without loading the maintenance modules.
        note = reader.pending.note()
    if note:
        click.echo(as_invoked(note), err=True)


HEADER = ("ID", "CREATED", "INTENT", "STATUS", "REPLAY", "EVENTS", "DURATION", "OUTCOME", "MODEL", "TOKENS", "COST")
# A last column, shown when a listed execution lost records while its client failed open: how
# many (`inspect ID` says when).
LOST_HEADER = "LOST"
# Rows read before the column widths are fixed, when every execution is listed.
WIDTH_SAMPLE = 1000
# Rows whose lost records are read at once.
LOST_CHUNK = 500


def _with_lost(reader, items: Iterable[TraceSummary]) -> Iterator[tuple[TraceSummary, Optional[LostRecords]]]:
    """Each item with what its client lost of it, if it was flagged so (a read per chunk of rows,
    of those flagged recording_failure only)."""
    items = iter(items)
    while True:
        chunk = list(itertools.islice(items, LOST_CHUNK))
        if not chunk:
            return
        flagged = [i.execution_id for i in chunk if i.replayable_reason == REASON_RECORDING_FAILURE]
        lost = reader.lost_records(flagged) if flagged else {}
        for item in chunk:
            yield item, lost.get(item.execution_id)


def _cells(item: TraceSummary) -> tuple[str, ...]:
    return (
        item.execution_id,
        utc_iso(item.created_at_ns, timespec="seconds"),
        item.intent or "-",
        item.status,
        "replayable" if item.replayable else "not-replayable",
        str(item.last_seq),
        format_duration(item.duration_ns),
        item.outcome or "-",
        _models_cell(item.models),
        _tokens_cell(item),
        _cost_cell(item),
    )


def _models_cell(models) -> str:
    if not models:
        return "-"
    return models[0] + (f" +{len(models) - 1}" if len(models) > 1 else "")


def _tokens_cell(item: TraceSummary) -> str:
    if item.input_tokens is None:
        return "-"
    return f"{item.input_tokens + (item.output_tokens or 0):,}"


def _cost_cell(item: TraceSummary) -> str:
    if not (item.input_tokens or item.output_tokens):
        return "-"
    return "unknown" if item.cost_usd is None else f"${item.cost_usd:.4f}"


class SlowerThanParam(click.ParamType):
    """A duration: 500ms, 2s, 1.5m, 1h; a bare number is seconds."""

    name = "DURATION"

    def convert(self, value, param, ctx) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        raw = str(value).strip().lower()
        units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
        unit = next((u for u in units if raw.endswith(u) and raw[: -len(u)].replace(".", "", 1).isdigit()), None)
        try:
            return float(raw[: -len(unit)]) * units[unit] if unit else float(raw)
        except ValueError:
            self.fail(f"{value!r} is not a duration: write it like 500ms, 2s, 1.5m or 1h", param, ctx)


def _lost_cell(lost: Optional[LostRecords]) -> tuple[str, ...]:
    return (str(lost.count),) if lost is not None else ("-",)


def _print_table(rows: Iterable[tuple[TraceSummary, Optional[LostRecords]]]) -> None:
    """The header on stderr, one line per execution on stdout (its first five columns as
    IntentusNet's `inspect --list` prints them, and LOST when one of the first rows lost
    records); widths fit the first rows, so a listing of any length streams."""
    rows = iter(rows)
    first = list(itertools.islice(rows, WIDTH_SAMPLE))
    lost_column = any(lost is not None for _i, lost in first)

    def cells(item, lost) -> tuple[str, ...]:
        return _cells(item) + (_lost_cell(lost) if lost_column or lost is not None else ())

    header = HEADER + ((LOST_HEADER,) if lost_column else ())
    sample = [cells(i, lost) for i, lost in first]
    widths = [max([len(h)] + [len(row[c]) for row in sample]) for c, h in enumerate(header)]
    widths.append(0)  # a lost count past the sample, when none of the sample lost records
    right = {5, 6, 9, 10, 11}  # numbers align right

    def line(cells) -> str:
        parts = [cell.rjust(w) if c in right else cell.ljust(w) for c, (cell, w) in enumerate(zip(cells, widths))]
        return "  ".join(parts).rstrip()

    click.echo(line(header), err=True)
    for row in sample:
        click.echo(line(row))
    for item, lost in rows:
        click.echo(line(cells(item, lost)))


def _row_dict(item: TraceSummary, lost: Optional[LostRecords]) -> dict:
    d = item.to_dict()
    d["lost_records"] = None if lost is None else lost.to_dict()
    return d


def _print_json(rows: Iterable[tuple[TraceSummary, Optional[LostRecords]]]) -> None:
    """One JSON list on one line, written row by row so that a listing of any length streams."""
    click.echo("[", nl=False)
    for n, (item, lost) in enumerate(rows):
        click.echo(("," if n else "") + orjson.dumps(_row_dict(item, lost), option=orjson.OPT_SORT_KEYS).decode(), nl=False)
    click.echo("]")


def _print_ndjson(rows: Iterable[tuple[TraceSummary, Optional[LostRecords]]]) -> None:
    """One JSON object per line (for jq, log shippers, `while read`)."""
    for item, lost in rows:
        click.echo(orjson.dumps(_row_dict(item, lost), option=orjson.OPT_SORT_KEYS).decode())


def _print_csv(rows: Iterable[tuple[TraceSummary, Optional[LostRecords]]]) -> None:
    """A header row, then one row per execution, the JSON's fields as columns (lost_records: the
    count)."""
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(CSV_COLUMNS)
    for item, lost in rows:
        d = item.to_dict()
        d["lost_records"] = None if lost is None else lost.count
        out.writerow([_csv_cell(d[c]) for c in CSV_COLUMNS])


def _csv_cell(value) -> object:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"  # as in the JSON
    if isinstance(value, list):
        return " ".join(value)
    if isinstance(value, dict):
        return orjson.dumps(value).decode()
    return value


CSV_COLUMNS = (
    "execution_id", "created_utc_iso", "intent", "status", "replayable", "replayable_reason",
    "last_seq", "duration_ms", "pinned", "parent_execution_id", "outcome", "error", "models",
    "input_tokens", "output_tokens", "cost_usd", "cursor", "lost_records",
)
PRINTERS = {"table": _print_table, "json": _print_json, "ndjson": _print_ndjson, "csv": _print_csv}


@click.command()
@execution_id_argument(required=False)
@click.option("--list", "list_", is_flag=True, help="List executions, newest first, a page at a time.")
@click.option("--status", type=click.Choice(STATUSES))
@click.option("--since", type=TimeParam(), help="Created at or after: ISO time or an age such as 2h or 7d.")
@click.option("--until", type=TimeParam(), help="Created before: ISO time or an age.")
@click.option("--intent", help="Only executions with exactly this intent.")
@click.option("--search", metavar="TEXT", help="Only executions whose intent contains TEXT (any case).")
@click.option("--outcome", type=click.Choice(OUTCOMES), help="Only executions that came to this.")
@click.option("--model", help="Only executions that called this model.")
@click.option("--error", "error_code", metavar="CODE", help="Only executions whose first error has this code.")
@click.option("--min-cost", type=click.FloatRange(min=0), metavar="USD", help="Only executions that cost at least this.")
@click.option("--slower-than", type=SlowerThanParam(), help="Only executions no longer running that took longer, from creation to their last event (500ms, 2s, 1m).")
@click.option("--limit", type=click.IntRange(min=1), help=f"Executions per page (default {DEFAULT_PAGE_SIZE}).")
@click.option("--before", type=CursorParam(), help="The next page: the cursor printed after the previous one.")
@click.option("--all", "all_", is_flag=True, help="Every matching execution, not one page.")
@click.option(
    "--format", "fmt", type=click.Choice(sorted(PRINTERS)), default=None,
    help="How --list prints: table (default), json (one list), ndjson (an object per line), csv.",
)
@json_option("Machine-readable JSON (the same as --format json for --list).")
@click.pass_context
def inspect(ctx, execution_id, list_, status, since, until, intent, search, outcome, model, error_code, min_cost,
            slower_than, limit, before, all_, fmt, as_json):
    """List executions (--list), or show one execution's state.

    --list prints a line per execution, newest first: id, creation time, intent, status,
    replayability (judged as for one ID: a record that fails verification is not-replayable,
    record_corrupted), events, duration (creation to the last event; '-' while running), and
    OUTCOME (succeeded, failed, incomplete, running), MODEL (the first model called, +N more),
    TOKENS (input and output), COST (USD; unknown when a model's price is not in the table), and
    LOST, how many records a client that failed open lost while the recorder was unreachable,
    when a listed execution has such a count. The header, and the cursor of the next page when
    there is one, go to stderr. --format json (or --json) prints a list, ndjson an object per
    line, csv a header and a row per execution; each row carries its `cursor` and
    `lost_records` ({count, first, last}; in csv the count; null or empty when none), and
    outcome, error (null or {seq, type, code, message}: the first error), models, input_tokens,
    output_tokens, cost_usd (null when unknown). Filters combine: --status, --since/--until,
    --intent (exact), --search (a substring of the intent), --outcome, --model, --error CODE,
    --min-cost USD, --slower-than DURATION.

    With an id (or a unique prefix of one): JSON with execution_id, status, last_event,
    replayable, replayable_reason, outcome, error, models, tokens, cost_usd, and
    errored_events (the seq, type, code and message of each event that records an error); `note`, why it is not replayable, and `lost_records`
    ({count, first, last}) for records lost while the recorder was unreachable.

    \b
    Example:
      tracedb inspect --list --status incomplete --since 1d
      tracedb inspect --list --outcome failed --error TOOL_TIMEOUT --since 24h
      tracedb inspect --list --all --format csv > executions.csv
      tracedb inspect exec-e5f6g7h8
    """
    if execution_id is None and not list_:
        raise click.UsageError("give an execution id, or --list")
    if execution_id is not None and list_:
        raise click.UsageError("give either an execution id or --list, not both")
    if all_ and limit is not None:
        raise click.UsageError("give --limit or --all, not both")
    if fmt is not None and as_json and fmt != "json":
        raise click.UsageError(f"give --json or --format {fmt}, not both")
    with reading(ctx) as reader:
        if execution_id is not None:
            emit_json(reader.inspect(execution_id), as_json)
            return
        where = reads.Filter(status=status, since=since, until=until, intent=intent, search=search, outcome=outcome,
                             model=model, error=error_code, min_cost=min_cost, slower_than=slower_than)
        next_cursor: Optional[str] = None
        if all_:
            items: Iterable[TraceSummary] = reader.each(where, before=before)
        else:
            page = reader.page(where, before=before, limit=DEFAULT_PAGE_SIZE if limit is None else limit)
            items, next_cursor = page.items, page.next_cursor
        PRINTERS[fmt or ("json" if as_json else "table")](_with_lost(reader, items))
        if next_cursor is not None:
            click.echo(
                f"more: add --before {next_cursor} for the next page, or list every one with --all",
                err=True,
            )


@click.command("get")
@execution_id_argument()
@json_option("Compact one-line JSON of the record alone, instead of indented with eventTimes.")
@click.option("--follow", "-f", is_flag=True,
              help="Then, as `tail -f` does, print each new event as one JSON line as it is recorded, "
              "until the execution closes (Ctrl-C stops following).")
@click.option("--interval", type=click.FloatRange(min=0.01), default=0.5, show_default=True,
              help="With --follow: seconds between looks at the store.")
@click.pass_context
def trace_get(ctx, execution_id, as_json, follow, interval):
    """Print an execution's whole record, in IntentusNet's ExecutionRecord shape.

    header{executionId, createdUtcIso, envelopeHash, replayable, replayableReason}, envelope,
    routerDecision, events[{seq, type, payload}], finalResponse, plus status and intent, and
    lostRecords{count, first, last} when a client that failed open lost records of it while
    the recorder was unreachable; outcome, error (the first: {seq, type, code, message}),
    models, input_tokens, output_tokens and cost_usd; each event's `error` is null, or the
    {code, message} of the failed call it records.
    Indented (without --json), eventTimes follows: each event's seq, recordedUtcIso and
    sincePreviousMs (the time since the event before it; for the first, since the start).

    With --follow the record is printed, then each event recorded after it as one line of
    JSON ({seq, type, payload}), then one line with the execution's final status and
    replayability once it closes. Events show as the recorder compacts them (within its
    compaction interval).

    \b
    Example:
      tracedb trace get exec-a1b2c3d4 --json | jq .events
      tracedb trace get exec-a1b2c3d4 --follow
    """
    with reading(ctx) as reader:
        timeline = reader.timeline(execution_id)
        record = timeline.record
        out = record.to_dict()
        out["events"] = event_dicts(record.events)
        out.update(timeline.outcome)
        lost = lost_records(timeline.status_note) if record.header.replayableReason == REASON_RECORDING_FAILURE else None
        if lost is not None:
            out["lostRecords"] = lost.to_dict()
        if not as_json:
            out["eventTimes"] = [t.to_dict() for t in timeline.event_times]
        emit_json(out, as_json)
        if follow:
            _follow(reader, record, interval)


def _follow(reader, record, interval: float) -> None:
    """Print the events recorded after `record` until the execution closes."""
    eid = record.execution_id
    last = record.events[-1].seq if record.events else 0
    try:
        while record.status == STATUS_RUNNING:
            time.sleep(interval)
            record = reader.get(eid)
            for e in record.events:
                if e.seq > last:
                    click.echo(orjson.dumps({"seq": e.seq, "type": e.type, "payload": e.payload}).decode())
                    last = e.seq
    except KeyboardInterrupt:
        return
    click.echo(orjson.dumps({
        "status": record.status, "replayable": record.header.replayable,
        "replayable_reason": record.header.replayableReason,
    }).decode())


@click.command("lineage")
@execution_id_argument()
@json_option()
@click.pass_context
def trace_lineage(ctx, execution_id, as_json):
    """Show what an execution was forked from, up to the first one, and the forks made from it.

    \b
    Example:
      tracedb trace lineage exec-a1b2c3d4
    """
    with reading(ctx) as reader:
        lineage = reader.lineage(execution_id)
        if as_json:
            emit_json(lineage.to_dict(), True)
            return
        click.echo(lineage.execution_id)
        for parent, seq in lineage.ancestors:
            click.echo(f"  forked at seq {seq} from {parent}")
        for fork, seq in lineage.forks:
            click.echo(f"  fork {fork} at seq {seq}")


@click.command()
@click.option("--since", type=TimeParam(),
              help="Executions created at or after: ISO time or an age such as 24h or 7d  [default: 24h].")
@click.option("--all", "all_time", is_flag=True, help="Every execution in the store, instead of the last 24h.")
@click.option("--by", type=click.Choice(("intent", "model", "outcome", "day", "hour")),
              help="A line per intent, model, outcome, day or hour (UTC) besides the total.")
@json_option("The aggregates as JSON: {since_ns, by, total, groups} (see docs/cli.md).")
@click.pass_context
def stats(ctx, since, all_time, by, as_json):
    """Counts, failure rate, p50/p95/p99 duration, tokens and cost of executions, computed in SQL.

    FAILED% is failed / (succeeded + failed); durations run from creation to the last event of
    executions no longer running; COST sums the known costs ("unknown" when none is known), and
    UNPRICED counts the executions whose cost is unknown (a model the price table does not
    know). By model, an execution that called several models counts under each. Without
    --since or --all: the last 24 hours.
    With --all on SQLite the percentiles come from a duration histogram (16 buckets a doubling)
    and are within 3.1% of the exact ones (11.8% by hour); counts, tokens and cost are exact
    (docs/outcomes.md).

    \b
    Example:
      tracedb stats
      tracedb stats --all --by model
      tracedb stats --since 7d --by day --json | jq '.groups[] | {key, failed, cost_usd}'
    """
    if all_time and since is not None:
        raise click.UsageError("give --since or --all, not both")
    if since is None and not all_time:
        since = TimeParam().convert("24h", None, ctx)
    since_ns = None if since is None else int(since.timestamp() * 1e9)
    with reading(ctx) as reader:
        out = reader.stats(since_ns, by)
    if as_json:
        emit_json(out, True)
        return
    header = ("KEY" if by else "", "EXECUTIONS", "FAILED", "FAILED%", "P50", "P95", "P99", "TOKENS", "COST", "UNPRICED")
    lines = [_stats_cells("total", out["total"])] + [_stats_cells(g["key"], g) for g in out["groups"]]
    widths = [max(len(h), *(len(line[c]) for line in lines)) for c, h in enumerate(header)]

    def line(cells) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    click.echo(line(header), err=True)
    for cells in lines:
        click.echo(line(cells))


def _stats_cells(key, g: dict) -> tuple[str, ...]:
    def ms(v):
        return format_duration(None if v is None else int(v * 1e6))

    rate = "-" if g["failure_rate"] is None else f"{g['failure_rate'] * 100:.1f}%"
    return (
        "-" if key is None else str(key), str(g["executions"]), str(g["failed"]), rate,
        ms(g["p50_ms"]), ms(g["p95_ms"]), ms(g["p99_ms"]), f"{g['input_tokens'] + g['output_tokens']:,}",
        # No known cost at all is "unknown", never $0.0000 (a model the price table lacks).
        "unknown" if g["cost_unknown"] and g["cost_unknown"] >= g["executions"] else f"${g['cost_usd']:.4f}",
        f"{g['cost_unknown']:,}" if g["cost_unknown"] else "-",
    )
