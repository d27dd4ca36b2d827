"""`tracedb export --format intentusnet` then `tracedb import intentusnet`: every event keeps the
time it was recorded (each event's recordedUtcIso), so `trace get`'s event times and
`inspect --list`'s duration come back as they were, not as the time of the import."""

from __future__ import annotations

import json
import os

from click.testing import CliRunner

import tracedb
from intentusnet.recording.store import FileExecutionStore
from tracedb.cli import main

from tests.conftest import FakeClock

T0 = 1_764_000_000_123_456_000  # ns since the epoch, a whole microsecond


def cli(data_dir, *args):
    result = CliRunner().invoke(main, ["--data-dir", data_dir, *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def recorded(data_dir: str) -> None:
    clock = FakeClock(T0)
    with tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0}, clock=clock) as store:
        ex = store.start("Upper", {"intent": "Upper", "text": "hi"}, "exec-timed")
        clock.now = T0 + 12 * 1_000_000
        ex.event("tool.requested", {"n": 1})
        clock.now = T0 + 30 * 1_000_000
        ex.event("tool.responded", {"n": 2})
        clock.now = T0 + 49 * 1_000_000
        ex.finish({"status": "success"})


def times_and_duration(data_dir: str) -> tuple:
    shown = cli(data_dir, "trace", "get", "exec-timed")
    times = [(t["seq"], t["recordedUtcIso"]) for t in json.loads(shown)["eventTimes"]]
    listed = json.loads(cli(data_dir, "inspect", "--list", "--json"))
    return times, [(r["execution_id"], r["created_utc_iso"], r["duration_ms"]) for r in listed]


def test_an_exported_record_imported_elsewhere_keeps_its_event_times(tmp_path):
    first, out, second = str(tmp_path / "first"), str(tmp_path / "out"), str(tmp_path / "second")
    recorded(first)
    before = times_and_duration(first)
    assert before[1][0][2] == 49.0
    cli(first, "export", "exec-timed", "--format", "intentusnet", "-o", out + os.sep)
    with open(os.path.join(out, "exec-timed.json")) as f:
        written = json.load(f)
    assert [e["recordedUtcIso"] for e in written["events"]] == [
        "2025-11-24T16:00:00.135456+00:00", "2025-11-24T16:00:00.153456+00:00", "2025-11-24T16:00:00.172456+00:00",
    ]
    # IntentusNet reads the file as its own (it reads past the added time).
    assert [e.seq for e in FileExecutionStore(out).load("exec-timed").events] == [1, 2, 3]
    cli(second, "import", "intentusnet", out)
    assert times_and_duration(second) == before
    # Exported again, the record is the same file.
    again = str(tmp_path / "again")
    cli(second, "export", "exec-timed", "--format", "intentusnet", "-o", again + os.sep)
    with open(os.path.join(out, "exec-timed.json"), "rb") as a, open(os.path.join(again, "exec-timed.json"), "rb") as b:
        assert a.read() == b.read()


def test_a_record_whose_events_carry_no_time_takes_its_creation_time(tmp_path):
    first, out, second = str(tmp_path / "first"), str(tmp_path / "out"), str(tmp_path / "second")
    recorded(first)
    cli(first, "export", "exec-timed", "--format", "intentusnet", "-o", out + os.sep)
    path = os.path.join(out, "exec-timed.json")
    with open(path) as f:
        record = json.load(f)
    for e in record["events"]:
        del e["recordedUtcIso"]  # as IntentusNet writes its records
    with open(path, "w") as f:
        json.dump(record, f, ensure_ascii=False, indent=2)
    cli(second, "import", "intentusnet", out)
    times, listed = times_and_duration(second)
    assert [t for _seq, t in times] == [listed[0][1]] * 3 and listed[0][2] == 0.0
    # Exported, it comes back as it was written: without event times.
    again = str(tmp_path / "again")
    cli(second, "export", "exec-timed", "--format", "intentusnet", "-o", again + os.sep)
    with open(path, "rb") as a, open(os.path.join(again, "exec-timed.json"), "rb") as b:
        assert a.read() == b.read()
