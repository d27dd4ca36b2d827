"""What the benchmarks share: the event they record, a WAL filled with the store's records of
it, percentiles, and the lines they print."""

from __future__ import annotations

import argparse
import hashlib
import os
import threading
import time
from typing import Optional

import orjson

# The recording time of every generated execution, in ns (events are numbered from it).
T0_NS = 1_700_000_000_000_000_000

# A tool call's outcome: the payload of a ~200-byte event, the shape an agent records.
TOOL_RESULT = {
    "tool": "web_search",
    "args": {"q": "capital of France"},
    "result": "Paris is the capital of France.",
    "latency_ms": 12,
}


def event_payload(i: int) -> dict:
    """A ~200-byte JSON event, the shape an agent records for a tool call."""
    return {
        "op": "event",
        "id": "exec-000000000001",
        "seq": i,
        "type": "tool.responded",
        "payload": TOOL_RESULT,
        "t": T0_NS + i,
    }


def execution_envelope(n: int) -> dict:
    """The envelope of the `n`-th generated execution."""
    return {"intent": "summarize", "n": n}


def event_record(eid: str, seq: int, type_: str, payload, t: int, payload_json: Optional[bytes] = None) -> bytes:
    """The WAL record the store writes for an event: its frame carries the payload's facts."""
    from tracedb.records.codec import encode_event
    from tracedb.records.outcomes import event_facts

    pj = orjson.dumps(payload) if payload_json is None else payload_json
    return encode_event(eid, seq, type_, pj, t, event_facts(type_, pj, payload))


def fill_store_wal(wal_dir: str, executions: int, events_per: int, prefix: str = "exec",
                   spacing_ns: int = 0, scattered_ids: bool = False) -> int:
    """Fill a WAL with the records the store writes for `executions` executions of
    `events_per` events each (start, events, then the finish, which is the last event);
    execution ids are f"{prefix}-{n:08d}" (with `scattered_ids`, 32 hex digits of a hash of n
    instead: keys in no time order, like the uuid4 ids a caller chooses), the n-th started at
    T0_NS + n * spacing_ns. Returns the number of events."""
    import wal

    from tracedb import compute_envelope_hash
    from tracedb.records.codec import encode_finish, encode_start

    w = wal.open_wal(wal_dir)
    payload = orjson.dumps(TOOL_RESULT)
    batch: list[bytes] = []
    n_events = 0
    for e in range(executions):
        eid = f"{prefix}-{hashlib.blake2b(e.to_bytes(8, 'big'), digest_size=16).hexdigest()}" if scattered_ids \
            else f"{prefix}-{e:08d}"
        env = execution_envelope(e)
        t0 = T0_NS + e * spacing_ns
        batch.append(encode_start(eid, "summarize", env, compute_envelope_hash(env), t0))
        for i in range(1, events_per):
            batch.append(event_record(eid, i, "tool.responded", TOOL_RESULT, t0 + i, payload))
        batch.append(encode_finish(eid, events_per, {"status": "success", "payload": {"n": e}}, t0 + events_per))
        n_events += events_per
        if len(batch) >= 10_000:
            w.append_many(batch)
            batch = []
    if batch:
        w.append_many(batch)
    w.close()
    return n_events


def pct(sorted_values: list[float], q: float) -> float:
    """The `q` quantile of already sorted values (NaN when there are none)."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def rate_line(name: str, rate: float) -> str:
    """A result line: what was measured, and its rate per second."""
    return f"  {name:<56} {rate:>12,.0f}/s"


def ratio_line(label: str, r: float) -> str:
    """A line comparing two rates of the same run."""
    return f"  ratio {label:<52} {r:10.2f}x" if r < 10 else f"  ratio {label:<52} {r:10.1f}x"


def pg_command_line(doc: str, url_help: str = "") -> argparse.ArgumentParser:
    """The command line of a section run alone (`python -m benchmarks.NAME`): `doc` as its help,
    a PostgreSQL URL (default: $TRACEDB_TEST_PG_URL; `url_help` adds to its help) and --json."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", nargs="?", default=os.environ.get("TRACEDB_TEST_PG_URL"),
                    help=f"PostgreSQL URL (default: $TRACEDB_TEST_PG_URL{url_help})")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


