"""After a fail-open outage the record tells the truth, and the outage costs no more than itself.

Real `tracedb serve` processes, stopped (SIGSTOP, then SIGCONT) or killed and started again,
with clients set to fail open (`on_outage="continue"`), sync and asyncio:

- an execution the agent finished during the outage is `completed`, not replayable,
  `recording_failure`, and says how many records were lost and when (`inspect`, `trace get`,
  `inspect --list`, the web view), also when its finish was the dropped record;
- a clean stop of the recorder and recovery after a crash keep `recording_failure` and the count;
- once the recorder answers again, the agents' records are recorded: none is dropped past
  `BOUND_S` after SIGCONT, or after a restarted recorder's store answers;
- a client that connects while the recorder opens its store waits for it: nothing is dropped.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import signal
import time
import urllib.request

import pytest
from click.testing import CliRunner

from benchmarks.sidecar import accepts
from tests.waiting import wait_until
from tracedb.cli import main
from tracedb.sidecar.client import Client, RecorderUnavailableError, connect_async

from . import outage_load
from .helpers import free_port, sock_path, stopped

# How long after the recorder answers again a call may still be dropped: the moment the
# client's probe takes to see it (a few ms on an idle machine; this allows for a loaded one).
BOUND_S = 0.5
DONE = {"status": "success", "payload": {"answer": 42}}


def _cli(data_dir: str, *args: str) -> str:
    result = CliRunner().invoke(main, ["--data-dir", data_dir, *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def _ns(iso: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1e9)


def _status(client: Client, execution_id: str):
    try:
        return client.get(execution_id).status
    except RecorderUnavailableError:
        return None


def _every_view_says(data_dir: str, execution_id: str, lost: int, between: tuple[int, int],
                     web_port=None) -> None:
    """`inspect ID --json`, `trace get`, `inspect --list` (JSON, and the table's LOST column)
    and the web view's page say that `lost` records were lost within `between` (ns)."""
    view = json.loads(_cli(data_dir, "inspect", execution_id, "--json"))
    assert view["replayable_reason"] == "recording_failure"
    counts = view["lost_records"]
    assert counts["count"] == lost
    assert between[0] <= _ns(counts["first"]) <= _ns(counts["last"]) <= between[1]
    assert view["note"].startswith(f"{lost} record")
    assert json.loads(_cli(data_dir, "trace", "get", execution_id, "--json"))["lostRecords"] == counts
    listed = {r["execution_id"]: r for r in json.loads(_cli(data_dir, "inspect", "--list", "--json"))}
    assert listed[execution_id]["lost_records"] == counts
    as_csv = {r["execution_id"]: r for r in csv.DictReader(io.StringIO(_cli(data_dir, "inspect", "--list", "--format", "csv")))}
    assert as_csv[execution_id]["lost_records"] == str(lost)
    table = CliRunner().invoke(main, ["--data-dir", data_dir, "inspect", "--list"], catch_exceptions=False)
    assert table.stderr.split()[-1] == "LOST"
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()}
    assert rows[execution_id][-1] == str(lost)
    if web_port is not None:
        with open(os.path.join(data_dir, "token"), encoding="utf-8") as f:  # the listeners' token
            auth = {"Authorization": "Bearer " + f.read().strip()}
        request = urllib.request.Request(f"http://127.0.0.1:{web_port}/e/{execution_id}", headers=auth)
        page = urllib.request.urlopen(request, timeout=30).read().decode()
        assert f"{lost} record{'' if lost == 1 else 's'} lost between {counts['first']} and {counts['last']}" in page


async def _completed(client, execution_id: str) -> bool:
    try:
        return (await client.get(execution_id)).status == "completed"
    except RecorderUnavailableError:  # a read is not failed open: the recorder is not back yet
        return False


# -- an execution finished during an outage ----------------------------------------------------


