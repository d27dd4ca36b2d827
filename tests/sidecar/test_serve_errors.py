"""`tracedb serve` on a busy address: one error line and one hint, no traceback, the store closed."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


@pytest.mark.parametrize("flag", ["--http-port", "--metrics-port", "--tcp"])
def test_a_busy_port_is_one_error_and_one_hint(tmp_path, flag):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    value = f"127.0.0.1:{port}" if flag == "--tcp" else str(port)
    data_dir = tmp_path / "d"
    try:
        r = subprocess.run(
            [sys.executable, "-m", "tracedb", "--data-dir", str(data_dir), "serve", flag, value],
            capture_output=True, text=True, timeout=120,
        )
    finally:
        holder.close()
    assert r.returncode == 1
    lines = [line for line in r.stderr.splitlines() if not line.startswith("{")]  # JSON log lines
    named = "--tcp" if flag == "--tcp" else "--http-port"  # --metrics-port is its older name
    assert len(lines) == 2 and lines[0].startswith("error: cannot listen") and f"{named} " in lines[0]
    assert lines[1].startswith("hint: ")
    assert "Traceback" not in r.stderr
    # Nothing is left listening, or pretending to: no socket file stays behind.
    assert not (data_dir / "tracedb.sock").exists()
    # The store it opened was closed again: the next recorder takes the data directory at once.
    import tracedb

    with tracedb.open(str(data_dir), config={"compact_interval_ms": 0}):
        pass


@pytest.mark.parametrize("args, says", [
    (["--tcp", "127.0.0.1:99999"], "a port is 0 to 65535"),
    (["--tcp", "99999"], "a port is 0 to 65535"),
    (["--http-port", "18470", "--metrics-port", "18471"], "older name of --http-port"),
])
def test_impossible_listener_flags_are_usage_errors_before_anything_starts(tmp_path, args, says):
    data_dir = tmp_path / "d"
    r = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", str(data_dir), "serve", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not data_dir.exists()  # refused before the store was opened
