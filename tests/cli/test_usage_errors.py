"""Mistakes in a command are usage errors (exit 2) in the one shape every error has, `error:` and
`hint:`; a prefix without its kind says which id it may have meant; `migrate` makes a new store."""

from __future__ import annotations

import asyncio
import os
import sqlite3

import orjson
import pytest
from click.testing import CliRunner

from tracedb.cli import main
from tracedb.projection.schema import HEAD_REVISION

pytestmark = pytest.mark.timeout(120)


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args), prog_name="tracedb")


def _usage_error(r, says: str) -> None:
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and says in lines[0], r.stderr
    assert lines[1] == "hint: see `tracedb --help`" or lines[1].startswith("hint: see `tracedb "), lines[1]
    assert "Usage:" not in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("args, says", [
    (["--bogus", "inspect", "--list"], "No such option '--bogus'"),
    (["--data-dir"], "Option '--data-dir' requires an argument"),
    (["--data-dir", __file__, "inspect", "--list"], "is a file"),
    (["--db"], "Option '--db' requires an argument"),
])
def test_global_option_errors_are_one_error_and_one_hint(args, says):
    _usage_error(_invoke(*args), says)


def test_global_option_errors_with_json_are_one_json_error():
    r = _invoke("--bogus", "inspect", "--list", "--json")
    assert r.exit_code == 2
    assert orjson.loads(r.stderr)["error"] == {
        "message": "No such option '--bogus'.", "hint": "see `tracedb --help`", "exit_code": 2,
    }


def test_no_arguments_still_show_the_help():
    r = _invoke()
    assert "Usage: tracedb" in r.output and "Commands:" in r.output


@pytest.mark.parametrize("args", [
    ["inspect", ""], ["inspect", "  "], ["trace", "get", ""], ["trace", "diff", "exec-a1b2c3d4", ""],
    ["replay", ""], ["fork", "", "--at", "1"], ["pin", ""], ["export", ""], ["verify", ""],
])
def test_an_empty_execution_id_is_a_usage_error(seeded, args):
    r = _invoke("--data-dir", seeded, *args)
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert "is empty" in r.stderr and "hint: " in r.stderr and "Traceback" not in r.output


@pytest.mark.parametrize("eid, at, says", [
    ("exec-a1b2c3d4", 999, "its final response is seq 8"),
    ("exec-a1b2c3d4", 8, "its final response is seq 8"),
    ("exec-e5f6g7h8", 999, "has no event with seq 999 (last seq 3)"),
])
def test_a_fork_point_past_the_end_is_a_usage_error(seeded, eid, at, says):
    before = _invoke("--data-dir", seeded, "inspect", "--list", "--json").stdout
    r = _invoke("--data-dir", seeded, "fork", eid, "--at", str(at))
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and says in lines[0] and lines[1].startswith("hint: "), r.stderr
    assert _invoke("--data-dir", seeded, "inspect", "--list", "--json").stdout == before  # no fork made


def test_a_fork_point_within_the_execution_still_forks(seeded):
    r = _invoke("--data-dir", seeded, "fork", "exec-a1b2c3d4", "--at", "7", "--json")
    assert r.exit_code == 0, r.output
    assert orjson.loads(r.stdout)["forked_at_seq"] == 7


def test_a_prefix_without_its_kind_gets_a_hint_naming_the_id_it_may_mean(seeded):
    r = _invoke("--data-dir", seeded, "inspect", "a1b2")
    assert r.exit_code == 3, r.output
    assert r.stderr.splitlines() == [
        "error: no execution 'a1b2'",
        "hint: ids start with their kind: did you mean 'exec-a1b2'? (a prefix matches from the start of the id)",
    ]
    # A prefix that matches nothing, with a kind or without, keeps the plain hint.
    for prefix in ("zz99", "exec-zz99"):
        r = _invoke("--data-dir", seeded, "trace", "get", prefix)
        assert r.exit_code == 3 and "inspect --list" in r.stderr and "did you mean" not in r.stderr, r.stderr


def test_the_readers_give_the_same_hint(seeded):
    from tracedb.config import load_config
    from tracedb.errors import ExecutionNotFoundError
    from tracedb.reads.reader import AsyncReader, Reader

    config = load_config(None, overrides={"data_dir": seeded})
    with Reader.open(config) as reader, pytest.raises(ExecutionNotFoundError) as sync_err:
        reader.resolve("e5f6")

    async def resolve():
        reader = await AsyncReader.open(config)
        try:
            await reader.resolve("e5f6")
        finally:
            await reader.close()

    with pytest.raises(ExecutionNotFoundError) as async_err:
        asyncio.run(resolve())
    assert "'exec-e5f6'" in sync_err.value.hint and async_err.value.hint == sync_err.value.hint


def test_migrate_on_a_new_directory_creates_the_store(tmp_path):
    target = tmp_path / "new" / "data"
    r = _invoke("--data-dir", str(target), "migrate")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"schema at {HEAD_REVISION} (was empty)")
    conn = sqlite3.connect(str(target / "traces.db"))
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()
    assert {"traces", "trace_steps", "compaction_checkpoint", "alembic_version"} <= tables
    assert _invoke("--data-dir", str(target), "inspect", "--list", "--json").stdout.strip() == "[]"
    again = _invoke("--data-dir", str(target), "migrate", "--create")  # the older flag is still taken
    assert again.exit_code == 0 and again.stdout.strip() == f"schema at {HEAD_REVISION}"
    assert os.listdir(target)  # and nothing else was asked for