def test_an_execution_finished_while_the_recorder_was_stopped_is_completed_with_what_was_lost(serve_process, tdir):
    port = free_port()
    rec = serve_process("--http-port", str(port))
    client = Client(rec.socket, on_outage="continue")
    ex = client.start("outage.done", {"intent": "outage.done"})
    assert ex.event("myapp.step", {"i": 1}) == 1
    with stopped(rec.proc):
        t_stop = time.time_ns()
        # Sent, never answered: the stopped recorder takes it when it resumes.
        assert ex.event("myapp.step", {"i": 2}) is None
        # Dropped at once, the finish too: the agent is done with this execution.
        assert ex.event("myapp.step", {"i": 3}) is None
        assert ex.event("myapp.step", {"i": 4}) is None
        assert ex.finish(DONE) is None
        t_dropped = time.time_ns()
    # The agent calls nothing more: the client tells the recorder by itself, finish included.
    wait_until(lambda: _status(client, ex.execution_id) == "completed", 30, "the dropped finish to be recorded")
    record = client.get(ex.execution_id)
    assert [e.payload for e in record.events] == [{"i": 1}, {"i": 2}, DONE]
    assert (record.header.replayable, record.header.replayableReason) == (False, "recording_failure")
    assert client.outage_stats()["unrecorded"] == 2  # events 3 and 4; 2 was kept, the finish sent again
    client.close()
    _every_view_says(tdir, ex.execution_id, 2, (t_stop, t_dropped), web_port=port)
    code, err = rec.terminate()
    assert code == 0, err
    # Terminal: a clean stop leaves it as it was.
    view = json.loads(_cli(tdir, "inspect", ex.execution_id, "--json"))
    assert (view["status"], view["replayable_reason"], view["lost_records"]["count"]) == (
        "completed", "recording_failure", 2,
    )


def test_the_asyncio_client_completes_an_execution_whose_finish_was_dropped(serve_process, tdir):
    rec = serve_process()

    async def run():
        client = await connect_async(rec.socket, on_outage="continue")
        ex = await client.start("outage.async", {"intent": "outage.async"})
        assert await ex.event("myapp.step", {"i": 1}) == 1
        with stopped(rec.proc):
            t_stop = time.time_ns()
            # Pipelined into the stopped recorder: it takes both when it resumes.
            assert await asyncio.gather(ex.event("myapp.step", {"i": 2}), ex.event("myapp.step", {"i": 3})) == [None, None]
            assert await asyncio.gather(ex.event("myapp.step", {"i": 4}), ex.finish(DONE)) == [None, None]
            t_dropped = time.time_ns()
        deadline = time.monotonic() + 30
        while not await _completed(client, ex.execution_id):
            assert time.monotonic() < deadline, "the dropped finish was never recorded"
            await asyncio.sleep(0.01)
        record = await client.get(ex.execution_id)
        unrecorded = client.outage_stats()["unrecorded"]
        await client.close()
        return ex.execution_id, record, unrecorded, (t_stop, t_dropped)

    eid, record, unrecorded, between = asyncio.run(run())
    assert [e.payload for e in record.events] == [{"i": 1}, {"i": 2}, {"i": 3}, DONE]
    assert (record.status, record.header.replayable, record.header.replayableReason) == (
        "completed", False, "recording_failure",
    )
    assert unrecorded == 1
    _every_view_says(tdir, eid, 1, between)


# -- later transitions keep it -----------------------------------------------------------------


