"""`tracedb replay`, `tracedb fork` and `tracedb trace diff`: thin commands over tracedb.replay.

`register(main)` is called by tracedb/cli.py, which owns the `tracedb` group, its global
`--data-dir` / `--config` options and the error handling (message, hint, stable exit code):
NotReplayableError exits 6, RecordCorruptedError and ReplayHashMismatchError exit 4.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import click
import orjson

from ..errors import InvalidInputError

_CELL = 46  # width of one side in `trace diff`


def _read_records(ctx: click.Context, *execution_ids: str) -> list:
    # Read commands go to the database directly, like `trace get`: they work next to a recorder.
    from .. import cli, queries

    cfg = cli.config_of(ctx)
    engine = cli.read_engine(cfg)
    try:
        records = [queries.read_record(engine, eid) for eid in execution_ids]
        # Says so when no recorder runs and the WAL holds records not compacted yet.
        note = getattr(cli, "_note_unrecovered", None)
        if note is not None:
            note(cfg, engine)
    finally:
        engine.dispose()
    return records


def _emit_json(value, compact: bool) -> None:
    # The same output as `tracedb trace get`: indented, or one sorted line with --json.
    opts = orjson.OPT_SORT_KEYS if compact else orjson.OPT_INDENT_2
    click.echo(orjson.dumps(value, option=opts).decode())


def _load_envelope(path: str) -> dict:
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        envelope = json.loads(text)
    except OSError as e:
        raise click.BadParameter(f"cannot read {path}: {e.strerror}", param_hint="--envelope") from None
    except ValueError as e:
        raise click.BadParameter(f"{path} is not JSON: {e}", param_hint="--envelope") from None
    if not isinstance(envelope, dict):
        raise click.BadParameter(
            f"{path} must hold a JSON object (the intent envelope)", param_hint="--envelope"
        )
    return envelope


@click.command("replay")
@click.argument("execution_id")
@click.option("--force", is_flag=True, help="Replay a non-replayable record anyway (debugging only).")
@click.option(
    "--envelope",
    "envelope_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="JSON file with the intent envelope to verify against the recorded hash ('-': stdin).",
)
@click.option("--json", "as_json", is_flag=True, help="Compact one-line JSON instead of indented.")
@click.pass_context
def replay_command(ctx, execution_id, force, envelope_path, as_json):
    """Return an execution's recorded final response exactly; no agent or model is called.

    Exit 6 when the record is not replayable (execution_incomplete, recording_failure,
    manually_invalidated; --force overrides, with a warning), 4 when it fails its integrity
    checks or the --envelope does not hash to the recorded envelope hash.

    \b
    Example:
      tracedb replay exec-a1b2c3d4 --envelope envelope.json --json | jq .payload
    """
    from .exact import ReplayEngine

    env = _load_envelope(envelope_path) if envelope_path else None
    (record,) = _read_records(ctx, execution_id)
    result = ReplayEngine(record).replay(env=env, force=force)
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    _emit_json(result.to_dict(), as_json)


@click.command("fork")
@click.argument("execution_id")
@click.option("--at", "at_seq", required=True, type=int, help="The last seq the fork shares with its parent.")
@click.option("--id", "new_id", help="Execution id for the fork (default: a new one).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@click.pass_context
def fork_command(ctx, execution_id, at_seq, new_id, as_json):
    """Start a new execution sharing the parent's events up to --at, with its lineage (seed 004).

    With a recorder running (`tracedb serve`), the fork is made through it and stays open: record
    its next events by id (seq --at + 1 onwards). Without one, the fork is recorded in-process and
    closed as incomplete when this command exits; run the recorder to keep forks live, or call
    tracedb.fork() from the agent's own process.

    \b
    Example:
      tracedb fork exec-a1b2c3d4 --at 7 --json
    """
    from .. import cli
    from ..store import open_store
    from .forking import fork

    cfg = cli.config_of(ctx)
    address = _sidecar_address(cfg.data_dir)
    if address is not None:
        from ..sidecar.client import Client

        with Client(address, token=os.environ.get("TRACEDB_TOKEN") or None) as client:
            made = fork(client, execution_id, at_seq, new_execution_id=new_id)
        live = True
    else:
        # No background threads: this process records one fork and exits.
        store = open_store(config=cfg.replace(compact_interval_ms=0, idle_timeout_s=0))
        try:
            made = fork(store, execution_id, at_seq, new_execution_id=new_id)
        finally:
            store.close()
        live = False
    out = dict(made.to_dict(), live=live)
    if as_json:
        _emit_json(out, True)
    else:
        click.echo(
            f"forked {made.parent_execution_id} at seq {made.forked_at_seq} -> {made.execution_id} "
            f"({out['copied_events']} event(s) shared)"
        )
    if not live:
        click.echo(
            "note: no recorder is running, so the fork was closed as incomplete when this command "
            "finished; start `tracedb serve` to keep forks open",
            err=True,
        )


def _sidecar_address(data_dir: str) -> Optional[str]:
    try:
        from ..sidecar.client import resolve_sidecar
    except ImportError:  # the sidecar is optional
        return None
    return resolve_sidecar(None, data_dir)


def _cell(entry: Optional[dict], unit: str) -> str:
    if entry is None:
        return "-"
    if unit == "step":
        params = entry["params"]
        text = f"{entry['skill']}({params}) {entry['status']} r={entry['retries']}"
    else:
        text = f"{entry['seq']} {entry['type']} {entry['payload']}"
    return text if len(text) <= _CELL else text[: _CELL - 1] + "…"


@click.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@click.option("--exit-code", is_flag=True, help="Exit 1 when the traces diverge (like git diff).")
@click.pass_context
def diff_command(ctx, a, b, as_json, exit_code):
    """Show two traces side by side, up to and at their first divergent step (seed 003).

    Steps are compared by the determinism signature: skill, canonical parameters, status, retry
    count (never response data, timing or cost). Traces without skill or tool steps are compared
    event by event.

    \b
    Example:
      tracedb trace diff exec-original exec-replay
    """
    from .parity import diff_traces

    rec_a, rec_b = _read_records(ctx, a, b)
    diff = diff_traces(rec_a, rec_b)
    if as_json:
        _emit_json(diff.to_dict(), True)
    else:
        click.echo(f"{diff.unit:<5} {a[:_CELL]:<{_CELL}}  {b[:_CELL]:<{_CELL}}")
        for row in diff.rows:
            mark = "=" if row.same else "≠"
            left, right = _cell(row.a, diff.unit), _cell(row.b, diff.unit)
            click.echo(f"{row.step:<5} {left:<{_CELL}}  {right:<{_CELL}}  {mark}")
        if diff.identical:
            click.echo(f"identical: {diff.a_total} {diff.unit}(s)")
        else:
            click.echo(f"first divergence at {diff.divergence_reason}")
            rest_a = max(0, diff.a_total - len(diff.rows))
            rest_b = max(0, diff.b_total - len(diff.rows))
            if rest_a or rest_b:
                click.echo(f"({rest_a} more {diff.unit}(s) in {a}, {rest_b} in {b} not shown)")
    if exit_code and not diff.identical:
        ctx.exit(1)


def register(main: click.Group) -> None:
    """Add `replay` and `fork` to the `tracedb` group, and `diff` under its `trace` group."""
    main.add_command(replay_command, "replay")
    main.add_command(fork_command, "fork")
    trace = main.get_command(click.Context(main), "trace")
    if trace is None:
        raise InvalidInputError("tracedb's CLI has no `trace` group to add `diff` to")
    trace.add_command(diff_command, "diff")
