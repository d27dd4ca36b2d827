"""`tracedb ui` with no recorder running shows what the read commands show: executions that only
the WAL holds (recorded, not compacted yet), an execution its recorder left running read as
incomplete with the events the WAL adds, and a record that fails verification as not
replayable, in the list, the counts, the execution page and the payload viewer."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys

import orjson
import pytest

from .conftest import REPO, UiProcess
from .conftest import owner_get as _get

pytestmark = pytest.mark.timeout(180)
TAMPERED = "exec-done-1"


@pytest.fixture(scope="module")
def crashed_ui(tmp_path_factory):
    """A recorder SIGKILLed with compaction held off: exec-done-0..2 compacted and completed,
    exec-left-running compacted up to its first event, then (WAL only) its second event and
    the whole of exec-wal-only, completed. exec-done-1's envelope is then changed by one byte in
    the database. `tracedb ui` on it; (base URL)."""
    data_dir = str(tmp_path_factory.mktemp("pending") / "data")
    code = (
        "import os, signal, tracedb\n"
        f"s = tracedb.open({data_dir!r}, config={{'compact_interval_ms': 0, 'idle_timeout_s': 0}})\n"
        "for i in range(3):\n"
        "    ex = s.start('Done', {'intent': 'Done', 'doc': 'invoice-17'}, f'exec-done-{i}')\n"
        "    ex.event('tool.requested', {'name': 'lookup'})\n"
        "    ex.finish({'status': 'success'})\n"
        "ex = s.start('Crashy', {'intent': 'Crashy'}, 'exec-left-running')\n"
        "ex.event('tool.requested', {'name': 'x'})\n"
        "s.compact()\n"
        "ex.event('tool.responded', {'name': 'x', 'from': 'the WAL'})\n"
        "w = s.start('WalOnly', {'intent': 'WalOnly'}, 'exec-wal-only')\n"
        "w.event('tool.requested', {'name': 'y', 'from': 'the WAL'})\n"
        "w.finish({'status': 'success'})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, timeout=60)
    assert killed.returncode == -9, killed.stderr
    with sqlite3.connect(os.path.join(data_dir, "traces.db")) as db:
        assert db.execute("UPDATE traces SET envelope = replace(envelope, 'invoice-17', 'invoice-18') "
                          "WHERE execution_id = ?", (TAMPERED,)).rowcount == 1
    proc = UiProcess("--data-dir", data_dir)
    yield proc.url
    assert proc.stop() == 0
    # What it shows beyond the database, said once on stderr as it starts.
    note = proc.stderr_text
    assert "note: no recorder is running: 4 WAL record(s)" in note and "1 execution(s) left running" in note
    assert "tracedb recover" in note




def _rows(html: str) -> dict:
    """execution id -> the text of its row in the list."""
    rows = re.findall(r'<tr data-id="([^"]+)"[^>]*>(.*?)</tr>', html)
    return {eid: re.sub(r"<[^>]+>", " ", cells) for eid, cells in rows}


def test_the_list_and_counts_show_the_wal_and_judge_each_row(crashed_ui):
    rows = _rows(_get(crashed_ui).text)
    assert set(rows) == {"exec-done-0", "exec-done-1", "exec-done-2", "exec-left-running", "exec-wal-only"}
    assert "completed" in rows["exec-wal-only"] and "replayable" in rows["exec-wal-only"]
    assert "succeeded" in rows["exec-wal-only"]  # the outcome folded from the WAL too
    assert "incomplete" in rows["exec-left-running"] and "execution_incomplete" in rows["exec-left-running"]
    assert "record_corrupted" in rows[TAMPERED] and "record_corrupted" not in rows["exec-done-0"]
    replayable = _rows(_get(crashed_ui, params={"replayable": "yes"}).text)
    assert set(replayable) == {"exec-done-0", "exec-done-2", "exec-wal-only"}
    counts = _get(crashed_ui + "counts").json()["counts"]
    assert (counts["completed"], counts["incomplete"], counts["running"]) == (4, 1, 0)


def test_the_execution_pages_fold_in_the_wal(crashed_ui):
    r = _get(crashed_ui + "e/exec-wal", follow_redirects=True)  # a prefix of one only the WAL holds
    assert r.status_code == 200 and r.url.path.endswith("/e/exec-wal-only")
    assert "tool.requested" in r.text
    left = _get(crashed_ui + "e/exec-left-running").text
    assert "incomplete" in left and "tool.responded" in left
    event = _get(crashed_ui + "api/event", params={"id": "exec-left-running", "seq": 2}).json()
    assert event["payload"] == {"name": "x", "from": "the WAL"}
    assert "failed verification" in _get(crashed_ui + f"e/{TAMPERED}").text
    live = orjson.loads(_get(crashed_ui + "api/live", params={"id": "exec-wal-only", "after": 0}).content)
    assert live["status"] == "completed" and live["reload"]
