"""Every command, given bad input, answers with an error and a hint and a stable exit code,
never a traceback: a missing data directory, an unknown execution, and bad option values."""

from __future__ import annotations

import os

import click
import pytest
from click.testing import CliRunner

from tracedb.cli import main

# Commands that record or serve (their bad input has tests of its own) are left out of the walk.
NOT_WALKED = {"serve", "demo", "ui"}


def _commands(group: click.Group, prefix=()):
    # Through list_commands/get_command: a lazy group loads its commands when asked for one.
    ctx = click.Context(group)
    for name in sorted(group.list_commands(ctx)):
        cmd = group.get_command(ctx, name)
        if name in NOT_WALKED:
            continue
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, prefix + (name,))
        else:
            yield prefix + (name,), cmd


def _args_for(cmd: click.Command, execution_id: str) -> list[str]:
    """The command's required arguments and options, filled with `execution_id` or junk."""
    args: list[str] = []
    for p in cmd.params:
        if isinstance(p, click.Argument) and p.required:
            args += [execution_id] * (p.nargs if p.nargs > 0 else 1)
        elif isinstance(p, click.Option) and p.required:
            args += [p.opts[-1], "1" if p.type is click.INT or isinstance(p.type, click.types.IntParamType) else "why"]
    return args


WALK = list(_commands(main))
assert len(WALK) > 20, WALK  # the walk must find the commands, or every test below is skipped


def _invoke(tmp_path, args):
    # In a scratch working directory: a command that writes where it is told (backup DEST)
    # writes there, not into the checkout.
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        return CliRunner().invoke(main, args)
    finally:
        os.chdir(here)


def _ok(result) -> None:
    # A usage error or a TraceDBError ends in SystemExit; anything else escaped as a traceback.
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"traceback: {result.exception!r}\n{result.output}"
    )
    assert "Traceback" not in result.output


@pytest.mark.parametrize("path, cmd", WALK, ids=[" ".join(p) for p, _ in WALK])
def test_missing_data_directory(tmp_path, path, cmd):
    missing = str(tmp_path / "no-such-dir")
    r = _invoke(tmp_path, ["--data-dir", missing, *path, *_args_for(cmd, "exec-nope")])
    _ok(r)
    if path == ("migrate",):
        # Making a new store is what migrate is for (README): the one command that makes one.
        assert r.exit_code == 0 and (tmp_path / "no-such-dir" / "traces.db").exists(), r.output
        return
    assert r.exit_code in (2, 3), r.output
    assert not (tmp_path / "no-such-dir").exists()


@pytest.mark.parametrize("path, cmd", WALK, ids=[" ".join(p) for p, _ in WALK])
def test_unknown_execution_in_an_existing_store(seeded, tmp_path, path, cmd):
    r = _invoke(tmp_path, ["--data-dir", seeded, *path, *_args_for(cmd, "exec-nope")])
    _ok(r)
    if any(isinstance(p, click.Argument) and p.required for p in cmd.params) and path != ("backup",):
        # (backup's argument is where to write: a new directory is fine)
        assert r.exit_code in (2, 3), r.output
        assert "error:" in r.output


@pytest.mark.parametrize("path, cmd", WALK, ids=[" ".join(p) for p, _ in WALK])
def test_an_unknown_option(seeded, tmp_path, path, cmd):
    r = _invoke(tmp_path, ["--data-dir", seeded, *path, "--no-such-option"])
    _ok(r)
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: ")


def test_every_command_takes_json_and_reports_its_errors_as_json_then(seeded, tmp_path):
    import json

    without = [" ".join(p) for p, cmd in _commands(main) if not any(x.name == "as_json" for x in cmd.params)]
    assert without == []
    for args, code in ((["inspect", "exec-nope", "--json"], 3), (["inspect", "--list", "--status", "bogus", "--json"], 2),
                       (["pin", "exec-nope", "--json"], 3)):
        r = _invoke(tmp_path, ["--data-dir", seeded, *args])
        assert r.exit_code == code
        err = json.loads(r.stderr.strip().splitlines()[-1])["error"]
        assert err["exit_code"] == code and err["message"] and "hint" in err
