"""Redaction before the WAL: secrets matched by the `[redaction]` rules never reach any byte under
the data directory (WAL segments, spare segment, traces.db and its -wal file), on the sync and
asyncio APIs and for imports; the envelope hash is the one of the envelope as sent, so replay
with it verifies, and `verify` checks the stored envelope against its own hash."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from click.testing import CliRunner

import tracedb
from tracedb.cli import main
from tracedb.config import load_config
from tracedb.errors import ConfigError

from .redaction_config import (
    SECRET_INTENT,
    SECRET_KEY,
    SECRET_PASSWORD,
    SECRET_PATTERN,
    SECRETS,
    envelope,
    files_holding,
    response,
    tool_call,
    write_config,
)


def record_some(store, intent="Research") -> str:
    ex = store.start(intent, envelope(intent))
    ex.event("tool.requested", tool_call())
    ex.event("myapp.note", f"free text with {SECRET_PATTERN} in it")
    ex.finish(response())
    return ex.execution_id


COMMON = (SECRET_KEY, SECRET_PATTERN, SECRET_PASSWORD)  # matched by rules of every intent


def test_no_secret_reaches_the_data_directory_and_the_record_says_where(tmp_path):
    data = str(tmp_path / "data")
    cfg = load_config(write_config(str(tmp_path)))
    store = tracedb.open(data, config=cfg)
    eid = record_some(store)
    # Before compaction, the WAL holds every record (and a spare segment may be there).
    assert files_holding(data, *COMMON) == {}
    store.compact()
    rec = store.get(eid)
    assert files_holding(data, *COMMON) == {}
    store.close()
    assert files_holding(data, *COMMON) == {}

    call = rec.events[0].payload
    assert call["api_key"] == "[REDACTED]"
    assert call["arguments"]["headers"]["Authorization"] == "[REDACTED]"
    assert call["note"] == "token [REDACTED] pasted by the user"
    assert call["arguments"]["q"] == "capital of France"  # the rest is kept as it was
    assert rec.envelope["auth"] == {"Password": "[REDACTED]"}
    assert rec.to_dict()["redacted"] == {
        "envelope": ["$.auth.Password"],
        "events": {"1": ["$.arguments.headers.Authorization", "$.api_key", "$.note"], "2": ["$"]},
        "finalResponse": ["$.payload.debug[0].API-Key"],
    }


def test_per_intent_rules_apply_to_that_intent_only(tmp_path):
    cfg = load_config(write_config(str(tmp_path)))
    billing, research = str(tmp_path / "billing"), str(tmp_path / "research")
    with tracedb.open(billing, config=cfg) as store:
        eid = record_some(store, "Billing")
        assert store.get(eid).envelope["payload"]["card"] == "[REDACTED]"
    assert files_holding(billing, *SECRETS) == {}
    with tracedb.open(research, config=cfg) as store:
        eid = record_some(store, "Research")
        assert store.get(eid).envelope["payload"]["card"] == SECRET_INTENT  # no Research rule matches it
    assert files_holding(research, *COMMON) == {}


def test_the_hash_is_of_the_envelope_as_sent_replay_with_it_verifies_and_verify_passes(tmp_path):
    data = str(tmp_path / "data")
    config_path = write_config(str(tmp_path))
    with tracedb.open(data, config=load_config(config_path)) as store:
        eid = record_some(store)
        ex_hash = tracedb.compute_envelope_hash(envelope())
        rec = store.get(eid)
        assert rec.envelope["auth"]["Password"] == "[REDACTED]"  # stored redacted...
        assert rec.header.envelopeHash == ex_hash  # ...under the hash of the envelope as sent
        assert rec.header.replayable
        assert tracedb.ReplayEngine(rec).replay(env=envelope()).response == rec.finalResponse
    original = tmp_path / "envelope.json"
    original.write_text(json.dumps(envelope()))
    runner = CliRunner()
    base = ["--config", config_path, "--data-dir", data]
    assert runner.invoke(main, [*base, "verify"]).exit_code == 0
    replay = runner.invoke(main, [*base, "replay", eid, "--envelope", str(original)])
    assert replay.exit_code == 0, replay.output
    shown = json.loads(runner.invoke(main, [*base, "inspect", eid, "--json"]).stdout)
    assert shown["replayable"] is True
    # A tampered stored envelope is still caught: verify checks it against its own hash.
    import sqlite3

    with sqlite3.connect(os.path.join(data, "traces.db")) as conn:
        conn.execute("UPDATE traces SET envelope = json_set(envelope, '$.payload.question', 'other')")
    assert runner.invoke(main, [*base, "verify"]).exit_code == 4


def test_the_asyncio_api_redacts_the_same(tmp_path):
    data = str(tmp_path / "data")
    cfg = load_config(write_config(str(tmp_path)))

    async def run():
        astore = await tracedb.open_async(data, config=cfg)
        ex = await astore.start("Research", envelope())
        await ex.event("tool.requested", tool_call())
        await ex.finish(response())
        await astore.close()

    asyncio.run(run())
    assert files_holding(data, *COMMON) == {}
    with tracedb.open(data, config=cfg) as store:
        (row,) = store.list()
        assert store.get(row.execution_id).events[0].payload["api_key"] == "[REDACTED]"


def test_imports_are_redacted_and_importing_again_finds_them_present(tmp_path):
    from tests.interop.test_intentusnet import record_dict

    records, data = tmp_path / "records", str(tmp_path / "data")
    records.mkdir()
    rec = record_dict("exec-imp")
    rec["events"][0]["payload"] = tool_call()
    (records / "exec-imp.json").write_text(json.dumps(rec, indent=2))
    config_path = write_config(str(tmp_path))
    runner = CliRunner()
    base = ["--config", config_path, "--data-dir", data]
    first = runner.invoke(main, [*base, "import", "intentusnet", str(records)])
    assert first.exit_code == 0, first.output
    again = runner.invoke(main, [*base, "import", "intentusnet", str(records), "--json"])
    assert json.loads(again.stdout)["already_present"] == 1
    assert files_holding(data, SECRET_KEY, SECRET_PATTERN) == {}
    exported = runner.invoke(main, [*base, "export", "exec-imp", "--format", "intentusnet"]).stdout
    assert SECRET_KEY not in exported and "[REDACTED]" in exported


def test_without_rules_values_are_kept_and_bad_rules_are_config_errors(tmp_path):
    with tracedb.open(str(tmp_path / "plain"), config={"redact": False, "compact_interval_ms": 0}) as store:
        eid = record_some(store)
        assert store.get(eid).events[0].payload["api_key"] == SECRET_KEY
    bad = tmp_path / "bad.toml"
    bad.write_text("[redaction]\npatterns = ['(unclosed']\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(bad))
    assert "not a valid regular expression" in err.value.message
    result = CliRunner().invoke(main, ["--config", str(bad), "--data-dir", str(tmp_path / "x"), "inspect", "--list"])
    assert result.exit_code != 0 and "error:" in result.stderr
    off = tmp_path / "off.toml"
    off.write_text("[redaction]\nenabled = false\n")
    assert load_config(str(off)).redactor() is None
    assert load_config(str(off), env={"TRACEDB_REDACT": "true"}).redactor() is not None


def test_the_default_rules_cover_the_usual_key_names(tmp_path):
    with tracedb.open(str(tmp_path / "d"), config={"compact_interval_ms": 0}) as store:
        ex = store.start("I", {"intent": "I", "headers": {"Authorization": "Bearer x"}})
        ex.event("tool.requested", {"password": "p", "client_secret": "c", "X-Api-Key": "k", "keep": "v"})
        ex.finish({"status": "success"})
        rec = store.get(ex.execution_id)
        assert rec.envelope["headers"]["Authorization"] == "[REDACTED]"
        assert rec.events[0].payload == {
            "password": "[REDACTED]", "client_secret": "[REDACTED]", "X-Api-Key": "[REDACTED]", "keep": "v",
        }


def test_no_secret_in_any_segment_or_the_spare_across_rotations(tmp_path):
    # Small segments, events with secrets until the WAL has rotated and made its zero-filled
    # spare: every segment, sealed or open, the spare, the database and its -wal are read.
    data = str(tmp_path / "data")
    wal_dir = os.path.join(data, "wal")
    settings = {"compact_interval_ms": 0, "idle_timeout_s": 0, "wal_segment_size_bytes": 1 << 20}
    with tracedb.open(data, config=settings) as store:
        ex = store.start("Research", {"intent": "Research", "headers": {"Authorization": SECRET_KEY}})
        big = dict(tool_call(), api_key=SECRET_KEY, blob="x" * 600)
        for _ in range(20_000):
            ex.event("tool.requested", big)
            names = os.listdir(wal_dir)
            if "preallocated.tmp" in names and sum(n.endswith(".wal") for n in names) >= 2:
                break
        names = os.listdir(wal_dir)
        assert "preallocated.tmp" in names
        assert sum(n.endswith(".wal") for n in names) >= 2
        assert files_holding(data, SECRET_KEY) == {}
        ex.finish(response())
        store.compact()
        assert os.path.exists(os.path.join(data, "traces.db-wal"))
        assert files_holding(data, SECRET_KEY) == {}
    assert files_holding(data, SECRET_KEY) == {}


def test_keys_inside_an_orjson_fragment_are_redacted_too(tmp_path):
    # A payload is redacted as it is stored: parsed back from its JSON, so the keys a Fragment
    # spells (nested, in any case, with \u escapes) are seen like any other.
    import orjson

    with tracedb.open(str(tmp_path / "d"), config={"compact_interval_ms": 0}) as store:
        ex = store.start("I", {"intent": "I"})
        ex.event("tool.requested", {"call": orjson.Fragment(b'{"args": {"API-KEY": "sekret-one-81723", "q": "x"}}')})
        ex.event("tool.requested", orjson.Fragment(b'[{"\\u0061pi_key": "sekret-two-55120"}, {"keep": "v"}]'))
        ex.event("tool.requested", {"deep": [{"ok": {"Pass\\u0077ord": 1}}], "n": orjson.Fragment(b"7")})
        ex.finish({"status": "success"})
        store.compact()
        events = store.get(ex.execution_id).events
        assert events[0].payload == {"call": {"args": {"API-KEY": "[REDACTED]", "q": "x"}}}
        assert events[1].payload == [{"api_key": "[REDACTED]"}, {"keep": "v"}]
        # A key that only looks like one in the caller's text (a backslash in a plain key) is kept.
        assert events[2].payload == {"deep": [{"ok": {"Pass\\u0077ord": 1}}], "n": 7}
    assert files_holding(str(tmp_path / "d"), "sekret-one-81723", "sekret-two-55120") == {}


def test_the_ecosystems_key_forms_are_redacted_on_the_sync_asyncio_and_import_paths(tmp_path):
    # OpenTelemetry's header attributes, dotted and camelCase names, header lists of pairs, and
    # JSON text (OpenInference's llm.invocation_parameters), under the default rules.
    from .redaction_config import (
        ECOSYSTEM_SECRETS,
        check_ecosystem_attributes,
        check_ecosystem_payload,
        ecosystem_payload,
    )

    secrets = tuple(ECOSYSTEM_SECRETS.values())
    env = {"intent": "Research", "resource": ecosystem_payload()["otel"]["attributes"]}
    data = str(tmp_path / "data")
    with tracedb.open(data, config={"compact_interval_ms": 0, "idle_timeout_s": 0}) as store:
        ex = store.start("Research", env)
        ex.event("tool.requested", ecosystem_payload())
        ex.finish({"status": "success", "payload": ecosystem_payload()})
        assert files_holding(data, *secrets) == {}  # the WAL alone, before compaction
        store.compact()
        rec = store.get(ex.execution_id)
    check_ecosystem_payload(rec.events[0].payload)
    check_ecosystem_payload(rec.finalResponse["payload"])
    check_ecosystem_attributes(rec.envelope["resource"])
    assert rec.to_dict()["redacted"]["events"]["1"]

    async def record_async():
        async with await tracedb.open_async(str(tmp_path / "async"), config={"compact_interval_ms": 0}) as astore:
            aex = await astore.start("Research", env)
            await aex.event("tool.requested", ecosystem_payload())
            await aex.finish({"status": "success"})
            return (await astore.get(aex.execution_id)).events[0].payload

    check_ecosystem_payload(asyncio.run(record_async()))

    from tests.interop.test_intentusnet import record_dict

    records = tmp_path / "records"
    records.mkdir()
    imported = record_dict("exec-eco")
    imported["events"][0]["payload"] = ecosystem_payload()
    (records / "exec-eco.json").write_text(json.dumps(imported, indent=2))
    runner = CliRunner()
    out = runner.invoke(main, ["--data-dir", data, "import", "intentusnet", str(records)])
    assert out.exit_code == 0, out.output
    exported = runner.invoke(main, ["--data-dir", data, "export", "--all", "--format", "intentusnet"]).stdout
    assert "exec-eco" in exported and [s for s in secrets if s in exported] == []
    for d in (data, str(tmp_path / "async")):
        assert files_holding(d, *secrets) == {}
