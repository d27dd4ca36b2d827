"""The commands tracedb prints run as printed: with no `tracedb` on PATH they name the program the
way it was started (`bin/tracedb`, `python -m tracedb`), with it on PATH plain `tracedb`. Each test
runs tracedb as a real process, takes a command from what it printed, and runs that."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import orjson
import pytest

from .conftest import settings

BIN = os.path.dirname(sys.executable)
VENV = os.path.dirname(BIN)
SYSTEM_PATH = "/usr/bin:/bin"

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "tracedb")),
                                reason="the tracedb console script is not installed next to this Python")


def env(data_dir: str, path: str) -> dict:
    out = {k: v for k, v in os.environ.items()
           if not k.startswith("TRACEDB_") and k not in ("PYTHONPATH", "PATH")}
    return dict(out, PATH=path, TRACEDB_DATA_DIR=data_dir)


@pytest.fixture
def store(tmp_path) -> str:
    """A store with one completed execution and one its recorder (SIGKILLed) left running."""
    if shutil.which("tracedb", path=SYSTEM_PATH):
        pytest.skip(f"a tracedb is installed on {SYSTEM_PATH}")
    data_dir = str(tmp_path / "data")
    code = (
        "import os, signal, tracedb\n"
        f"s = tracedb.open({data_dir!r}, config={settings()!r})\n"
        "s.start('Done', {}, 'exec-done-1').finish({'status': 'success'})\n"
        "s.start('Left', {}, 'exec-left-2').event('INTENT_RECEIVED', {})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert killed.returncode == -9, killed.stderr
    return data_dir


def run(argv, data_dir, path, cwd=None):
    return subprocess.run(argv, env=env(data_dir, path), cwd=cwd, capture_output=True, text=True, timeout=120)


def quoted(text: str, ending: str) -> str:
    """The one command in backquotes in `text` that ends with `ending`."""
    (cmd,) = [c for c in re.findall(r"`([^`]+)`", text) if c.endswith(ending)]
    return cmd


# What each command prints and the command in it that ends with the given words.
CASES = [
    (["inspect", "--list"], "recover"),               # the note: one left running with no recorder
    (["inspect", "exec-nosuch"], "inspect --list"),  # the hint of an error
    (["inspect", "exec-nosuch", "--json"], "inspect --list"),  # the same hint, in the JSON error
    (["inspect", "--lisst"], "inspect --help"),       # the hint of a usage error
]


@pytest.mark.parametrize("argv, ending", CASES)
def test_off_path_a_printed_command_names_the_path_tracedb_was_started_by(store, argv, ending):
    started = os.path.join(os.path.basename(BIN), "tracedb")  # relative, from the venv's directory
    r = run([started, *argv], store, SYSTEM_PATH, cwd=VENV)
    cmd = quoted(r.stderr, ending)
    assert shlex.split(cmd)[0] == started, r.stderr
    again = run(shlex.split(cmd), store, SYSTEM_PATH, cwd=VENV)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("argv, ending", CASES)
def test_on_path_a_printed_command_says_tracedb(store, argv, ending, tmp_path):
    r = run(["tracedb", *argv], store, f"{BIN}:{SYSTEM_PATH}", cwd=tmp_path)
    cmd = quoted(r.stderr, ending)
    assert shlex.split(cmd)[0] == "tracedb", r.stderr
    assert run(shlex.split(cmd), store, f"{BIN}:{SYSTEM_PATH}", cwd=tmp_path).returncode == 0


def test_a_symlink_on_path_to_this_tracedb_says_tracedb(store, tmp_path):
    links = tmp_path / "bin"
    links.mkdir()
    (links / "tracedb").symlink_to(os.path.join(BIN, "tracedb"))
    r = run(["tracedb", "inspect", "exec-nosuch"], store, f"{links}:{SYSTEM_PATH}", cwd=tmp_path)
    assert quoted(r.stderr, "inspect --list") == "tracedb inspect --list", r.stderr


def test_another_tracedb_first_on_path_is_not_the_one_printed(store, tmp_path):
    other = tmp_path / "other-bin"
    other.mkdir()
    (other / "tracedb").write_text("#!/bin/sh\necho 'not this tracedb' >&2\nexit 99\n")
    (other / "tracedb").chmod(0o755)
    started = os.path.join(BIN, "tracedb")
    r = run([started, "inspect", "exec-nosuch"], store, f"{other}:{SYSTEM_PATH}")
    cmd = quoted(r.stderr, "inspect --list")
    assert shlex.split(cmd)[0] == started
    assert run(shlex.split(cmd), store, f"{other}:{SYSTEM_PATH}").returncode == 0


def test_python_m_tracedb_off_path_prints_that_interpreter_and_module(store, tmp_path):
    r = run([sys.executable, "-m", "tracedb", "inspect", "--list"], store, SYSTEM_PATH, cwd=tmp_path)
    cmd = quoted(r.stderr, "recover")
    assert shlex.split(cmd)[:3] == [sys.executable, "-m", "tracedb"], r.stderr
    assert run(shlex.split(cmd), store, SYSTEM_PATH, cwd=tmp_path).returncode == 0


def test_the_demo_next_commands_run_as_printed_off_path(tmp_path):
    if shutil.which("tracedb", path=SYSTEM_PATH):
        pytest.skip(f"a tracedb is installed on {SYSTEM_PATH}")
    started = os.path.join(BIN, "tracedb")
    data_dir = str(tmp_path / "demo")
    r = run([started, "--data-dir", data_dir, "demo", "--start-server", "--executions", "1"], data_dir,
            SYSTEM_PATH, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    commands = [line.split("#")[0].strip() for line in r.stdout.split("next:\n", 1)[1].splitlines() if line.strip()]
    assert len(commands) == 4, r.stdout
    elsewhere = tmp_path / "elsewhere"  # the data directory is in the commands, not only in the env
    elsewhere.mkdir()
    environment = {k: v for k, v in env(data_dir, SYSTEM_PATH).items() if k != "TRACEDB_DATA_DIR"}
    for cmd in commands:
        argv = shlex.split(cmd)
        assert argv[:3] == [started, "--data-dir", data_dir], cmd
        done = subprocess.run(argv, env=environment, cwd=elsewhere, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (cmd, done.stderr)


def test_the_web_view_offers_a_replay_command_that_runs_as_printed(store, tmp_path):
    import urllib.request

    started = os.path.join(os.path.basename(BIN), "tracedb")
    proc = subprocess.Popen([started, "ui", "--port", "0", "--json"], env=env(store, SYSTEM_PATH), cwd=VENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.poll() is not None else "no address printed"
        url, _, token = orjson.loads(line)["url"].partition("?token=")  # the address carries the token once
        request = urllib.request.Request(url + "e/exec-done-1", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            page = resp.read().decode()
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    import html

    (cmd,) = [html.unescape(c) for c in re.findall(r'<div class="cmd"><code>([^<]*)</code>', page)]
    argv = shlex.split(cmd)
    assert argv[0] == started and argv[-2:] == ["replay", "exec-done-1"], cmd
    assert run(argv, store, SYSTEM_PATH, cwd=VENV).returncode == 0
