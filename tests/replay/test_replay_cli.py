"""`tracedb replay`, `tracedb fork` and `tracedb trace diff` through click, on a real data directory."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import tracedb
from tracedb.cli import main
from tracedb.replay.parity import PlanStep, run_plan

ENVELOPE = {"intent": "lookup_capital", "payload": {"country": "France"}}
RESPONSE = {"status": "success", "payload": {"capital": "Paris"}, "metadata": {"agent": "geo"}}


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("TRACEDB_SIDECAR", raising=False)
    monkeypatch.delenv("TRACEDB_DATA_DIR", raising=False)
    monkeypatch.delenv("TRACEDB_CONFIG", raising=False)
    return str(tmp_path / "data")


@pytest.fixture
def ids(data_dir):
    """A completed, an invalidated and an unfinished execution, plus two plan runs."""
    out = {}
    with tracedb.open(data_dir) as s:
        ex = s.start("lookup_capital", ENVELOPE)
        ex.event("INTENT_RECEIVED", {"intent": "lookup_capital"})
        ex.event("ROUTER_DECISION", {"agent": "geo"})
        ex.finish(RESPONSE)
        out["ok"] = ex.execution_id
        ex = s.start("lookup_capital", ENVELOPE)
        ex.finish(RESPONSE)
        s.invalidate(ex.execution_id, "operator")
        out["invalid"] = ex.execution_id
        ex = s.start("lookup_capital", ENVELOPE)
        ex.event("INTENT_RECEIVED", {"intent": "lookup_capital"})
        out["incomplete"] = ex.execution_id
        skills = {"http_call": lambda p: {"ok": True}, "json_transform": lambda p: p}
        for name, q in (("plan_a", ".status"), ("plan_b", ".price")):
            ex = s.start("check_item", {"intent": "check_item"})
            run_plan(ex, [PlanStep("http_call", {"url": "X"}), PlanStep("json_transform", {"q": q})], skills)
            out[name] = ex.execution_id
    return out


def run(data_dir, *args, input=None):
    return CliRunner().invoke(main, ["--data-dir", data_dir, *args], input=input)


# -- replay --------------------------------------------------------------------------------------


def test_replay_prints_the_recorded_response(data_dir, ids):
    r = run(data_dir, "replay", ids["ok"], "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["payload"] == {"capital": "Paris"}
    assert out["fromReplay"] is True and out["originalExecutionId"] == ids["ok"]
    assert out["warnings"] == [] and out["response"] == RESPONSE


@pytest.mark.parametrize(("which", "reason"), [("invalid", "manually_invalidated"), ("incomplete", "execution_incomplete")])
def test_replay_of_a_non_replayable_record_exits_6(data_dir, ids, which, reason):
    r = run(data_dir, "replay", ids[which])
    assert r.exit_code == 6
    assert f"not replayable: {reason}" in r.stderr
    assert "hint:" in r.stderr


def test_forced_replay_warns_and_succeeds(data_dir, ids):
    r = run(data_dir, "replay", ids["incomplete"], "--force", "--json")
    assert r.exit_code == 0, r.output
    assert "warning: Forced replay of non-replayable record" in r.stderr
    assert json.loads(r.stdout)["payload"] is None


def test_replay_verifies_the_envelope_file(data_dir, ids, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(dict(ENVELOPE, routingMetadata={"host": "other"})))
    assert run(data_dir, "replay", ids["ok"], "--envelope", str(good)).exit_code == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(ENVELOPE, payload={"country": "Peru"})))
    r = run(data_dir, "replay", ids["ok"], "--envelope", str(bad))
    assert r.exit_code == 4
    assert tracedb.compute_envelope_hash(ENVELOPE) in r.stderr
    assert tracedb.compute_envelope_hash(json.loads(bad.read_text())) in r.stderr


def test_replay_reads_the_envelope_from_stdin(data_dir, ids):
    r = run(data_dir, "replay", ids["ok"], "--envelope", "-", input=json.dumps(ENVELOPE))
    assert r.exit_code == 0, r.output


def test_replay_with_an_unreadable_envelope_is_a_usage_error(data_dir, ids, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert run(data_dir, "replay", ids["ok"], "--envelope", str(broken)).exit_code == 2


def test_replay_of_a_tampered_record_exits_4(data_dir, ids):
    with tracedb.open(data_dir) as s:
        traces = sa.table("traces", sa.column("execution_id"), sa.column("envelope", sa.JSON))
        with s.engine.begin() as conn:
            conn.execute(traces.update().where(traces.c.execution_id == ids["ok"]).values(envelope={"x": 1}))
    r = run(data_dir, "replay", ids["ok"])
    assert r.exit_code == 4
    assert "record_corrupted" in r.stderr


def test_replay_of_an_unknown_id_exits_3(data_dir, ids):
    assert run(data_dir, "replay", "exec-missing").exit_code == 3


# -- fork ------------------------------------------------------------------------------------------


def test_fork_records_lineage_and_the_shared_prefix(data_dir, ids):
    r = run(data_dir, "fork", ids["ok"], "--at", "1", "--id", "exec-fork-1", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out == {
        "execution_id": "exec-fork-1",
        "parent_execution_id": ids["ok"],
        "forked_at_seq": 1,
        "copied_events": 1,
        "live": False,
    }
    assert "no recorder is running" in r.stderr
    with tracedb.open(data_dir) as s:
        child = s.get("exec-fork-1")
        assert child.to_dict()["lineage"] == {"parentExecutionId": ids["ok"], "forkedAtSeq": 1}
        assert [(e.type, e.payload) for e in child.events] == [("INTENT_RECEIVED", {"intent": "lookup_capital"})]


def test_fork_at_a_missing_seq_fails_with_a_hint(data_dir, ids):
    r = run(data_dir, "fork", ids["ok"], "--at", "99")
    assert r.exit_code == 2  # a usage error: the execution closed at seq 3
    assert "cannot fork" in r.stderr and "final response is seq 3" in r.stderr and "hint:" in r.stderr


# -- trace diff ---------------------------------------------------------------------------------------


def test_trace_diff_shows_steps_up_to_the_divergence(data_dir, ids):
    r = run(data_dir, "trace", "diff", ids["plan_a"], ids["plan_b"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[1].startswith("0") and "http_call" in lines[1] and lines[1].endswith("=")
    assert lines[2].startswith("1") and '".price"' in lines[2] and lines[2].endswith("≠")
    # Two recorded traces: A vs B, neither called the original or the replay.
    assert "first divergence at step 1: params differs: " in r.stdout and " vs " in r.stdout
    assert "original" not in r.stdout and "replay" not in r.stdout
    assert run(data_dir, "trace", "diff", ids["plan_a"], ids["plan_b"], "--exit-code").exit_code == 1


def test_trace_diff_json(data_dir, ids):
    r = run(data_dir, "trace", "diff", ids["plan_a"], ids["plan_a"], "--json", "--exit-code")
    assert r.exit_code == 0
    out = json.loads(r.stdout)
    assert out["identical"] and out["divergence_step"] is None and len(out["rows"]) == 2
    assert out["parity"]["is_parity"] is True


def test_trace_diff_of_event_traces(data_dir, ids):
    r = run(data_dir, "trace", "diff", ids["ok"], ids["incomplete"], "--json")
    out = json.loads(r.stdout)
    assert out["unit"] == "event"
    assert out["divergence_step"] == 1 and out["rows"][-1]["reason"].startswith("only in")


# -- help ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["replay"], ["fork"], ["trace", "diff"]])
def test_every_command_is_documented_with_an_example(args):
    r = CliRunner().invoke(main, [*args, "--help"])
    assert r.exit_code == 0
    assert "Example:" in r.output and "tracedb " in r.output.split("Example:")[1]
