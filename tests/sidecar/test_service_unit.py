"""config/tracedb.service: systemd accepts it, and its ExecStart starts a recorder that stops
cleanly on the unit's KillSignal."""

from __future__ import annotations

import configparser
import os
import shutil
import signal
import subprocess
import sys

import pytest

from tests.waiting import wait_until

from .conftest import ROOT

UNIT = os.path.join(ROOT, "config", "tracedb.service")


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    parser.read(UNIT)
    return parser


def _exec_start(tracedb_bin: str) -> list[str]:
    return _unit()["Service"]["ExecStart"].replace("/opt/tracedb/.venv/bin/tracedb", tracedb_bin).split()


def test_systemd_accepts_the_unit(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here (Debian package systemd)")
    text = open(UNIT).read().replace("/opt/tracedb/.venv/bin/tracedb", os.path.join(os.path.dirname(sys.executable), "tracedb"))
    text = text.replace("User=tracedb", "User=root").replace("Group=tracedb", "Group=root")
    unit = tmp_path / "tracedb.service"
    unit.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "tracedb.service" not in r.stderr, r.stderr


def test_its_exec_start_runs_a_recorder_that_stops_on_the_kill_signal(tmp_path):
    assert _unit()["Service"]["KillSignal"] == "SIGTERM"
    data_dir = tmp_path / "state"
    env = dict(os.environ, TRACEDB_DATA_DIR=str(data_dir))
    argv = _exec_start(os.path.join(os.path.dirname(sys.executable), "tracedb"))
    port = argv.index("--metrics-port") + 1
    argv[port] = "0"  # any free port: the unit's own may be taken on this machine
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: (data_dir / "tracedb.sock").exists() or proc.poll() is not None, 60, "the recorder to listen")
        assert proc.poll() is None, proc.stderr.read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
