"""Outcomes through the sidecar: a real `tracedb serve` process, recorded into with the sidecar
client; the listing carries outcome, error, models, tokens and cost, and /metrics counts the
executions by intent and outcome, tokens and cost by model."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.waiting import wait_until
from tracedb.cli import main
from tracedb.sidecar.client import Client

from .helpers import free_port
from .test_e2e import _owner_get


def test_the_sidecar_client_records_outcomes_that_list_and_show_in_metrics(serve_process):
    port = free_port()
    srv = serve_process("--http-port", str(port))
    with Client("unix:" + srv.socket) as client:
        ex = client.start("Summarize", {"intent": "Summarize"})
        ex.event("llm.responded", {"response": {"model": "gpt-4o-mini", "usage": {"input_tokens": 2000, "output_tokens": 1000}}})
        ex.event("tool.responded", {"name": "fetch", "error": {"code": "TOOL_TIMEOUT", "message": "30 s"}})
        ex.finish({"status": "error", "error": {"code": "TOOL_TIMEOUT", "message": "gave up"}})
        ok = client.start("Summarize", {"intent": "Summarize"})
        ok.finish({"status": "success", "payload": {}})
        rec = client.get(ex.execution_id)
    assert [e.error for e in rec.events] == [None, {"code": "TOOL_TIMEOUT", "message": "30 s"},
                                             {"code": "TOOL_TIMEOUT", "message": "gave up"}]
    url = f"http://127.0.0.1:{port}/metrics"
    failed_line = 'tracedb_executions{intent="Summarize",outcome="failed"} 1.0'

    def scraped() -> str:
        text = _owner_get(srv, url).decode()
        return text if failed_line in text else ""

    wait_until(scraped, 30, "the failed execution in /metrics (compaction, then a refresh within 5 s)")
    text = scraped()
    assert 'tracedb_executions{intent="Summarize",outcome="succeeded"} 1.0' in text
    assert 'tracedb_tokens{direction="input",model="gpt-4o-mini"} 2000.0' in text
    assert 'tracedb_tokens{direction="output",model="gpt-4o-mini"} 1000.0' in text
    assert 'tracedb_cost_usd{model="gpt-4o-mini"} 0.0009' in text  # $0.15 and $0.60 per M tokens
    code, err = srv.terminate()
    assert code == 0, err
    listed = CliRunner().invoke(main, ["--data-dir", srv.data_dir, "inspect", "--list", "--outcome", "failed", "--json"])
    rows = json.loads(listed.stdout)
    assert [(r["execution_id"], r["outcome"], r["error"], r["models"], r["input_tokens"], r["output_tokens"])
            for r in rows] == [(ex.execution_id, "failed", {"seq": 2, "type": "tool.responded", "code": "TOOL_TIMEOUT",
                                                            "message": "30 s"}, ["gpt-4o-mini"], 2000, 1000)]
    assert abs(rows[0]["cost_usd"] - 0.0009) < 1e-12
