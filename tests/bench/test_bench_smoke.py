"""Smoke tests of scripts/bench's measurements of the user's path (benchmarks/api.py, cli.py and
the IntentusNet baseline): tiny sizes, so that a change to the library that breaks the bench
shows up in the test suite and not in the next benchmark run."""

from __future__ import annotations

import os
import uuid

import pytest

from benchmarks import api, cli, run
from benchmarks.common import EVENTS_PER_EXECUTION, agent_payload, payload_bytes


def test_payloads_have_the_sizes_the_rows_name():
    assert payload_bytes(200) == 200 and payload_bytes(600) == 600
    assert agent_payload(600, 3)["call"] == 3


def test_ingest_through_both_apis_counts_acknowledged_events(tmp_path):
    a = api.ingest_async(str(tmp_path), 8, 200, 0.3, warmup=0.1)
    assert a["events_per_s"] > 0 and a["executions"] > 0 and min(a["lat"]) > 0
    s = api.ingest_sync(str(tmp_path), 4, 600, 0.3, warmup=0.1)
    assert s["events_per_s"] > 0 and min(s["lat"]) > 0
    # The process's CPU over the measured window, per acknowledged event (all threads).
    assert a["cpu_us_per_event"] > 0 and s["cpu_us_per_event"] > 0
    assert len(api.wal_records(600, 4)) == 4
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make_id", [None, lambda: f"exec-{uuid.uuid4().hex}"], ids=["generated", "uuid4"])
def test_interleaved_compaction_compacts_every_event_in_chunks(tmp_path, make_id):
    r = api.compaction_interleaved(str(tmp_path), 1000, concurrency=16, chunk=300, make_id=make_id)
    assert r["events"] == 1000 and r["executions"] == 1000 // EVENTS_PER_EXECUTION
    assert r["compactions"] >= 3  # stopped mid-recording, then once at the end
    assert r["events_per_s"] > 0 and r["raw_rows_per_s"] > 0 and r["raw_batched_rows_per_s"] > 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("batches", [1, 4, 7])
def test_the_raw_baseline_inserts_every_row_in_the_transactions_asked_for(tmp_path, monkeypatch, batches):
    """The baseline in batches commits the same rows as in one transaction (each trace before
    its steps, or the foreign key refuses them), in as many transactions as asked."""
    import sqlite3

    from sqlalchemy import event as sa_event

    from tracedb.projection import db

    source = tracedb_store_with_interleaved_executions(tmp_path)
    target = str(tmp_path / f"raw-{batches}.db")
    statements: list = []
    real = db.create_engine

    def watched_engine(*a, **k):
        engine = real(*a, **k)
        sa_event.listen(engine, "connect", lambda c, _r: c.set_trace_callback(statements.append))
        return engine

    monkeypatch.setattr(db, "create_engine", watched_engine)
    assert api.executemany_baseline(source, target, batches=batches) > 0
    # The transactions that insert steps, each ended by its own COMMIT.
    text = "\n".join(statements)
    with_steps = [t for t in text.split("COMMIT") if "INSERT INTO trace_steps" in t]
    assert len(with_steps) == batches
    a, b = sqlite3.connect(source), sqlite3.connect(target)
    for query in ("SELECT * FROM trace_steps ORDER BY execution_id, seq", "SELECT * FROM traces ORDER BY execution_id"):
        assert a.execute(query).fetchall() == b.execute(query).fetchall()


def tracedb_store_with_interleaved_executions(tmp_path) -> str:
    """A store's database holding 40 executions of 5 events recorded four at a time."""
    import tracedb

    data = str(tmp_path / "data")
    with tracedb.open(data, config={"compact_interval_ms": 0}) as store:
        running = []
        for i in range(40):
            running.append(store.start("X", {"i": i}))
            if len(running) == 4:
                for k in range(4):
                    for ex in running:
                        ex.event("tool.requested", {"k": k})
                for ex in running:
                    ex.finish({"status": "success"})
                running = []
        store.compact()
    return os.path.join(data, "traces.db")


def test_replay_from_the_store_times_each_sample(tmp_path):
    r = api.replay_from_store(str(tmp_path), 30, samples=20)
    assert r["executions"] == 30
    assert all(len(r[k]) == 20 for k in ("get", "replay", "get_and_replay", "raw_sqlite3"))
    assert list(tmp_path.iterdir()) == []


