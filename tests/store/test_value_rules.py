"""One set of rules for the values a new execution takes: ids that are safe file names (the same
alphabet in docs/values.md and docs/protocol.md), one maximum intent length, keys that are
strings; every id tracedb makes passes; ids recorded under the looser rule of earlier versions
are still read, replayed, forked and exported, and `export --all -o DIR` names the one it cannot
write instead of refusing the directory."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid

import pytest

import tracedb
from tests.legacy_ids import record_legacy
from tracedb.errors import InvalidInputError
from tracedb.sidecar import protocol as P
from tracedb.records import validation

# The documented limits (docs/values.md).
ID_LENGTH = 128
INTENT_LENGTH = 1024
MAX_DEPTH = 253

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETTINGS = {"compact_interval_ms": 0, "idle_timeout_s": 0}
ENV = {"intent": "I", "payload": {}}

UNSAFE_IDS = ["a#b", "!x", "x~y", "../../pwn1", "a/b", "..", ".hidden", "a..b", "a b", "-lead", "_lead",
              "team@x", "k=v", "a+b", "x" * (ID_LENGTH + 1), "", "é", "id\n", "a\x00b"]


def nest(depth: int):
    v = 1
    for _ in range(depth):
        v = [v]
    return v


@pytest.fixture
def store(tmp_path):
    with tracedb.open(str(tmp_path / "d"), config=SETTINGS) as s:
        yield s


@pytest.mark.parametrize("eid", UNSAFE_IDS)
def test_a_new_execution_id_outside_the_alphabet_is_refused_on_the_sync_and_asyncio_apis(store, tmp_path, eid):
    with pytest.raises(InvalidInputError, match="letters, digits and . _ : -"):
        store.start("I", ENV, eid)
    assert store.list() == []

    async def run():
        async with await tracedb.open_async(str(tmp_path / "a"), config=SETTINGS) as astore:
            with pytest.raises(InvalidInputError, match="letters, digits and . _ : -"):
                await astore.start("I", ENV, eid)

    asyncio.run(run())


def test_every_id_tracedb_and_the_frameworks_it_records_make_is_accepted(store):
    from agents.tracing import gen_trace_id
    from intentusnet.utils.id_generator import generate_uuid_hex
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    from tracedb.records.ids import new_execution_id
    from tracedb.otel.mapping import execution_id_of
    from tracedb.replay import fork

    made = [
        new_execution_id(),                                            # exec-<UUIDv7>
        execution_id_of(format(RandomIdGenerator().generate_trace_id(), "032x")),  # otel-<trace id>
        gen_trace_id(),                                                # the Agents SDK's trace ids
        generate_uuid_hex(),                                           # IntentusNet's router
        str(uuid.uuid4()),                                             # IntentusNet's ExecutionRecord
        "x" * ID_LENGTH, "a.b:c-d_e", "0", "exec.v2:run-7_x",
    ]
    for eid in made:
        ex = store.start("I", ENV, eid)
        ex.event("tool.requested", {"n": 1})
        ex.finish({"status": "success"})
    forked = fork(store, made[0], 1)  # a fork's generated id
    forked.execution.finish({"status": "success"})
    assert {t.execution_id for t in store.list()} == {*made, forked.execution.execution_id}


def test_the_alphabet_is_written_the_same_in_the_values_and_protocol_docs():
    rule = "1 to 128 letters, digits and `.` `_` `:` `-`, a letter or digit first, no `..`"
    for doc in ("values.md", "protocol.md"):
        with open(os.path.join(ROOT, "docs", doc), encoding="utf-8") as f:
            text = " ".join(f.read().split())
        assert rule in text, doc


def test_the_intent_has_one_maximum_length_on_every_way_in(store):
    assert P.MAX_INTENT_CHARS == validation.INTENT_LENGTH == INTENT_LENGTH
    store.start("i" * INTENT_LENGTH, ENV).finish({"status": "success"})
    with pytest.raises(InvalidInputError, match="at most 1024"):
        store.start("i" * (INTENT_LENGTH + 1), ENV)
    for bad in ("", "a\x00b", "lone \ud800", 7, None):
        with pytest.raises(InvalidInputError, match="intent"):
            store.start(bad, ENV)


def test_envelopes_and_meta_take_string_keys_as_payloads_do(store):
    # {1: "a"} would be given back as {"1": "a"}: refused, on every path alike.
    with pytest.raises(InvalidInputError, match="Dict key must be str"):
        store.start("I", {1: "a", 2: "b"})
    ex = store.start("I", ENV)
    with pytest.raises(InvalidInputError, match="not JSON-serialisable"):
        ex.event("tool.requested", {1: "a"})
    with pytest.raises(InvalidInputError, match="meta must be a JSON object"):
        store.start("I", ENV, meta=["not", "an", "object"])
    with pytest.raises(InvalidInputError, match="Dict key must be str"):
        store.start("I", ENV, meta={2: "x"})


def test_nesting_has_one_limit_for_payloads_responses_and_envelopes(store):
    ex = store.start("I", ENV)
    ex.event("tool.requested", nest(MAX_DEPTH))
    with pytest.raises(InvalidInputError, match=f"nested deeper than {MAX_DEPTH} levels"):
        ex.event("tool.requested", nest(MAX_DEPTH + 1))
    with pytest.raises(InvalidInputError, match=f"nested deeper than {MAX_DEPTH} levels"):
        ex.finish({"status": "success", "payload": nest(MAX_DEPTH)})  # the response itself is one level
    ex.finish({"status": "success", "payload": nest(MAX_DEPTH - 1)})
    store.start("I", {"intent": "I", "deep": nest(MAX_DEPTH - 1)}).finish({"status": "success"})
    with pytest.raises(InvalidInputError, match=f"nested deeper than {MAX_DEPTH} levels"):
        store.start("I", {"intent": "I", "deep": nest(MAX_DEPTH)})


# -- ids recorded under the earlier rule ------------------------------------------------------

LEGACY = ["../../pwn1", "a/b", "..", ".hidden", "a#b", "x~y", "!x"]


def cli(data_dir: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TRACEDB_SIDECAR", None)
    return subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", data_dir, *args],
                          capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)


def test_executions_under_old_ids_are_still_read_replayed_forked_and_exported(tmp_path):
    data = str(tmp_path / "d")
    record_legacy(data, LEGACY)
    for eid in LEGACY:
        got = cli(data, "trace", "get", eid, "--json")
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["events"][0]["payload"] == {"id": eid}
        shown = cli(data, "inspect", eid, "--json")
        assert shown.returncode == 0 and json.loads(shown.stdout)["status"] == "completed", shown.stderr
        replayed = cli(data, "replay", eid, "--json")
        assert replayed.returncode == 0, replayed.stderr
        exported = cli(data, "export", eid, "--format", "intentusnet", "--json")
        assert exported.returncode == 0 and json.loads(exported.stdout)["header"]["executionId"] == eid
        alone = tmp_path / "alone.json"
        written = cli(data, "export", eid, "-o", str(alone))
        assert written.returncode == 0, written.stderr
        assert json.loads(alone.read_text())["header"]["executionId"] == eid
    with tracedb.open(data, config=SETTINGS) as store:
        # A fork names its parent by id: an old one still serves.
        f = store.start("Legacy", {"intent": "Legacy"}, "fork-of-old", parent_execution_id="a/b", forked_at_seq=1)
        f.finish({"status": "success"})
        assert store.get("fork-of-old").to_dict()["lineage"]["parentExecutionId"] == "a/b"
        store.invalidate("a#b", "checked")  # closing calls name it too
        assert store.get("a#b").status == "invalidated"


@pytest.mark.parametrize("fmt", ["tracedb", "intentusnet", "otlp-json"])
def test_export_all_to_a_directory_writes_every_safe_name_and_names_the_ones_it_skips(tmp_path, fmt):
    data = str(tmp_path / "d")
    record_legacy(data, [*LEGACY, "ok-1"])
    out_dir = tmp_path / "out" / "records"
    r = cli(data, "export", "--all", "--format", fmt, "-o", str(out_dir))
    assert r.returncode == 1, r.stderr
    assert sorted(os.listdir(out_dir)) == ["!x.json", "a#b.json", "ok-1.json", "x~y.json"]
    for unsafe in ("../../pwn1", "a/b", "..", ".hidden"):
        assert f"skipped: {unsafe!r} cannot be a file name" in r.stderr
    assert "wrote 4 execution(s)" in r.stderr and "skipped 4" in r.stderr
    # Nothing was written outside the directory.
    assert sorted(os.listdir(tmp_path / "out")) == ["records"]
    assert not any(n.startswith("pwn1") for n in os.listdir(tmp_path))
    # Every file is what export of that one execution writes.
    if fmt != "otlp-json":
        key = (lambda d: d["header"]["executionId"])
        for name in os.listdir(out_dir):
            with open(out_dir / name, encoding="utf-8") as f:
                assert key(json.load(f)) + ".json" == name
    # Without an unsafe id it exits 0.
    clean = str(tmp_path / "clean")
    record_legacy(clean, ["ok-1", "a#b"])
    r = cli(clean, "export", "--all", "--format", fmt, "-o", str(tmp_path / "clean-out"))
    assert r.returncode == 0 and "skipped" not in r.stderr, r.stderr


def test_the_wire_takes_what_the_store_takes_and_checks_types_itself():
    req = {"op": "start", "execution_id": "a/b"}
    assert P.req_execution_id(req) == "a/b"  # a name of an execution: the store rules on new ones
    for bad in (7, "", "x" * (ID_LENGTH + 1), "a b", "é"):
        with pytest.raises(P.ProtocolError) as e:
            P.req_execution_id({"execution_id": bad})
        assert e.value.code == P.BAD_REQUEST
    assert P.MAX_EXECUTION_ID_CHARS == validation.ID_LENGTH == ID_LENGTH
