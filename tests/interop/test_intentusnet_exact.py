"""IntentusNet records exactly or refused: a refused record leaves nothing behind and can be
imported once fixed; export gives back what was imported byte for byte (custom reasons, "Z"
times); a second save of an id with any difference, header included, is refused, never dropped."""

from __future__ import annotations

import json
import math
import os

import pytest
from click.testing import CliRunner

import tracedb
import wal
from tracedb.cli import main
from tracedb.interop.intentusnet import TraceDBExecutionStore, to_intentusnet_dict, write_record

from .test_intentusnet import record_dict


def cli(data_dir, *args):
    return CliRunner().invoke(main, ["--data-dir", data_dir, *args], catch_exceptions=False)


def write_files(directory, *records):
    os.makedirs(directory, exist_ok=True)
    for rec in records:
        with open(os.path.join(directory, rec["header"]["executionId"] + ".json"), "w", encoding="utf-8") as f:
            # IntentusNet's FileExecutionStore: json.dump(..., ensure_ascii=False, indent=2).
            json.dump(rec, f, ensure_ascii=False, indent=2)


def wal_records(data_dir) -> int:
    return sum(1 for _ in wal.read_records(os.path.join(data_dir, "wal")))


def with_payload(eid, payload):
    rec = record_dict(eid)
    rec["events"][0]["payload"] = payload
    return rec


@pytest.mark.parametrize(
    "bad, why",
    [
        ({"n": 2**64}, "not JSON-serialisable"),            # an integer orjson cannot write
        ({"score": math.nan}, "NaN or infinity"),            # IntentusNet's own store writes NaN
        ({"score": -math.inf}, "NaN or infinity"),
    ],
)
def test_a_refused_import_writes_nothing_and_the_fixed_file_imports(tmp_path, bad, why):
    records, data = str(tmp_path / "records"), str(tmp_path / "data")
    write_files(records, with_payload("exec-bad", bad))
    result = cli(data, "import", "intentusnet", records)
    assert result.exit_code == 1
    assert why in result.stderr and "exec-bad.json" in result.stderr
    assert wal_records(data) == 0  # not even the start: nothing reached the WAL
    assert cli(data, "inspect", "--list", "--json").stdout.strip() == "[]"
    write_files(records, with_payload("exec-bad", {"n": 1, "score": 0.5}))
    result = cli(data, "import", "intentusnet", records)
    assert result.exit_code == 0, result.output
    assert "imported 1 record(s)" in result.stdout
    shown = json.loads(cli(data, "inspect", "exec-bad", "--json").stdout)
    assert (shown["status"], shown["replayable"]) == ("completed", True)


def test_a_record_with_nan_inside_its_envelope_is_refused_not_counted(tmp_path):
    records, data = str(tmp_path / "records"), str(tmp_path / "data")
    env = {"intent": {"name": "Summarize", "version": "1.0"}, "payload": {"threshold": math.nan}}
    rec = record_dict("exec-nan", env=env, hash_="")
    write_files(records, rec)
    result = cli(data, "import", "intentusnet", records)
    assert result.exit_code == 1 and "NaN or infinity" in result.stderr
    assert "imported 0 record(s)" in result.stdout
    assert wal_records(data) == 0


