"""`tracedb invalidate` and `tracedb pin` from the command line, next to a running recorder and
with none: the recorder refuses the execution's next event at once, and an execution only the
WAL holds is an error that says to recover first."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tracedb.errors import ExecutionClosedError
from tracedb.sidecar.client import Client

from tests.serving import ROOT


def _tracedb(data_dir: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TRACEDB_SIDECAR", None)
    return subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", data_dir, *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_invalidate_next_to_a_recorder_refuses_the_next_event_at_once(tdir, serve_process):
    rec = serve_process()
    with Client(rec.socket) as client:
        ex = client.start("inv.cli", {"intent": "inv.cli"})
        assert ex.event("myapp.step", {"i": 1}) == 1
        r = _tracedb(tdir, "invalidate", ex.execution_id, "--reason", "agent had a bug")
        assert r.returncode == 0 and f"invalidated {ex.execution_id}" in r.stdout, r.stderr
        with pytest.raises(ExecutionClosedError):
            ex.event("myapp.step", {"i": 2})
        record = client.get(ex.execution_id)
        assert record.status == "invalidated" and [e.seq for e in record.events] == [1]
        r = _tracedb(tdir, "invalidate", ex.execution_id, "--reason", "again")
        assert r.returncode == 0 and "was already invalidated" in r.stdout, r.stderr
    rec.terminate()
    r = _tracedb(tdir, "inspect", ex.execution_id, "--json")
    view = json.loads(r.stdout)
    assert view["replayable_reason"] == "manually_invalidated" and view["note"] == "agent had a bug", view


@pytest.mark.parametrize("reason", ["", "   ", "x" * 4097])
def test_an_empty_or_overlong_reason_is_a_usage_error(tdir, reason):
    r = _tracedb(tdir, "invalidate", "exec-any", "--reason", reason)
    assert r.returncode == 2 and "--reason" in r.stderr, r.stderr


def test_pin_and_invalidate_of_an_execution_only_the_wal_holds_say_to_recover_first(tdir):
    code = (
        "import os, tracedb\n"
        f"s = tracedb.open({tdir!r}, config={{'compact_interval_ms': 0}})\n"
        "ex = s.start('Q', {'intent': 'Q'}, execution_id='wal-only-1')\n"
        "ex.event('tool.requested', {'a': 1}); ex.finish({'status': 'success'})\n"
        "os._exit(0)\n"  # no close: nothing compacted
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    assert _tracedb(tdir, "inspect", "wal-only-1").returncode == 0  # the read shows it from the WAL
    for args in (["pin", "wal-only-1"], ["invalidate", "wal-only-1", "--reason", "r"]):
        r = _tracedb(tdir, *args)
        assert r.returncode == 3 and "only in the WAL" in r.stderr and "tracedb recover" in r.stderr, r.stderr
    assert _tracedb(tdir, "recover").returncode == 0
    assert _tracedb(tdir, "pin", "wal-only-1").returncode == 0
    r = _tracedb(tdir, "invalidate", "wal-only-1", "--reason", "r")
    assert r.returncode == 0 and "invalidated wal-only-1" in r.stdout, r.stderr
