"""The store's fast record reads give exactly what the SQLAlchemy read path gives."""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tracedb
from tracedb.reads import reader as reads

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False, width=64),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = tracedb.open(str(tmp_path_factory.mktemp("records")), config={"compact_interval_ms": 0, "idle_timeout_s": 0})
    yield s
    s.close()


# A bare whole float (1.0) is refused as a payload: a JSON column would give it back as 1.
payload_values = json_values.filter(lambda v: not (isinstance(v, float) and v.is_integer()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(payload_values, max_size=5), response=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
       finish=st.booleans(), decision=st.one_of(st.none(), payload_values))
def test_fast_reads_equal_the_engine_reads(store, payloads, response, finish, decision):
    ex = store.start("Intent", {"intent": "Intent", "payload": payloads[:1]})
    for p in payloads:
        ex.event("tool.responded", p)
    if decision is not None:
        ex.event("ROUTER_DECISION", decision)
    if finish:
        ex.finish(response)
    fast = store.get(ex.execution_id)
    slow = reads.read_record(store.engine, ex.execution_id)
    assert fast == slow
    assert fast.to_dict() == slow.to_dict()


def test_unknown_ids_and_other_threads(store):
    with pytest.raises(tracedb.ExecutionNotFoundError):
        store.get("exec-nope")
    ex = store.start("Threads", {})
    ex.event("tool.requested", {"n": 1})
    got = []
    threads = [threading.Thread(target=lambda: got.append(store.get(ex.execution_id))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(r == got[0] for r in got) and got[0].events[0].payload == {"n": 1}


def test_reads_after_close_are_refused(tmp_path):
    s = tracedb.open(str(tmp_path / "d"), config={"compact_interval_ms": 0})
    ex = s.start("X", {})
    assert s.get(ex.execution_id).execution_id == ex.execution_id
    s.close()
    with pytest.raises(tracedb.StoreClosedError):
        s.get(ex.execution_id)
