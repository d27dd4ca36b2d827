"""LiveRouter through `tracedb serve` (a real subprocess holding the data directory) with a
recording client, and the real `intentusnet` package: the same behaviour as over the embedded
store. An agent process SIGKILLed mid-call leaves an incomplete, non-replayable execution with
every event up to the kill; a finished route replays in IntentusNet's ReplayEngine; a value
tracedb refuses flags the execution and routing goes on."""

from __future__ import annotations

import math
import os

import pytest

import tracedb
from tests.serving import Serve
from tracedb.client import connect
from tracedb.interop.intentusnet import to_plain

from .conftest import Upper, envelope
from .test_intentusnet_live import NaNScore, check_the_killed_route, make_live_router, run_until_in_agent

from intentusnet import ReplayEngine  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def served(tmp_path):
    """(data directory, `tracedb serve` on it)."""
    data = str(tmp_path / "data")
    os.makedirs(data)
    serve = Serve(data)
    yield data, serve
    if serve.proc.poll() is None:
        serve.kill()


@pytest.fixture
def client(served):
    c = connect("unix:" + served[1].socket)
    yield c
    c.close()


def saved_ids(router, records=None) -> list:
    """The execution ids the router's record store (`records`, by default a LiveRouter's) is
    asked to save, as each route ends (a client cannot list executions)."""
    records = records or router.records
    ids: list = []
    save = records.save

    def capture(record):
        ids.append(save(record))
        return ids[-1]

    records.save = capture
    return ids


def test_a_finished_route_through_the_sidecar_is_intentusnets_record_and_replays(client):
    router = make_live_router(client, Upper)
    ids = saved_ids(router)
    env, as_recorded = envelope(text="hi")
    response = router.route_intent(env)
    (eid,) = ids
    record = router.records.load(eid)
    assert [e.type for e in record.events] == [
        "INTENT_RECEIVED", "AGENT_ATTEMPT_START", "AGENT_ATTEMPT_END", "ROUTER_DECISION", "FINAL_RESPONSE",
    ]
    result = ReplayEngine(record).replay(env=as_recorded)
    assert result.envelope_hash_ok and result.response == to_plain(response)
    assert router.records.save(record) == eid  # the same record again: a no-op
    assert len(client.get(eid).events) == 5


def test_a_value_tracedb_refuses_through_the_sidecar_flags_the_execution(client):
    router = make_live_router(client, NaNScore)
    ids = saved_ids(router)
    response = router.route_intent(envelope(text="x")[0])
    assert response.status == "success"
    rec = client.get(ids[0])
    assert rec.status == "completed"
    assert (rec.header.replayable, rec.header.replayableReason) == (False, "recording_failure")
    assert "NaN or infinity" in rec.finalResponse["tracedb.refused"]
    # The client refuses it before sending (JSON would carry it as null, another value).
    ex = client.start("Direct", {"k": 1})
    with pytest.raises(tracedb.InvalidInputError, match="NaN or infinity"):
        ex.event("tool.result", {"v": math.inf})
    assert client.get(ex.execution_id).events == []


def test_an_agent_killed_mid_call_through_the_sidecar_leaves_an_incomplete_execution(served):
    data, serve = served
    run_until_in_agent("sidecar", data)  # SIGKILLed inside its agent; the sidecar goes on
    code, err = serve.terminate()
    assert code == 0, err
    check_the_killed_route(data)


def test_intentusnets_own_router_saves_through_the_sidecar(client):
    """A plain IntentRouter whose record store is tracedb over a client: each record, saved as
    the route ends, is written through `tracedb serve` and loads back as it was saved."""
    from intentusnet.recording.models import ExecutionRecord as IntentusNetRecord

    from tracedb.interop.intentusnet import TraceDBExecutionStore, record_dict, to_intentusnet_dict

    from .conftest import Broken, make_router

    records = TraceDBExecutionStore(client)
    router = make_router(records, (Upper, "u", "UpperIntent"), (Broken, "b", "BrokenIntent"))
    given = []
    save = records.save
    records.save = lambda record: given.append(record_dict(record)) or save(record)
    router.route_intent(envelope(text="hi")[0])
    router.route_intent(envelope("BrokenIntent")[0])
    assert len(given) == 2
    for original in given:
        eid = original["header"]["executionId"]
        loaded = records.load(eid)
        assert isinstance(loaded, IntentusNetRecord)
        back = to_intentusnet_dict(client.get(eid))
        for key in ("envelope", "events", "finalResponse", "routerDecision"):
            assert back[key] == original[key], key
        assert back["header"]["envelopeHash"] == original["header"]["envelopeHash"]
        assert save(loaded) == eid  # the same record again: present, nothing written
        assert len(client.get(eid).events) == len(original["events"])
    assert given[1]["finalResponse"]["status"] == "error"
    with pytest.raises(tracedb.UsageError, match="cannot list"):
        records.list_ids()