def test_the_cli_section_runs_every_read_command(tmp_path):
    seen = []
    out = cli.run(sizes=(200,), workdir=str(tmp_path), runs=1, on_result=lambda *a: seen.append(a[1]))
    assert out["help"]["exit_codes"] == [0] and out["help"]["rss_mb"] > 5
    store = out["stores"]["200"]
    assert store["executions"] == 200 // EVENTS_PER_EXECUTION
    assert [name for name, _ in cli.COMMANDS] == list(store["commands"])
    assert all(fig["exit_codes"] == [0] and fig["wall_s"] > 0 for fig in store["commands"].values())
    assert seen[:2] == ["tracedb --help", "build"]
    assert list(tmp_path.iterdir()) == []


def test_the_intentusnet_per_execution_baseline_writes_a_file_per_execution(tmp_path, capsys):
    r = run.bench_intentusnet_per_execution(str(tmp_path), 2, 0.3, warmup=0.1)
    assert r["rate"] > 0 and r["p99_ms"] > 0
    assert "executions, a WAL file and a record file each" in capsys.readouterr().out
    endless = run.bench_intentusnet_per_execution(str(tmp_path), 2, 0.3, warmup=0.1, endless=True)
    assert endless["rate"] > 0
    assert "2 executions" in capsys.readouterr().out  # one per thread for the whole run
    assert list(tmp_path.iterdir()) == []


def test_the_langgraph_section_runs_every_saver_on_the_same_graph(tmp_path):
    from benchmarks import langgraph

    calls = langgraph.captured_calls()
    assert [c[0] for c in calls].count("put") == langgraph.STEPS + 2  # input, __start__, each step
    r = langgraph.run(str(tmp_path), seconds=0.3, warmup=0.1, producers=4)
    for load in ("graph", "saver"):
        rows = r[load]
        names = list(rows)
        assert names[0].startswith("tracedb") and any(n.startswith("AsyncSqliteSaver") for n in names)
        assert names[-1].startswith("InMemorySaver")
        for fig in rows.values():
            assert fig["checkpoints"] > 0 and fig["checkpoints_per_s"] > 0 and fig["p99_ms"] >= fig["p50_ms"] > 0
    assert r["state_bytes"] == 641
    lines = langgraph.report_lines(r)
    assert any("tracedb / AsyncSqliteSaver" in line for line in lines)
    assert list(tmp_path.iterdir()) == []


def test_the_retention_section_prunes_a_tenth_and_keeps_pins_and_fork_parents(tmp_path):
    from benchmarks import retention

    pg_url = os.environ.get("TRACEDB_TEST_PG_URL")
    r = retention.run(str(tmp_path), pg_url, events=5_000)
    for name in ("sqlite", "postgresql") if pg_url else ("sqlite",):
        fig = r[name]
        assert fig["ingest"]["events"] == 5_000
        p = fig["prune"]
        # 3 days of 33: about a tenth of the executions, less what stays.
        assert 0 < p["deleted_steps"] < 5_000 * 0.2 and p["deleted_steps"] % 50 == 0
        assert p["kept_pinned"] >= 1 and p["kept_parents"] >= 1
        assert fig["ratio"] == p["steps_per_s"] / fig["ingest"]["events_per_s"]
        assert fig["met"] == (fig["ratio"] >= 2.0)
    lines = retention.report_lines(r)
    assert any("target >= 2x" in line for line in lines)
    assert list(tmp_path.iterdir()) == []


def test_the_sidecar_rows_run_the_real_clients_beside_the_loader():
    from benchmarks import sidecar_clients

    # The default temporary directory: a Unix socket's path must stay short.
    got = sidecar_clients.run(clients=2, window=4, seconds=0.5, warmup=0.2, per_exec=5, quiet=True)
    for kind in sidecar_clients.KINDS:
        r = got[kind]
        assert r["acked"] > 0 and r["p99_ms"] > 0, kind
        assert r["serve_cpu_us"] > 0 and r["client_cpu_us"] > 0, kind
    assert got["wal_append"]["cpu_us_per_event"] > 0


def test_the_outcomes_section_compacts_with_the_fold_on_and_off_and_puts_it_back(tmp_path):
    from benchmarks import outcomes as bench
    from tracedb.recorder import staging
    from tracedb.records import fold

    before = (fold.may_matter, fold.fold_facts, staging.event_facts)
    r = bench.derivation_cost(str(tmp_path), 10, rounds=1, events_per=4)
    assert r["events"] == 40 and r["with_fold_events_per_s"] > 0 and r["without_fold_events_per_s"] > 0
    assert (fold.may_matter, fold.fold_facts, staging.event_facts) == before
