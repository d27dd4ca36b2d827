"""`tracedb replay` and `tracedb trace diff`: thin commands over tracedb.replay (`tracedb fork`, a
write, is in `tracedb.cli.maintenance`).

NotReplayableError exits 6, RecordCorruptedError and ReplayHashMismatchError exit 4.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import click

from tracedb.errors import NotReplayableError
from tracedb.program import as_invoked
from tracedb.cli.main import emit_json, execution_id_argument, json_option
from tracedb.cli.read import reading

CELL = 46  # width of one side in `trace diff`


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
@execution_id_argument()
@click.option("--force", is_flag=True, help="Replay a non-replayable record anyway (debugging only).")
@click.option(
    "--envelope",
    "envelope_path",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="JSON file with the intent envelope to verify against the recorded hash ('-': stdin).",
)
@json_option("Compact one-line JSON instead of indented.")
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
    envelope = _load_envelope(envelope_path) if envelope_path else None
    with reading(ctx) as reader:
        try:
            result = reader.replay(execution_id, envelope=envelope, force=force)
        except NotReplayableError as e:
            if e.reason == "execution_incomplete" and e.execution_id and reader.get(e.execution_id).status == "running":
                # No final response *yet*: say so, rather than name the state of one that stopped.
                e.message = f"execution {e.execution_id!r} is not replayable yet: it is still running"
                e.hint = (
                    "replay it once it has finished; `tracedb trace get --follow ID` shows its events "
                    "as they come"
                )
            raise
    for warning in result.warnings:
        click.echo(f"warning: {as_invoked(warning)}", err=True)
    emit_json(result.to_dict(), as_json)


def _cell(entry: Optional[dict], unit: str) -> str:
    if entry is None:
        return "-"
    if unit == "step":
        params = entry["params"]
        text = f"{entry['skill']}({params}) {entry['status']} r={entry['retries']}"
    else:
        text = f"{entry['seq']} {entry['type']} {entry['payload']}"
    return text if len(text) <= CELL else text[: CELL - 1] + "…"


@click.command("diff")
@execution_id_argument("a", metavar="A")
@execution_id_argument("b", metavar="B")
@json_option()
@click.option("--exit-code", is_flag=True, help="Exit 1 when the traces diverge (like git diff).")
@click.pass_context
def diff_command(ctx, a, b, as_json, exit_code):
    """Show two traces side by side, up to and at their first divergent step.

    Steps are compared by the determinism signature: skill, canonical parameters, status, retry
    count (never response data, timing or cost). Traces without skill or tool steps are compared
    event by event.

    \b
    Example:
      tracedb trace diff exec-original exec-replay
    """
    with reading(ctx) as reader:
        diff = reader.diff(a, b)
    if as_json:
        emit_json(diff.to_dict(), True)
    else:
        _print_diff(diff)
    if exit_code and not diff.identical:
        ctx.exit(1)


def _print_diff(diff) -> None:
    a, b = diff.a_id, diff.b_id
    click.echo(f"{diff.unit:<5} {a[:CELL]:<{CELL}}  {b[:CELL]:<{CELL}}")
    for row in diff.rows:
        mark = "=" if row.same else "≠"
        left, right = _cell(row.a, diff.unit), _cell(row.b, diff.unit)
        click.echo(f"{row.step:<5} {left:<{CELL}}  {right:<{CELL}}  {mark}")
    if diff.identical:
        click.echo(f"identical: {diff.a_total} {diff.unit}(s)")
        return
    click.echo(f"first divergence at {diff.divergence_reason}")
    rest_a = max(0, diff.a_total - len(diff.rows))
    rest_b = max(0, diff.b_total - len(diff.rows))
    if rest_a or rest_b:
        click.echo(f"({rest_a} more {diff.unit}(s) in {a}, {rest_b} in {b} not shown)")
