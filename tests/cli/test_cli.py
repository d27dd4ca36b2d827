"""The command line: seed 002's inspect output, seed 000's states through trace get, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

import tracedb
from tracedb.projection import db
from tracedb.cli import main
from tracedb.projection.models import traces
from tracedb.projection.schema import HEAD_REVISION

from tests.fresh_python import run_fresh

from .conftest import ENVELOPE, settings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def all_commands(group: click.Group, prefix=()):
    for name in group.list_commands(None):
        cmd = group.get_command(None, name)
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from all_commands(cmd, prefix + (name,))


def test_every_command_has_help_that_ends_with_an_example(run):
    seen = []
    for path, cmd in [((), main), *all_commands(main)]:
        result = run(*path, "--help")
        assert result.exit_code == 0, path
        text = result.output
        assert "Example:" in text, path
        example = text.split("Example:")[1].split("Options:")[0]
        assert "tracedb " in example, path
        assert cmd.help and cmd.help.strip().splitlines()[-1].strip().startswith("tracedb"), path
        seen.append(" ".join(path))
    assert {"inspect", "trace get", "compact", "recover", "prune", "pin", "unpin", "invalidate",
            "verify", "migrate", "wal scan", "wal repair"} <= set(seen)


def test_inspect_list_prints_one_line_per_execution_as_in_seed_002(seeded, run):
    result = run("inspect", "--list")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    # Newest first; seed 002's five columns, then events and duration.
    assert [line.split()[:5] for line in lines] == [
        ["exec-e5f6g7h8", "2024-01-15T10:31:00Z", "ProcessIntent", "incomplete", "not-replayable"],
        ["exec-a1b2c3d4", "2024-01-15T10:30:00Z", "ProcessIntent", "completed", "replayable"],
    ]
    only = run("inspect", "--list", "--status", "incomplete")
    assert [line.split()[0] for line in only.stdout.splitlines()] == ["exec-e5f6g7h8"]
    window = run("inspect", "--list", "--since", "2024-01-15T10:30:30Z")
    assert [line.split()[0] for line in window.stdout.splitlines()] == ["exec-e5f6g7h8"]
    window = run("inspect", "--list", "--until", "2024-01-15T10:30:30Z")
    assert [line.split()[0] for line in window.stdout.splitlines()] == ["exec-a1b2c3d4"]
    as_json = json.loads(run("inspect", "--list", "--json").stdout)
    assert [(r["execution_id"], r["status"], r["replayable"]) for r in as_json] == [
        ("exec-e5f6g7h8", "incomplete", False),
        ("exec-a1b2c3d4", "completed", True),
    ]


def test_inspect_id_prints_seed_002s_json(seeded, run):
    result = run("inspect", "exec-e5f6g7h8")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "execution_id": "exec-e5f6g7h8",
        "status": "incomplete",
        "last_event": {"seq": 3, "type": "AGENT_ATTEMPT_START", "agent": "processor-a"},
        "replayable": False,
        "replayable_reason": "execution_incomplete",
        # What it came to (tracedb.records.outcomes): seed 002's attempt ended in no error event.
        "outcome": "incomplete",
        "error": None,
        "models": [],
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "errored_events": [],
    }
    assert json.loads(run("inspect", "exec-e5f6g7h8", "--json").stdout)["status"] == "incomplete"


def test_trace_get_shows_seed_000s_four_states(data_dir, run):
    with tracedb.open(data_dir, config=settings(idle_timeout_s=1)) as store:
        done = store.start("ProcessIntent", ENVELOPE, "exec-replayable")
        done.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
        done.finish({"status": "success", "payload": {"total": 42}})
        cut = store.start("ProcessIntent", ENVELOPE, "exec-incomplete")
        cut.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
        store.sweep_idle(store.clock() + 2 * 10**9)
        bad = store.start("ProcessIntent", ENVELOPE, "exec-recording-failure")
        bad.mark_recording_failure("client lost events")
        bad.finish({"status": "success"})
        gone = store.start("ProcessIntent", ENVELOPE, "exec-invalidated")
        gone.finish({"status": "success"})
    assert run("invalidate", "exec-invalidated", "--reason", "agent had a bug").exit_code == 0

    def get(eid):
        result = run("trace", "get", eid)
        assert result.exit_code == 0
        return json.loads(result.stdout)

    rec = get("exec-replayable")
    assert set(rec) >= {"header", "envelope", "routerDecision", "events", "finalResponse"}
    assert set(rec["header"]) == {"executionId", "createdUtcIso", "envelopeHash", "replayable", "replayableReason"}
    assert rec["header"]["envelopeHash"] == tracedb.compute_envelope_hash(ENVELOPE)
    assert rec["events"][0] == {"seq": 1, "type": "INTENT_RECEIVED", "payload": {"intent": "ProcessIntent"}, "error": None}
    states = {
        eid: (get(eid)["header"]["replayable"], get(eid)["header"]["replayableReason"], get(eid)["finalResponse"])
        for eid in ["exec-replayable", "exec-incomplete", "exec-recording-failure", "exec-invalidated"]
    }
    assert states == {
        "exec-replayable": (True, None, {"status": "success", "payload": {"total": 42}}),
        "exec-incomplete": (False, "execution_incomplete", None),
        "exec-recording-failure": (False, "recording_failure", {"status": "success"}),
        "exec-invalidated": (False, "manually_invalidated", {"status": "success"}),
    }
    compact = run("trace", "get", "exec-replayable", "--json").stdout
    assert len(compact.strip().splitlines()) == 1


def test_unknown_execution_exits_3_with_a_hint(seeded, run):
    for args in (["inspect", "exec-nope"], ["trace", "get", "exec-nope"], ["pin", "exec-nope"],
                 ["invalidate", "exec-nope", "--reason", "x"], ["verify", "exec-nope"]):
        result = run(*args)
        assert result.exit_code == 3, args
        assert "error: no execution 'exec-nope'" in result.stderr
        assert "hint:" in result.stderr


def test_no_store_at_the_data_dir_exits_3(run):
    result = run("inspect", "--list")
    assert result.exit_code == 3
    assert "no trace store" in result.stderr and "--data-dir" in result.stderr


def test_verify_exits_4_on_a_tampered_record(seeded, run, data_dir):
    ok = run("verify")
    assert ok.exit_code == 0 and ok.stdout.startswith("ok: 2 trace(s)")
    engine = db.create_engine(os.path.join(data_dir, "traces.db"), write=True)
    with engine.begin() as conn:
        conn.execute(traces.update().where(traces.c.execution_id == "exec-a1b2c3d4").values(envelope={"forged": True}))
    engine.dispose()
    bad = run("verify")
    assert bad.exit_code == 4
    assert "exec-a1b2c3d4: envelope hash" in bad.stdout
    assert run("verify", "exec-e5f6g7h8").exit_code == 0
    report = json.loads(run("verify", "--json").stdout)
    assert report["ok"] is False and len(report["problems"]) == 1


def test_compact_and_recover_exit_5_next_to_a_running_recorder(seeded, run, data_dir):
    with tracedb.open(data_dir, config=settings()) as store:
        ex = store.start("X", {})
        for args in (["compact"], ["recover"]):
            result = run(*args)
            assert result.exit_code == 5
            assert "in use by a running recorder" in result.stderr
            # The hint is the command's: the recorder does it, or stop it first.
            assert f"To run `tracedb {args[0]}` yourself, stop the recorder first" in result.stderr
        # Read commands and pin/invalidate work next to it.
        store.compact()
        assert run("inspect", "--list").exit_code == 0
        assert run("pin", ex.execution_id).exit_code == 0
        assert run("invalidate", ex.execution_id, "--reason", "stop it").exit_code == 0
        assert store.list(status="invalidated")[0].pinned is True


def test_recover_after_a_crash_reports_what_it_marked(data_dir, run):
    # A recorder that died: its executions are still "running" in the database.
    store = tracedb.open(data_dir, config=settings())
    store.start("X", {}, "exec-cut").event("INTENT_RECEIVED", {"intent": "X"})
    store.scheduler.compactor.compact(store._wal.durable_lsn)
    store._shutdown_resources()  # released without close(): like a crash, minus the kill
    listing = run("inspect", "--list")
    assert "note: no recorder is running" in listing.stderr
    result = run("recover", "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["incomplete_ids"] == ["exec-cut"]
    assert run("inspect", "exec-cut").stdout.count("execution_incomplete") == 1
    again = json.loads(run("recover", "--json").stdout)
    assert again["marked_incomplete"] == 0


def test_compact_prune_pin_migrate_wal_scan(seeded, run, data_dir):
    assert "applied LSN" in run("compact").stdout
    assert json.loads(run("wal", "scan", "--json").stdout)["damages"] == []
    assert run("pin", "exec-a1b2c3d4").stdout.strip() == "pinned exec-a1b2c3d4"
    dry = json.loads(run("prune", "--older-than", "1s", "--dry-run", "--json").stdout)
    assert (dry["deleted_traces"], dry["kept_pinned"]) == (1, 1)
    said = run("prune", "--older-than", "1s", "--dry-run").stdout
    assert said.startswith("would delete 1 trace(s)") and "freed" not in said  # a dry run frees nothing
    real = json.loads(run("prune", "--older-than", "1s", "--json").stdout)
    assert (real["dry_run"], real["deleted_traces"], real["deleted_steps"]) == (False, 1, 3)
    assert json.loads(run("prune", "--older-than", "1s", "--json").stdout)["deleted_traces"] == 0
    assert run("unpin", "exec-a1b2c3d4").exit_code == 0
    said = run("prune", "--older-than", "1s").stdout
    assert "deleted 1 trace(s)" in said and "; freed " in said
    assert run("migrate").stdout.startswith(f"schema at {HEAD_REVISION}")
    assert run("prune", "--older-than", "soon").exit_code == 2  # a bad option value is a usage error
    assert run("inspect", "--list", "--limit", "0").exit_code == 2  # a page of nothing is no page


def test_the_command_runs_as_a_real_process(seeded, data_dir):
    env = dict(os.environ, PYTHONPATH=REPO, TRACEDB_DATA_DIR=data_dir)
    out = subprocess.run([sys.executable, "-m", "tracedb", "inspect", "exec-a1b2c3d4", "--json"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "completed"
    out = subprocess.run([sys.executable, "-m", "tracedb", "trace", "get", "exec-missing"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 3


def _log_with_a_torn_end_before_a_successor(data_dir):
    """Two segments, the first cut inside its SEAL: what a scan may see when it reads a
    segment just as a live writer seals it; with no writer, it is corruption."""
    import os

    import wal

    wal_dir = os.path.join(data_dir, "wal")
    with wal.Wal(wal_dir, segment_size_bytes=256) as w:
        for i in range(4):
            w.append(b"record %d " % i + b"x" * 60)
    assert len(wal.list_segments(wal_dir)) == 2
    first = wal.list_segments(wal_dir)[0].path
    with open(first, "r+b") as f:
        f.truncate(os.path.getsize(first) - 10)
    return wal_dir


def test_wal_scan_reports_corruption_when_no_recorder_holds_the_log(run, data_dir):
    _log_with_a_torn_end_before_a_successor(data_dir)
    result = run("wal", "scan", "--json")
    out = json.loads(result.stdout)
    assert result.exit_code == 4 and out["live"] is False
    assert [d["live_tail"] for d in out["damages"]] == [False]


def test_wal_scan_next_to_a_running_recorder_does_not_judge_the_live_tail(run, data_dir):
    import os

    from wal import acquire_dir_lock

    wal_dir = _log_with_a_torn_end_before_a_successor(data_dir)
    fd = acquire_dir_lock(wal_dir)  # stands for the recorder that holds the log
    try:
        result = run("wal", "scan", "--json")
    finally:
        os.close(fd)
    out = json.loads(result.stdout)
    assert result.exit_code == 0 and out["live"] is True
    assert [d["live_tail"] for d in out["damages"]] == [True]


def test_the_command_line_starts_without_loading_the_database_layer():
    # `tracedb --help` and a usage error must stay fast: SQLAlchemy, the models (pydantic),
    # Alembic and the replay engines load only when a command runs.
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from tracedb.cli import main\n"
        "r = CliRunner().invoke(main, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "r = CliRunner().invoke(main, ['inspect', '--list', '--before', 'not-a-cursor'])\n"
        "assert r.exit_code == 2, r.output\n"
        "heavy = sorted(m for m in ('sqlalchemy', 'sqlmodel', 'pydantic', 'alembic', 'tracedb.replay') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    assert run_fresh(code) == []


def test_the_replay_names_are_tracedbs_though_loaded_when_first_asked_for():
    # `import tracedb` does not load the replay engines, yet their names are the package's:
    # attributes, `from tracedb import *`, dir() and help().
    code = (
        "import sys, pydoc, tracedb\n"
        "print('tracedb.replay' in sys.modules)\n"
        "print('ReplayEngine' in dir(tracedb), 'ReplayEngine' in pydoc.render_doc(tracedb))\n"
        "ns = {}\n"
        "exec('from tracedb import *', ns)\n"
        "print(ns['ReplayEngine'] is tracedb.ReplayEngine is tracedb.replay.ReplayEngine, 'Store' in ns)\n"
        "print(hasattr(tracedb, 'NoSuchName'))\n"
    )
    assert run_fresh(code) == ["False", "True", "True", "True", "True", "False"]


def test_reads_and_listings_do_not_load_pydantic(seeded):
    # pydantic is the largest import a command could make: neither a read nor a listing loads it
    # (a listed row is a plain dataclass); `verify`, which reads through the SQLModel-declared
    # tables, does.
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from tracedb.cli import main\n"
        f"d = {seeded!r}\n"
        "for args in (['trace', 'get', 'exec-a1b2'], ['replay', 'exec-a1b2'], ['inspect', 'exec-e5f6']):\n"
        "    r = CliRunner().invoke(main, ['--data-dir', d, *args])\n"
        "    assert r.exit_code == 0, (args, r.output)\n"
        "print('pydantic' in sys.modules, 'sqlmodel' in sys.modules)\n"
        "r = CliRunner().invoke(main, ['--data-dir', d, 'inspect', '--list'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print('pydantic' in sys.modules)\n"
        "r = CliRunner().invoke(main, ['--data-dir', d, 'verify'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print('sqlmodel' in sys.modules)\n"
    )
    assert run_fresh(code, timeout_s=120) == ["False", "False", "False", "True"]


def test_version(run):
    import tracedb

    r = run("--version")
    assert r.exit_code == 0 and r.output.strip() == f"tracedb {tracedb.__version__}"
    assert tracedb.__version__[0].isdigit()


def test_a_reader_that_stops_early_ends_the_listing_quietly_with_success(data_dir):
    # `tracedb inspect --list --all | head -1` under `set -o pipefail`: exit 0, no traceback.
    import subprocess
    import sys

    with tracedb.open(data_dir, config=settings()) as store:
        for i in range(3000):
            store.start("Many", {"i": i}).finish({"status": "success"})
    script = (
        f"{sys.executable} -m tracedb --data-dir {data_dir} inspect --list --all --json | head -c 200 >/dev/null; "
        "echo rc=${PIPESTATUS[0]}"
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "rc=0", out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "Broken pipe" not in out.stderr


@pytest.mark.parametrize(
    "age, says",
    [("30x", "not a duration"), ("-5d", "negative duration"), ("nan", "not a duration"),
     ("inf", "not a duration"), ("1e400d", "not a duration"), ("", "not a duration"),
     ("1000000000d", "longer than 10,000 years")],
)
def test_a_bad_age_for_prune_is_a_usage_error_that_deletes_nothing(seeded, run, age, says):
    r = run("prune", "--older-than", age)
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output
    assert run("inspect", "exec-a1b2c3d4").exit_code == 0


@pytest.mark.parametrize("days", ["nan", "inf", "-1"])
def test_retention_days_must_be_a_finite_age(days, monkeypatch):
    from tracedb.config import load_config

    monkeypatch.setenv("TRACEDB_RETENTION_DAYS", days)
    with pytest.raises(tracedb.ConfigError):
        load_config()


@pytest.mark.parametrize("args", [["compact"], ["recover"]])
def test_maintenance_refuses_a_data_directory_that_does_not_exist(tmp_path, args):
    # A mistyped --data-dir must not start an empty store and report success.
    missing = tmp_path / "no-such-dir"
    r = CliRunner().invoke(main, ["--data-dir", str(missing), *args])
    assert r.exit_code == 3, r.output
    assert f"no trace store at {missing}" in r.output and "hint:" in r.output
    assert not missing.exists()


def test_migrate_create_makes_a_new_store(tmp_path):
    target = tmp_path / "new"
    r = CliRunner().invoke(main, ["--data-dir", str(target), "migrate", "--create"])
    assert r.exit_code == 0 and r.output.startswith(f"schema at {HEAD_REVISION}")
    assert (target / "traces.db").exists()


@pytest.mark.parametrize("args", [["wal", "scan"], ["wal", "repair"]])
def test_the_wal_commands_on_a_missing_directory_exit_3_with_a_hint(tmp_path, args):
    r = CliRunner().invoke(main, ["--data-dir", str(tmp_path / "nope"), *args])
    assert r.exit_code == 3 and "no trace store at" in r.output and "hint:" in r.output
    assert not (tmp_path / "nope").exists()


def test_shell_completion_as_the_readme_documents_it(tmp_path):
    # The script the README tells users to eval, and what it answers for a partial command.
    import subprocess
    import sys

    exe = [sys.executable, "-m", "tracedb"]
    env = dict(os.environ, _TRACEDB_COMPLETE="bash_source")
    script = subprocess.run(exe, env=env, capture_output=True, text=True, timeout=60)
    assert script.returncode == 0 and "_tracedb_completion" in script.stdout
    env = dict(os.environ, _TRACEDB_COMPLETE="bash_complete", COMP_WORDS="tracedb ins", COMP_CWORD="1")
    words = subprocess.run(exe, env=env, capture_output=True, text=True, timeout=60).stdout
    assert "inspect" in words
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "README.md")) as f:
        assert "_TRACEDB_COMPLETE=bash_source tracedb" in f.read()


def test_byte_counts_read_as_people_read_them(seeded, run):
    from tracedb.cli.main import format_bytes

    assert [format_bytes(n) for n in (0, 512, 1023, 1024, 41_000_000, 3 * 2**30, 5 * 2**40)] == [
        "0 B", "512 B", "1023 B", "1.0 KiB", "39.1 MiB", "3.0 GiB", "5.0 TiB",
    ]
    out = run("prune", "--older-than", "1s").stdout
    assert "freed " in out and "byte(s)" not in out


def test_the_data_directory_is_found_upward_as_git_finds_dot_git(tmp_path):
    import subprocess
    import sys

    project = tmp_path / "project"
    with tracedb.open(str(project / ".tracedb"), config=settings()) as store:
        eid = store.start("Found", {}).execution_id
    deeper = project / "src" / "agents"
    deeper.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("TRACEDB_DATA_DIR", "TRACEDB_CONFIG", "TRACEDB_DB_URL")}
    r = subprocess.run([sys.executable, "-m", "tracedb", "inspect", "--list"], cwd=deeper, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == eid
    # Nowhere up from a directory outside the project: not found, and the hint says where it looked.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run([sys.executable, "-m", "tracedb", "inspect", "--list"], cwd=elsewhere, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "its parents" in r.stderr


def test_export_to_a_missing_directory_is_a_usage_error_and_a_trailing_slash_means_a_directory(seeded, tmp_path):
    import subprocess
    import sys

    def export(*args):
        return subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", seeded, "export", "exec-a1b2", *args],
                              capture_output=True, text=True, timeout=120)

    r = export("-o", str(tmp_path / "nowhere" / "x.json"))
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = export("--format", "otlp-json", "-o", str(tmp_path / "out dir") + "/")
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (tmp_path / "out dir").iterdir()] == ["exec-a1b2c3d4.json"]
