"""What an execution came to, read from the WAL before compaction (no recorder running), is
what compaction makes of it once `tracedb recover` ran (tracedb.reads.wal_tail folds as the compactor)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tracedb.cli import main

FIELDS = ("outcome", "error", "models", "input_tokens", "output_tokens", "cost_usd", "status")


def listed(data_dir: str) -> dict:
    out = CliRunner().invoke(main, ["--data-dir", data_dir, "inspect", "--list", "--json"])
    assert out.exit_code == 0, out.output
    return {r["execution_id"]: {k: r[k] for k in FIELDS} for r in json.loads(out.stdout)}


def test_the_wal_read_before_recovery_agrees_with_compaction(recorded):
    data_dir, _ = recorded("outcomes")
    before = listed(data_dir)
    assert before["exec-failed"]["outcome"] == "failed"
    assert before["exec-failed"]["error"] == {"seq": 2, "type": "tool.responded", "code": "TOOL_TIMEOUT", "message": "took 30 s"}
    assert before["exec-left"]["outcome"] == "incomplete"  # no recorder will finish it
    assert (before["exec-left"]["input_tokens"], before["exec-left"]["cost_usd"]) == (7, None)
    assert CliRunner().invoke(main, ["--data-dir", data_dir, "recover"]).exit_code == 0
    assert listed(data_dir) == before
