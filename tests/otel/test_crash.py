"""Every span acknowledged with 200 survives a SIGKILL of the recorder."""

from __future__ import annotations

import threading
import time

import httpx
import orjson
import pytest

from tests.waiting import wait_until

from .conftest import tracedb_cli

pytest.importorskip("opentelemetry.proto")
pytestmark = pytest.mark.timeout(240)


def test_every_acknowledged_span_survives_a_recorder_sigkill(otlp_serve, data_dir):
    from benchmarks import otel as bench

    srv = otlp_serve()
    body, spans = bench.template(0, 64)  # 8 traces of 8 GenAI spans a request
    acked: list[int] = []  # the tags of the requests answered 200
    failed = []
    counter = iter(range(1, 1 << 30))
    lock = threading.Lock()
    stop = threading.Event()

    def exporter() -> None:
        with httpx.Client(timeout=30, headers=srv.auth) as http:
            while not stop.is_set():
                with lock:
                    tag = next(counter)
                try:
                    r = http.post(srv.endpoint, content=body.replace(bench.TAG, bench.request_tag(tag)),
                                  headers={"Content-Type": "application/x-protobuf"})
                except httpx.HTTPError:
                    failed.append(tag)  # the recorder died under this one: no answer, no promise
                    return
                if r.status_code == 200:
                    acked.append(tag)

    threads = [threading.Thread(target=exporter) for _ in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) >= 12, 120, "a dozen acknowledged requests")
    srv.kill()  # SIGKILL mid-load
    stop.set()
    for t in threads:
        t.join(60)
    assert failed, "the recorder was killed under load: some request must have gone unanswered"

    out = tracedb_cli(data_dir, "recover")
    assert out.returncode == 0, out.stderr
    out = tracedb_cli(data_dir, "inspect", "--list", "--all", "--format", "json")
    rows = {row["execution_id"]: row for row in orjson.loads(out.stdout)}
    tids = {s.trace_id for s in spans}
    for tag in acked:
        suffix = bench.request_tag(tag).hex()
        for tid in tids:
            eid = "otel-" + tid.replace(bench.TAG.hex(), suffix)
            row = rows.get(eid)
            assert row is not None, f"acknowledged trace {eid} lost"
            # 3 chats and 3 tools (2 events each), a plain span, the root, FINAL_RESPONSE.
            assert row["status"] == "completed" and row["last_seq"] == 15, row
