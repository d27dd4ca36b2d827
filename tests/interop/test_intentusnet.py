"""IntentusNet interoperability with the real `intentusnet` package: its IntentRouter records
into tracedb through the adapter, its ReplayEngine replays what tracedb gives back, and its
FileExecutionStore directories go in (`tracedb import intentusnet`) and come out again
(`tracedb export --format intentusnet`) unchanged."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta

import pytest
from click.testing import CliRunner

import tracedb
import wal
from tracedb.cli import main
from tracedb.interop.intentusnet import (
    RecordNotFoundError,
    TraceDBExecutionStore,
    intentusnet_envelope_hash,
    to_plain,
    write_record,
)
from tracedb.projection.models import traces

from .conftest import Broken, Upper, envelope, make_router

from intentusnet import FileExecutionStore, ReplayEngine, RoutingStrategy  # noqa: E402  (skipped above without it)
from tracedb.records.codec import decode_record  # noqa: E402
from intentusnet.recording.models import ExecutionRecord as IntentusNetRecord  # noqa: E402
from intentusnet.recording.models import stable_hash  # noqa: E402
from intentusnet.recording.replay import ReplayError  # noqa: E402


def wal_ops(data_dir: str, execution_id: str) -> list[str]:
    ops = []
    for rec in wal.read_records(os.path.join(data_dir, "wal")):
        doc = decode_record(rec.payload)
        if doc["id"] == execution_id:
            ops.append(doc["op"] if doc["op"] != "event" else doc["type"])
    return ops


def test_a_routed_intent_lands_in_the_wal_and_intentusnets_replay_engine_replays_it(store, data_dir):
    adapter = TraceDBExecutionStore(store)
    router = make_router(adapter, (Upper, "upper", "UpperIntent"))
    env, as_recorded = envelope(text="hello")
    response = router.route_intent(env)
    assert response.payload == {"text": "HELLO"}
    (eid,) = adapter.list_ids()
    # Durable before route_intent returned, record by record, before any compaction.
    assert wal_ops(data_dir, eid) == [
        "start", "INTENT_RECEIVED", "AGENT_ATTEMPT_START", "AGENT_ATTEMPT_END", "ROUTER_DECISION", "finish",
    ]
    record = adapter.load(eid)
    assert isinstance(record, IntentusNetRecord)
    assert record.header.envelopeHash == stable_hash(as_recorded)  # IntentusNet's own hash
    result = ReplayEngine(record).replay(env=as_recorded)
    assert result.envelope_hash_ok is True
    assert result.response == to_plain(response)
    assert result.execution_id == eid
    assert [e.type for e in record.events][-1] == "FINAL_RESPONSE"
    assert record.routerDecision["agent"] == "upper"

    # tracedb's own replay of the same execution; its hash leaves routingMetadata out, so the
    # envelope as routing left it (decisionPath filled in) still verifies.
    assert env.routingMetadata.decisionPath == ["upper"]
    ours = tracedb.ReplayEngine(store.get(eid)).replay(env=to_plain(env))
    assert ours.response == to_plain(response)


def test_records_survive_a_restart_and_load_back_the_same(data_dir):
    settings = {"compact_interval_ms": 0, "idle_timeout_s": 0}
    with tracedb.open(data_dir, config=settings) as store:
        router = make_router(TraceDBExecutionStore(store), (Upper, "upper", "UpperIntent"))
        router.route_intent(envelope(text="one")[0])
        before = {i: TraceDBExecutionStore(store).load(i).to_dict() for i in TraceDBExecutionStore(store).list_ids()}
    with tracedb.open(data_dir, config=settings) as store:
        adapter = TraceDBExecutionStore(store)
        assert {i: adapter.load(i).to_dict() for i in adapter.list_ids()} == before


def test_an_error_response_holding_live_objects_is_stored_as_json(store):
    adapter = TraceDBExecutionStore(store)
    router = make_router(adapter, (Broken, "broken", "UpperIntent"))
    response = router.route_intent(envelope()[0])
    assert response.status == "error"
    (eid,) = adapter.list_ids()
    replayed = ReplayEngine(adapter.load(eid)).replay()
    assert replayed.response["status"] == "error"
    assert replayed.response["error"]["code"] == "INTERNAL_AGENT_ERROR"  # the ErrorCode enum's value
    assert replayed.response["error"]["message"] == "tool backend down"


def record_dict(eid="exec-1", events=None, final=None, env=None, hash_=None, **header):
    """An IntentusNet record as its FileExecutionStore writes it."""
    env = env if env is not None else {"intent": {"name": "Summarize", "version": "1.0"}, "payload": {"doc": 17},
                                       "routingMetadata": {"decisionPath": [], "retries": 0}}
    if events is None:
        final = {"status": "success", "payload": {"summary": "ok"}} if final is None else final
        events = [
            {"seq": 1, "type": "INTENT_RECEIVED", "payload": {"intent": "Summarize"}},
            {"seq": 2, "type": "ROUTER_DECISION", "payload": {"agent": "summarizer"}},
            {"seq": 3, "type": "FINAL_RESPONSE", "payload": final},
        ]
    decision = next((e["payload"] for e in reversed(events) if e["type"] == "ROUTER_DECISION"), None)
    return {
        "header": {
            "executionId": eid,
            "createdUtcIso": header.pop("created", "2024-01-15T10:30:00.123456+00:00"),
            "envelopeHash": intentusnet_envelope_hash(env) if hash_ is None else hash_,
            "replayable": header.pop("replayable", True),
            "replayableReason": header.pop("reason", None),
        },
        "envelope": env,
        "routerDecision": decision,
        "events": events,
        "finalResponse": final,
    }


def test_envelope_hashes_are_accepted_bare_or_prefixed_in_either_form(store):
    env = record_dict()["envelope"]
    ours = tracedb.compute_envelope_hash(env)  # "sha256:" + hex, routingMetadata left out
    theirs = intentusnet_envelope_hash(env)     # bare hex of the whole envelope
    assert ours[len("sha256:"):] != theirs  # the two forms really differ for this envelope
    for i, h in enumerate([theirs, "sha256:" + theirs, ours, ours[len("sha256:"):], theirs.upper()]):
        assert write_record(store, record_dict(f"exec-{i}", hash_=h)) == "imported"
    with pytest.raises(tracedb.IntegrityError) as err:
        write_record(store, record_dict("exec-bad", hash_="0" * 64))
    assert "does not match the envelope" in err.value.message
    assert sorted(r.execution_id for r in store.list()) == [f"exec-{i}" for i in range(5)]
    # Whatever form came in, IntentusNet gets its own back, and its replay verifies it.
    adapter = TraceDBExecutionStore(store)
    for i in range(5):
        rec = adapter.load(f"exec-{i}")
        assert rec.header.envelopeHash == theirs
        assert ReplayEngine(rec).replay(env=env).envelope_hash_ok


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r["events"][1].update(seq=5), "event 2 has seq 5"),
        (lambda r: r["events"][2].update(payload={"status": "success"}), "FINAL_RESPONSE event's payload differs"),
        (lambda r: r.update(routerDecision={"agent": "other"}), "routerDecision is not the payload"),
        (lambda r: r["events"].pop(), "finalResponse without a FINAL_RESPONSE event"),
        (lambda r: r["events"].append({"seq": 4, "type": "AGENT_ATTEMPT_END", "payload": {}}), "event 4 comes after FINAL_RESPONSE"),
        (lambda r: r["header"].update(createdUtcIso="yesterday"), "is not an ISO 8601 time"),
        (lambda r: r["events"][0].update(type="bad type!"), "can be stored neither as it is"),
    ],
)
def test_a_record_tracedb_could_not_give_back_exactly_is_refused_and_nothing_is_recorded(store, change, message):
    record = record_dict()
    change(record)
    with pytest.raises(tracedb.TraceDBError) as err:
        TraceDBExecutionStore(store).save(record)
    assert message in err.value.message
    assert store.list() == []


def test_not_replayable_and_unfinished_records_keep_their_state(store):
    adapter = TraceDBExecutionStore(store)
    adapter.save(record_dict("exec-inv", replayable=False, reason="manually_invalidated"))
    adapter.save(record_dict("exec-fail", replayable=False, reason="queue overflow"))
    unfinished = record_dict("exec-cut")
    unfinished["events"] = unfinished["events"][:1]
    unfinished["finalResponse"] = None
    unfinished["routerDecision"] = None
    adapter.save(unfinished)
    states = {
        eid: (r.status, r.header.replayable, r.header.replayableReason)
        for eid in ("exec-inv", "exec-fail", "exec-cut")
        for r in [store.get(eid)]
    }
    assert states == {
        "exec-inv": ("invalidated", False, "manually_invalidated"),
        "exec-fail": ("completed", False, "recording_failure"),
        "exec-cut": ("incomplete", False, "execution_incomplete"),
    }
    for eid in states:
        with pytest.raises(ReplayError):
            ReplayEngine(adapter.load(eid)).replay()
    assert [e.type for e in adapter.load("exec-cut").events] == ["INTENT_RECEIVED"]


def test_event_types_tracedb_does_not_know_round_trip(store):
    final = {"status": "success"}
    events = [
        {"seq": 1, "type": "INTENT_RECEIVED", "payload": {}},
        {"seq": 2, "type": "CUSTOM_STEP", "payload": {"n": 1}},
        {"seq": 3, "type": "intentusnet.already", "payload": None},
        {"seq": 4, "type": "FINAL_RESPONSE", "payload": final},
    ]
    adapter = TraceDBExecutionStore(store)
    adapter.save(record_dict("exec-types", events=events, final=final))
    assert [e.type for e in store.get("exec-types").events] == [
        "INTENT_RECEIVED", "intentusnet.CUSTOM_STEP", "intentusnet.intentusnet.already", "FINAL_RESPONSE",
    ]
    assert adapter.load("exec-types").to_dict()["events"] == events


def test_saving_again_is_a_no_op_and_another_record_under_the_id_is_refused(store):
    adapter = TraceDBExecutionStore(store)
    original = record_dict("exec-same")
    assert adapter.save(original) == "exec-same"
    assert adapter.save(original) == "exec-same"
    changed = record_dict("exec-same", final={"status": "success", "payload": {"summary": "other"}})
    with pytest.raises(tracedb.ExecutionExistsError):
        adapter.save(changed)
    assert len(store.get("exec-same").events) == 3


def test_loading_an_unknown_execution_is_a_file_not_found_error_as_intentusnet_expects(store):
    with pytest.raises(FileNotFoundError):
        TraceDBExecutionStore(store).load("exec-nope")
    with pytest.raises(RecordNotFoundError) as err:
        TraceDBExecutionStore(store).load("exec-nope")
    assert err.value.exit_code == 3


def test_an_envelope_altered_in_the_database_comes_back_corrupted_not_rehashed(store):
    adapter = TraceDBExecutionStore(store)
    adapter.save(record_dict("exec-x"))
    store.compact()
    with store.engine.begin() as conn:
        conn.execute(traces.update().values(envelope={"intent": "Tampered"}))
    rec = adapter.load("exec-x")
    assert (rec.header.replayable, rec.header.replayableReason) == (False, "record_corrupted")
    assert rec.header.envelopeHash != intentusnet_envelope_hash({"intent": "Tampered"})
    with pytest.raises(ReplayError):
        ReplayEngine(rec).replay()


# -- the command line ------------------------------------------------------------------------


def make_intentusnet_records(directory: str) -> list[str]:
    """Three executions recorded by IntentusNet itself into a FileExecutionStore directory; one
    falls back from a failing agent to a working one."""
    files = FileExecutionStore(directory)
    router = make_router(files, (Broken, "a-broken", "UpperIntent"), (Upper, "b-upper", "UpperIntent"))
    router.route_intent(envelope(text="one", strategy=RoutingStrategy.FALLBACK)[0])
    router.route_intent(envelope(text="two", strategy=RoutingStrategy.FALLBACK)[0])
    solo = make_router(files, (Upper, "upper", "UpperIntent"))
    solo.route_intent(envelope(text="three")[0])
    return files.list_ids()


def cli(data_dir, *args):
    return CliRunner().invoke(main, ["--data-dir", data_dir, *args], catch_exceptions=False)


def test_import_and_export_give_intentusnet_its_own_files_back(tmp_path):
    records, out, data = str(tmp_path / "records"), str(tmp_path / "out"), str(tmp_path / "data")
    ids = make_intentusnet_records(records)
    result = cli(data, "import", "intentusnet", records)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().startswith("imported 3 record(s)")
    again = cli(data, "import", "intentusnet", records, "--json")
    assert json.loads(again.stdout) == {"imported": 0, "already_present": 3, "events": 0, "failed": []}
    exported = cli(data, "export", "--all", "--format", "intentusnet", "-o", out)
    assert exported.exit_code == 0, exported.output
    for eid in ids:
        with open(os.path.join(records, eid + ".json"), "rb") as a, open(os.path.join(out, eid + ".json"), "rb") as b:
            assert b.read() == a.read()  # byte for byte what IntentusNet wrote
    # IntentusNet reads the exported directory as its own and replays every record.
    files = FileExecutionStore(out)
    assert files.list_ids() == ids
    for eid in ids:
        assert ReplayEngine(files.load(eid)).replay().response["status"] == "success"
    fallback = [r for r in (files.load(i) for i in ids) if any(e.type == "FALLBACK_TRIGGERED" for e in r.events)]
    assert len(fallback) == 2
    # The original creation times are kept: `inspect --list` and retention count from them.
    listed = json.loads(cli(data, "inspect", "--list", "--json").stdout)
    assert sorted(r["execution_id"] for r in listed) == ids
    for r in listed:
        shown = datetime.fromisoformat(r["created_utc_iso"].replace("Z", "+00:00"))
        original = datetime.fromisoformat(files.load(r["execution_id"]).header.createdUtcIso)
        assert abs(shown - original) <= timedelta(microseconds=1)  # tracedb prints via a float


def test_import_reports_each_file_it_cannot_store_and_imports_the_rest(tmp_path):
    records, data = str(tmp_path / "records"), str(tmp_path / "data")
    os.makedirs(records)
    for rec in (record_dict("exec-good"), record_dict("exec-bad", hash_="f" * 64)):
        with open(os.path.join(records, rec["header"]["executionId"] + ".json"), "w") as f:
            json.dump(rec, f)
    with open(os.path.join(records, "renamed.json"), "w") as f:
        json.dump(record_dict("exec-other"), f)
    with open(os.path.join(records, "broken.json"), "w") as f:
        f.write("{not json")
    result = cli(data, "import", "intentusnet", records)
    assert result.exit_code == 1
    assert "imported 1 record(s) with 3 event(s); 0 already present; 3 failed" in result.stdout
    assert "failed: exec-bad.json: envelope hash" in result.stderr
    assert "failed: renamed.json: renamed.json holds execution 'exec-other'" in result.stderr
    assert "failed: broken.json: cannot read broken.json" in result.stderr
    assert [line.split()[0] for line in cli(data, "inspect", "--list").stdout.splitlines()] == ["exec-good"]


def test_export_one_execution_to_standard_output_or_a_file(tmp_path, store, data_dir):
    TraceDBExecutionStore(store).save(record_dict("exec-1"))
    TraceDBExecutionStore(store).save(record_dict("exec-2"))
    store.compact()
    one = cli(data_dir, "export", "exec-1", "--format", "intentusnet")
    assert one.exit_code == 0 and json.loads(one.stdout) == record_dict("exec-1")
    ours = json.loads(cli(data_dir, "export", "exec-1").stdout)
    assert ours["header"]["envelopeHash"].startswith("sha256:") and ours["status"] == "completed"
    target = str(tmp_path / "one.json")
    assert cli(data_dir, "export", "exec-2", "--format", "intentusnet", "-o", target).exit_code == 0
    with open(target) as f:
        assert json.load(f) == record_dict("exec-2")
    # Several to standard output are JSON lines, one execution a line (they were refused).
    several = cli(data_dir, "export", "exec-1", "exec-2", "--format", "intentusnet")
    assert several.exit_code == 0
    assert [json.loads(line) for line in several.stdout.splitlines()] == [record_dict("exec-1"), record_dict("exec-2")]
    every = cli(data_dir, "export", "--all")
    assert sorted(json.loads(line)["header"]["executionId"] for line in every.stdout.splitlines()) == ["exec-1", "exec-2"]
    assert cli(data_dir, "export", "exec-nope").exit_code == 3


def test_import_into_a_data_directory_a_recorder_holds_says_what_to_do(tmp_path, store, data_dir):
    records = str(tmp_path / "records")
    os.makedirs(records)
    result = CliRunner().invoke(main, ["--data-dir", data_dir, "import", "intentusnet", records])
    assert result.exit_code == 5
    assert "import through another data directory" in result.stderr