def print_result(result: dict, as_json: bool, report_lines) -> None:
    """A section's result as indented JSON, or as its report lines."""
    if as_json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(report_lines(result)))


# -- the user's workload: what an agent records through the public API ------------------------

# An execution as an agent records it: a start, then model and tool calls, then the final
# response. EVENTS_PER_EXECUTION counts the steps stored for it (the events and the finish).
EVENTS_PER_EXECUTION = 10
AGENT_INTENT = "AnswerQuestion"
AGENT_EVENT_TYPES = ("llm.requested", "llm.responded", "tool.requested", "tool.responded")


def agent_envelope(n: int) -> dict:
    """The envelope an agent starts an execution with (~250 bytes of JSON)."""
    return {
        "intent": AGENT_INTENT,
        "payload": {"question": "What is the capital of France, and how large is it?", "user": f"u-{n % 997}"},
        "context": {"sourceAgent": "assistant", "timestamp": "2026-01-15T10:30:00+00:00"},
        "metadata": {"requestId": f"req-{n}", "source": "bench"},
    }


def agent_payload(size: int, i: int = 0) -> dict:
    """An event payload whose JSON is about `size` bytes: a tool or model call and its result."""
    base = {"name": "web_search", "call": i, "arguments": {"q": "capital of France"}, "result": ""}
    fill = max(0, size - len(orjson.dumps(base)))
    base["result"] = ("Paris is the capital and largest city of France. " * (fill // 50 + 1))[:fill]
    return base


def agent_response(n: int) -> dict:
    """The final response an execution finishes with."""
    return {"status": "success", "payload": {"answer": "Paris", "n": n}, "metadata": {"agent": "assistant"}}


def agent_event_type(seq: int) -> str:
    """The type of the `seq`-th event of an execution (1-based): model and tool calls in turn."""
    return AGENT_EVENT_TYPES[(seq - 1) % len(AGENT_EVENT_TYPES)]


def payload_bytes(size: int) -> int:
    """The JSON length of `agent_payload(size)`."""
    return len(orjson.dumps(agent_payload(size)))


def run_threads(target, n: int) -> None:
    """Run `target(k)` for k in 0..n-1, each in a thread of its own, and wait for all of them."""
    threads = [threading.Thread(target=target, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class CpuWindow:
    """The process's CPU seconds (all threads) between two `time.perf_counter` instants: what a
    measured window cost, next to what it did."""

    def __init__(self, start: float, stop: float):
        self.start = start
        self.stop = stop
        self.seconds = 0.0

    async def watch(self) -> None:
        """In an event loop: sleep to `start`, read the clock, sleep to `stop`, read it again."""
        import asyncio

        await asyncio.sleep(max(0.0, self.start - time.perf_counter()))
        c0 = time.process_time()
        await asyncio.sleep(max(0.0, self.stop - time.perf_counter()))
        self.seconds = time.process_time() - c0

    def watch_blocking(self) -> None:
        """`watch` for a thread of its own."""
        time.sleep(max(0.0, self.start - time.perf_counter()))
        c0 = time.process_time()
        time.sleep(max(0.0, self.stop - time.perf_counter()))
        self.seconds = time.process_time() - c0


# An LLM call's response as an agent records it: ~600 bytes of nested dicts and lists.
LLM_RESPONSE = {
    "model": "gpt-4o-mini-2024-07-18",
    "id": "chatcmpl-9xYzAbCd",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "I'll look that up and compare the two sources before answering.",
                "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "web_search", "arguments": "{\"q\": \"capital of France\"}"}},
                    {"id": "call_2", "type": "function",
                     "function": {"name": "fetch_page", "arguments": "{\"url\": \"https://example.org/fr\"}"}},
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 412, "completion_tokens": 57, "total_tokens": 469,
              "prompt_tokens_details": {"cached_tokens": 128}},
    "params": {"temperature": 0.2, "top_p": 1.0, "max_tokens": 512, "stop": ["\n\n", "END"]},
    "latency_ms": 843.5,
}
