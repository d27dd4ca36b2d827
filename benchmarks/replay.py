"""Measurement hooks for scripts/bench: exact replay latency in-process, batch replay throughput.

They return raw figures (seconds); scripts/bench formats and compares them.
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from tracedb import ExecutionEvent, ExecutionHeader, ExecutionRecord, compute_envelope_hash
from tracedb.records.record import FINAL_RESPONSE
from tracedb.replay import ReplayEngine, batch_replay


def sample_record(
    execution_id: str = "exec-bench-0001", *, events: int = 8, payload_bytes: int = 200
) -> ExecutionRecord:
    """A completed, replayable record of the usual size: a few events and a ~200-byte payload."""
    envelope = {"intent": "summarize", "payload": {"doc": "d" * 64}, "routingMetadata": {"host": "a"}}
    response = {"status": "success", "payload": {"text": "x" * payload_bytes}, "metadata": {"agent": "bench"}}
    evs = [
        ExecutionEvent(i, "tool.responded", {"name": "web_search", "response": i})
        for i in range(1, events)
    ]
    evs.append(ExecutionEvent(events, FINAL_RESPONSE, response))
    return ExecutionRecord(
        header=ExecutionHeader(
            execution_id, "2026-01-01T00:00:00Z", compute_envelope_hash(envelope), True, None
        ),
        envelope=envelope,
        events=evs,
        finalResponse=response,
        status="completed",
        intent="summarize",
    )


def exact_replay_latencies(
    record: Optional[ExecutionRecord] = None,
    *,
    iterations: int = 100_000,
    fresh_engine: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> List[float]:
    """Seconds per `ReplayEngine.replay()` call, one sample per call.

    With `fresh_engine`, each sample also builds the engine (first replay of a loaded record:
    the structural checks run); without, it is the steady state of a reused engine.
    """
    record = record or sample_record()
    engine = ReplayEngine(record)
    engine.replay()  # warm: the structural checks are cached per engine
    out: List[float] = []
    append = out.append
    for _ in range(iterations):
        t = clock()
        if fresh_engine:
            ReplayEngine(record).replay()
        else:
            engine.replay()
        append(clock() - t)
    return out


def batch_replay_rate(
    store: Any, execution_ids: Sequence[str], *, clock: Callable[[], float] = time.perf_counter
) -> Tuple[float, int]:
    """(records per second, records) for one `batch_replay(store, execution_ids)` over the store."""
    t = clock()
    results = batch_replay(store, execution_ids)
    elapsed = clock() - t
    return (len(results) / elapsed if elapsed > 0 else float("inf")), len(results)