@pytest.mark.parametrize("how", ["clean-stop", "crash"])
def test_a_stop_of_the_recorder_keeps_recording_failure_and_the_count(serve_process, tdir, how):
    rec = serve_process()
    client = Client(rec.socket, on_outage="continue")
    ex = client.start("outage.running", {"intent": "outage.running"})
    assert ex.event("myapp.step", {"i": 1}) == 1
    with stopped(rec.proc):
        t_stop = time.time_ns()
        assert ex.event("myapp.step", {"i": 2}) is None  # kept by the recorder when it resumes
        assert ex.event("myapp.step", {"i": 3}) is None  # lost
    recorded = []
    wait_until(lambda: recorded.append(ex.event("myapp.step", {"i": "after"})) or recorded[-1] is not None,
               30, "the agent to record again")
    t_back = time.time_ns()
    lost = client.outage_stats()["unrecorded"]
    client.close()  # the agent is gone; its execution still running
    if how == "clean-stop":
        code, err = rec.terminate()  # marks it incomplete
        assert code == 0, err
    else:
        rec.kill()
        serve_process().terminate()  # recovery marks it incomplete
    view = json.loads(_cli(tdir, "inspect", ex.execution_id, "--json"))
    assert (view["status"], view["replayable"], view["replayable_reason"]) == ("incomplete", False, "recording_failure")
    assert lost == len(recorded)  # event 3, and each try dropped before the recorder answered
    _every_view_says(tdir, ex.execution_id, lost, (t_stop, t_back))


# -- what an outage costs once the recorder is back -------------------------------------------


@pytest.mark.parametrize("use_asyncio", [False, True], ids=["sync", "asyncio"])
def test_records_made_after_sigcont_are_not_dropped(use_asyncio):
    out = outage_load.run(agents=4, events=5, think_s=0.02, before_s=1.0, stop_s=8.0, after_s=3.0,
                          use_asyncio=use_asyncio)
    assert out.dropped_after(out.stopped_at) > 0, out.summary()  # the outage did drop records
    assert out.dropped_after(out.back_at + BOUND_S) == 0, out.summary()
    # Every execution the agents finished is completed, whatever the outage took from it.
    assert {status for status, _reason in out.finished_states} == {"completed"}, out.summary()
    assert ("completed", "recording_failure") in out.finished_states, out.summary()


@pytest.mark.parametrize("use_asyncio", [False, True], ids=["sync", "asyncio"])
def test_a_restart_drops_nothing_once_the_store_answers(use_asyncio):
    out = outage_load.run(agents=4, events=5, think_s=0.02, before_s=1.0, stop_s=3.0, after_s=2.0,
                          kill=True, use_asyncio=use_asyncio)
    assert out.dropped_after(out.stopped_at) > 0, out.summary()
    assert out.dropped_after(out.back_at + BOUND_S) == 0, out.summary()
    # Completed; or closed by recovery (running at the crash), with what was lost said.
    assert set(out.finished_states) <= {
        ("completed", None), ("completed", "recording_failure"), ("incomplete", "recording_failure"),
    }, out.summary()


def test_a_client_that_connects_while_the_recorder_opens_its_store_waits_for_it(tdir):
    outage_load.leave_uncompacted(tdir, 3000)  # the recorder's start-up compacts 66,000 records
    proc = outage_load.spawn_recorder(tdir, log_level="info")
    path = sock_path(tdir)
    try:
        wait_until(lambda: accepts(path) or proc.poll() is not None, 60, "the recorder to listen")
        called_at = time.time()
        # Fail open with a budget longer than the start-up: every record waits, none is dropped.
        failing_open = Client("unix:" + path, on_outage="continue", outage_timeout_s=60)
        raising = Client("unix:" + path)  # the default: connecting does not fail either
        ex = failing_open.start("outage.startup", {"intent": "outage.startup"})
        seqs = [ex.event("myapp.step", {"i": i}) for i in range(3)] + [ex.finish(DONE)]
        assert seqs == [1, 2, 3, 4]
        other = raising.start("outage.startup", {"intent": "outage.startup"})
        assert other.finish(DONE) == 1
        assert failing_open.outage_stats() == {"down": False, "outages": 0, "unrecorded": 0, "executions_affected": 0}
        record = failing_open.get(ex.execution_id)
        assert (record.status, record.header.replayable) == ("completed", True)
        failing_open.close()
        raising.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    log = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    opened = [_ns(r["ts"]) / 1e9 for r in log if r.get("msg") == "store open"]
    # The calls above were made while the store was opening: the socket was there before it.
    assert opened and called_at < opened[0], "the recorder listened only once its store was open"
    assert [r["msg"] for r in log].index("listening") < [r["msg"] for r in log].index("store open")