def test_export_gives_back_custom_reasons_and_z_times_byte_for_byte(tmp_path):
    records, out, data = str(tmp_path / "records"), str(tmp_path / "out"), str(tmp_path / "data")
    originals = [
        record_dict("exec-z", created="2024-01-15T10:30:00.123456Z"),
        record_dict("exec-short", created="2024-01-15T10:30:00Z"),
        record_dict("exec-custom", replayable=False, reason="queue overflow"),
        record_dict("exec-inv", replayable=False, reason="manually_invalidated"),
    ]
    write_files(records, *originals)
    assert cli(data, "import", "intentusnet", records).exit_code == 0
    assert cli(data, "export", "--all", "--format", "intentusnet", "-o", out).exit_code == 0
    for rec in originals:
        name = rec["header"]["executionId"] + ".json"
        with open(os.path.join(records, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
            assert b.read() == a.read(), name
    # tracedb's own view is unchanged by the kept header: not replayable, recording_failure.
    shown = json.loads(cli(data, "inspect", "exec-custom", "--json").stdout)
    assert (shown["replayable"], shown["replayable_reason"]) == (False, "recording_failure")
    # Invalidated by an operator after the import, it says so rather than the old reason.
    assert cli(data, "invalidate", "exec-custom", "--reason", "bad data").exit_code == 0
    again = json.loads(cli(data, "export", "exec-custom", "--format", "intentusnet").stdout)
    assert (again["header"]["replayable"], again["header"]["replayableReason"]) == (False, "manually_invalidated")


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r["header"].update(replayable=False, replayableReason="manually_invalidated"),
        lambda r: r["header"].update(replayable=False, replayableReason="queue overflow"),
        lambda r: r["header"].update(createdUtcIso="2024-01-15T10:30:00.123457+00:00"),
        lambda r: r["header"].update(createdUtcIso="2024-01-15T10:30:00.123456Z"),  # same time, other text
        lambda r: r["events"][0]["payload"].update(intent="Other"),
        lambda r: r["finalResponse"]["payload"].update(summary=1),
    ],
)
def test_a_second_save_with_any_difference_is_refused_and_the_first_stays(store, change):
    adapter = TraceDBExecutionStore(store)
    first = record_dict("exec-same")
    adapter.save(first)
    changed = json.loads(json.dumps(first))
    change(changed)
    if changed["events"][-1]["type"] == "FINAL_RESPONSE":
        changed["events"][-1]["payload"] = changed["finalResponse"]
    with pytest.raises(tracedb.ExecutionExistsError) as err:
        adapter.save(changed)
    assert "differs" in err.value.hint
    assert to_intentusnet_dict(store.get("exec-same")) == first  # unchanged, still replayable
    assert write_record(store, first) == "present"
    with pytest.raises(tracedb.ExecutionExistsError):
        write_record(store, changed)  # import has the same rule


def test_an_import_with_a_changed_header_is_reported_not_counted_as_present(tmp_path):
    records, data = str(tmp_path / "records"), str(tmp_path / "data")
    write_files(records, record_dict("exec-1"))
    assert cli(data, "import", "intentusnet", records).exit_code == 0
    write_files(records, record_dict("exec-1", replayable=False, reason="manually_invalidated"))
    result = cli(data, "import", "intentusnet", records, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["already_present"] == 0 and report["failed"][0]["file"] == "exec-1.json"
    assert "header.replayable differs" in report["failed"][0]["error"]


def test_ids_and_event_types_match_whole_strings(store):
    with pytest.raises(tracedb.InvalidInputError):
        store.start("I", {"intent": "I"}, "id\n")
    ex = store.start("I", {"intent": "I"})
    with pytest.raises(tracedb.InvalidInputError):
        ex.event("myapp.step\n", {})
    assert ex.event("myapp.step", {}) == 1
    rec = record_dict("exec-nl")
    rec["events"][0]["type"] = "CUSTOM\n"
    with pytest.raises(tracedb.InvalidInputError):
        write_record(store, rec)


def test_a_route_whose_record_is_refused_at_save_leaves_no_running_execution(store):
    # IntentusNet's router saves the whole record when the route ends; a NaN in the agent's
    # answer used to leave the start and first events in the WAL, the execution `running`.
    from intentusnet import AgentResponse, BaseAgent

    from .conftest import envelope, make_router

    class NaNScore(BaseAgent):
        def handle_intent(self, env):
            return AgentResponse.success({"score": math.nan}, agent=self.definition.name)

    router = make_router(TraceDBExecutionStore(store), (NaNScore, "nan", "UpperIntent"))
    lsn = store.durable_lsn
    with pytest.raises(tracedb.InvalidInputError) as err:
        router.route_intent(envelope()[0])
    assert "NaN or infinity" in err.value.message
    assert store.durable_lsn == lsn and store.list() == []
