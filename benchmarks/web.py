"""The web view's server time on a large store, and what its reads cost the recorder's ingest.

    from benchmarks import web
    result = web.run(workdir="bench-out", executions=1_000_000)

- A store of `executions` executions (one event each), written straight into a scratch SQLite
  file through the models (Core executemany), not through the recorder: the reads are measured
  here, not the writes. Built once and kept under the bench's working directory.
- Server time: each page through the ASGI app in process (`httpx.ASGITransport`), request to
  last byte, no network: the list page, the list filtered several ways (outcome, model, error,
  cost and duration too), a deep page, one execution's page, the overview (`stats` three ways),
  and the page of a 10,000-event execution, flat and nested (its span tree drawn too).
- Ingest next to the view: events/s acknowledged by `tracedb.open_async` with 32 concurrent
  executions (compaction on), alone, then with a `tracedb ui` process on the same data directory
  answering list, filter and counts requests: 10 a second (a few people looking), then back to
  back (the worst a busy dashboard could ask).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import orjson

from .common import T0_NS, TOOL_RESULT, event_record, fill_store_wal, pct

INTENTS = [f"Intent{i:02d}" for i in range(20)] + ["AnswerQuestion", "SummarizeDocument"]
# Of every 100 executions: 2 running, 5 incomplete, 3 invalidated, the rest completed.
_STATUS_OF = ["running"] * 2 + ["incomplete"] * 5 + ["invalidated"] * 3 + ["completed"] * 90
_REASON = {"running": None, "completed": None, "incomplete": "execution_incomplete",
           "invalidated": "manually_invalidated"}


_OUTCOME_OF = {"running": "running", "incomplete": "incomplete", "invalidated": "succeeded"}
_MODELS = (["gpt-4o-mini"], ["gpt-4o"], ["gpt-4o-mini", "gpt-4o"], ["local-model"])


def _outcome_columns(n: int, status: str, created: int) -> dict:
    """What the compactor would have derived (tracedb.records.outcomes): 1 in 25 completed executions
    failed, four mixes of models (one the price table does not know), tokens and cost that vary."""
    failed = status == "completed" and n % 25 == 0
    models = _MODELS[n % len(_MODELS)]
    tokens_in, tokens_out = 200 + n % 3000, 20 + n % 400
    cost = None if "local-model" in models else round(tokens_in * 0.15e-6 + tokens_out * 0.6e-6, 9)
    return {
        "outcome": "failed" if failed else _OUTCOME_OF.get(status, "succeeded"),
        "error_seq": 1 if failed else None, "error_type": "tool.responded" if failed else None,
        "error_code": ("TOOL_TIMEOUT", "RATE_LIMITED")[n % 2] if failed else None,
        "error_message": "the tool timed out" if failed else None,
        "models": models, "input_tokens": tokens_in, "output_tokens": tokens_out, "cost_usd": cost,
        "prices_version": "bench", "last_event_ns": created + 5_000_000 + (n % 97) * 40_000_000,
    }


def build_store(data_dir: str, executions: int) -> float:
    """A store of `executions` executions of one event each, one second apart; seconds taken.
    Kept when it exists already (the file is named after its size)."""
    marker = os.path.join(data_dir, f"BUILT-{executions}-outcomes")
    if os.path.exists(marker):
        return 0.0
    shutil.rmtree(data_dir, ignore_errors=True)
    import sqlalchemy as sa

    import tracedb
    from tracedb import compute_envelope_hash
    from tracedb.projection import checksums
    from tracedb.projection import db
    from tracedb.projection.models import trace_steps, traces

    t0 = time.perf_counter()
    tracedb.open(data_dir, config={"compact_interval_ms": 0}).close()  # the schema, by migrations
    engine = db.create_engine(os.path.join(data_dir, "traces.db"), write=True)
    envelope = {"intent": "AnswerQuestion", "payload": {"question": "What is 17 * 23?"}}
    # Real hashes and checksums: a read judges each row (a wrong one reads record_corrupted).
    envelope_hash = compute_envelope_hash(envelope)
    final = {"status": "success"}
    final_crc, payload_crc = checksums.of_bytes(orjson.dumps(final)), checksums.of_bytes(orjson.dumps(TOOL_RESULT))
    batch = 50_000
    for start in range(0, executions, batch):
        rows, steps = [], []
        for n in range(start, min(executions, start + batch)):
            status = _STATUS_OF[n % 100]
            created = T0_NS + n * 1_000_000_000
            eid = f"exec-{n:010d}"
            rows.append({
                "execution_id": eid, "recorder_id": "bench", "intent": INTENTS[n % len(INTENTS)],
                "status": status, "replayable": status == "completed", "replayable_reason": _REASON[status],
                "status_note": None, "envelope": envelope, "envelope_hash": envelope_hash,
                "router_decision": None, "router_decision_crc": 0, "meta_crc": 0,
                "final_response": final if status == "completed" else None,
                "final_response_crc": final_crc if status == "completed" else 0,
                "last_seq": 1, "created_at_ns": created, "updated_at_ns": created + 5_000_000,
                "parent_execution_id": None, "forked_at_seq": None, "pinned": False,
                **_outcome_columns(n, status, created),
            })
            steps.append({"execution_id": eid, "seq": 1, "type": "tool.responded", "payload": TOOL_RESULT,
                          "recorded_at_ns": created + 5_000_000, "lsn": n + 1, "payload_crc": payload_crc})
        with engine.begin() as conn:
            conn.execute(sa.insert(traces), rows)
            conn.execute(sa.insert(trace_steps), steps)
    engine.dispose()
    open(marker, "w").close()
    return time.perf_counter() - t0


def build_long_execution(data_dir: str, events: int = 10_000, nested: bool = False) -> str:
    """One execution of `events` events, LLM and tool calls paired, recorded as the store's
    own WAL records and compacted by opening the store. Returns its id. `nested`: each call a
    span (`span_id`, `parent_span_id`, as the OTel mapping records them) under one of 50 agent
    spans: the page draws its span tree too."""
    import wal
    from tracedb import compute_envelope_hash
    from tracedb.records.codec import encode_finish, encode_start

    import tracedb

    shutil.rmtree(data_dir, ignore_errors=True)
    w = wal.open_wal(os.path.join(data_dir, "wal"))
    eid = "exec-long-0001"
    env = {"intent": "LongAgent"}
    records = [encode_start(eid, "LongAgent", env, compute_envelope_hash(env), T0_NS)]
    kinds = ("llm", "tool")
    for seq in range(1, events):
        kind = kinds[(seq - 1) // 2 % 2]
        if seq % 2:
            payload = {"name": "calculator", "arguments": {"n": seq}} if kind == "tool" else {
                "prompt_hash": f"sha256:{seq}", "request": {"model": "m"}}
            typ = f"{kind}.requested"
        else:
            payload = {"name": "calculator", "request_seq": seq - 1, "response": TOOL_RESULT} if kind == "tool" else {
                "prompt_hash": f"sha256:{seq - 1}", "request_seq": seq - 1, "response": {"content": "ok"}}
            typ = f"{kind}.responded"
        if nested:
            call = (seq + 1) // 2
            payload.update(span_id=f"{call:016x}", parent_span_id=f"a{call % 50:015x}")
        records.append(event_record(eid, seq, typ, payload, T0_NS + seq * 3_000_000))
    records.append(encode_finish(eid, events, {"status": "success"}, T0_NS + events * 3_000_000))
    for i in range(0, len(records), 5000):
        w.append_many(records[i:i + 5000])
    w.close()
    tracedb.open(data_dir, config={"compact_interval_ms": 0}).close()
    return eid


async def _server_times(data_dir: str, paths: dict, repeats: int) -> dict:
    import httpx

    from tracedb.config import load_config
    from tracedb.reads.reader import AsyncReader
    from tracedb.web import create_app

    reader = await AsyncReader.open(load_config(overrides={"data_dir": data_dir}))
    out = {}
    try:
        transport = httpx.ASGITransport(app=create_app(reader))
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
            for name, path in paths.items():
                lat = []
                for i in range(repeats + 1):
                    t = time.perf_counter()
                    r = await c.get(path)
                    elapsed = time.perf_counter() - t
                    if r.status_code != 200:
                        raise RuntimeError(f"{path}: HTTP {r.status_code}")
                    if i:  # the first one warms the caches, not counted
                        lat.append(elapsed)
                lat.sort()
                out[name] = {"path": path, "p50_ms": pct(lat, 0.5) * 1e3, "p95_ms": pct(lat, 0.95) * 1e3,
                             "bytes": len(r.content)}
    finally:
        await reader.close()
    return out


def _deep_cursor(data_dir: str, depth: int) -> str:
    from tracedb.reads.paging import encode_cursor

    n = depth  # executions are one second apart, exec-{n} created at T0 + n s
    return encode_cursor(T0_NS + n * 1_000_000_000, f"exec-{n:010d}")


async def _ingest(data_dir: str, seconds: float, producers: int = 32) -> float:
    """Events/s acknowledged by the embedded async store, `producers` executions at once."""
    import tracedb

    store = await tracedb.open_async(data_dir, config={"compact_interval_ms": 50, "idle_timeout_s": 0})
    count = 0
    stop = time.perf_counter() + seconds

    async def producer(k: int) -> None:
        nonlocal count
        while time.perf_counter() < stop:
            ex = await store.start("Ingest", {"intent": "Ingest", "k": k})
            for _ in range(9):
                await ex.event("tool.responded", TOOL_RESULT)
                count += 1
            await ex.finish({"status": "success"})
            count += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(producer(k) for k in range(producers)))
    elapsed = time.perf_counter() - t0
    await store.close()
    return count / elapsed


def _ui_load(url: str, paths: list, stop: threading.Event, counts: list, per_s: float | None) -> None:
    """Request the view's pages until `stop`, `per_s` a second (None: one after another, as fast
    as it answers); counts[0] answered, counts[1] failed. `url` is the address the view printed,
    its token in the query: sent as a bearer header instead."""
    from urllib.parse import parse_qs, urlsplit

    import httpx

    parts = urlsplit(url)
    url = f"{parts.scheme}://{parts.netloc}{parts.path}"
    token = parse_qs(parts.query).get("token", [""])[0]
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token}"}) as c:
        i = 0
        t0 = time.perf_counter()
        while not stop.is_set():
            try:
                ok = c.get(url + paths[i % len(paths)].lstrip("/")).status_code == 200
            except httpx.HTTPError:
                ok = False
            counts[0 if ok else 1] += 1
            i += 1
            if per_s:
                stop.wait(max(0.0, t0 + i / per_s - time.perf_counter()))  # a load generator's pacing


def ingest_with_and_without_ui(workdir: str, seconds: float, ui_rates=(10.0, None)) -> dict:
    """Ingest alone, then with `tracedb ui` (its own process) answering list, filter, counts and
    live requests: at each rate of `ui_rates` (requests/s; None: back to back, as fast as it
    answers)."""
    base = tempfile.mkdtemp(dir=workdir)
    try:
        alone = asyncio.run(_ingest(os.path.join(base, "alone"), seconds))
        data_dir = os.path.join(base, "with-ui")
        asyncio.run(_ingest(data_dir, 0.5))  # a store with executions for the view to show
        proc = subprocess.Popen([sys.executable, "-m", "tracedb", "--data-dir", data_dir, "ui", "--port", "0", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        runs = {}
        try:
            url = orjson.loads(proc.stdout.readline())["url"]
            paths = ["/", "/?status=completed", "/counts", "/?q=ingest", "/?replayable=no", "/?limit=200"]
            for rate in ui_rates:
                stop = threading.Event()
                counts = [0, 0]
                loader = threading.Thread(target=_ui_load, args=(url, paths, stop, counts, rate))
                loader.start()
                try:
                    t0 = time.perf_counter()
                    with_ui = asyncio.run(_ingest(data_dir, seconds))
                    answered = counts[0] / (time.perf_counter() - t0)
                finally:
                    stop.set()
                    loader.join()
                runs["flat out" if rate is None else f"{rate:g}/s"] = {
                    "events_per_s": with_ui, "ratio": with_ui / alone, "ui_requests_per_s": answered,
                    "ui_requests_failed": counts[1]}
        finally:
            proc.terminate()
            proc.wait(30)
            proc.stdout.close()
        return {"alone_events_per_s": alone, "with_ui": runs}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(workdir: str, executions: int = 1_000_000, repeats: int = 40, ingest_seconds: float = 5.0,
        long_events: int = 10_000) -> dict:
    """Every figure of the section, as a dict."""
    big = os.path.join(workdir, f"web-{executions}")
    build_s = build_store(big, executions)
    last = executions - 1
    paths = {
        "list page (newest 50)": "/",
        "filtered: status=incomplete": "/?status=incomplete",
        "filtered: replayable=no": "/?replayable=no",
        "filtered: intent=AnswerQuestion": "/?intent=AnswerQuestion",
        "filtered: search 'summar'": "/?q=summar",
        "filtered: since 2h (nothing newer)": "/?since=2h",
        "filtered: status + time range": "/?status=completed&since=2023-11-14T22:13:20Z&until=2023-11-20T00:00:00Z",
        "counts per status (loaded after the page)": "/counts",
        "counts per status, search 'summar'": "/counts?q=summar",
        "a deep page (500,000 back)": f"/?before={_deep_cursor(big, last - 500_000)}",
        "one execution": f"/e/exec-{last:010d}",
        "filtered: outcome=failed": "/?outcome=failed",
        "filtered: model=gpt-4o": "/?model=gpt-4o",
        "filtered: error=RATE_LIMITED": "/?error=RATE_LIMITED",
        "filtered: min_cost=0.002 + slower_than=3s": "/?min_cost=0.002&slower_than=3s",
        "overview (stats per day, by intent, by model)": "/overview",
        "overview since 7d, per hour": "/overview?since=2023-11-14T22:13:20Z&per=hour",
    }
    lists = asyncio.run(_server_times(big, paths, repeats))
    long_dir = os.path.join(workdir, "web-long")
    eid = build_long_execution(long_dir, long_events)
    long = asyncio.run(_server_times(long_dir, {f"timeline of a {long_events:,}-event execution": f"/e/{eid}"},
                                     max(5, repeats // 4)))
    shutil.rmtree(long_dir, ignore_errors=True)
    eid = build_long_execution(long_dir, long_events, nested=True)
    long.update(asyncio.run(_server_times(
        long_dir, {f"timeline and span tree of a {long_events:,}-event nested execution": f"/e/{eid}"},
        max(5, repeats // 4))))
    shutil.rmtree(long_dir, ignore_errors=True)
    ingest = ingest_with_and_without_ui(workdir, ingest_seconds)
    return {"executions": executions, "build_s": build_s, "pages": {**lists, **long}, "ingest": ingest}
