"""A recorder process for the damage tests: records, says READY, waits to be killed (SIGKILL).

usage: recorder.py DATA_DIR SCENARIO [ARGS]
  crash           exec-done (completed, 1 event) and exec-cut (2 events, still running)
  outcomes        exec-failed (a priced model call, a failed tool call, an error response) and
                  exec-left (a model call the price table does not know, still running)
  bulk N E SEG [FIRST]  N executions of E events each (exec-FIRST on), all finished,
                  compaction held off, WAL segments of SEG bytes; then `READY <durable LSN>`
  compacted N E SEG  the same, then everything compacted; then `READY <durable LSN>`
  interleaved N E SEG  exec-early (one event, left running), then N executions started, E
                  events each in turns, every other one finished (the rest left running);
                  then `READY <durable LSN>`
"""

from __future__ import annotations

import os
import sys
import threading

import tracedb


def main() -> None:
    data_dir, scenario = sys.argv[1], sys.argv[2]
    settings = {"compact_interval_ms": 0, "idle_timeout_s": 0}
    if os.environ.get("RECORDER_DB_URL"):  # compact into this (PostgreSQL) database
        settings["db_url"] = os.environ["RECORDER_DB_URL"]
    if scenario in ("bulk", "compacted", "interleaved"):
        settings["wal_segment_size_bytes"] = int(sys.argv[5])
        settings["wal_preallocate"] = False
    store = tracedb.open(data_dir, config=settings)
    if scenario == "crash":
        ex = store.start("Done", {"intent": "Done"}, "exec-done")
        ex.event("INTENT_RECEIVED", {"intent": "Done"})
        ex.finish({"status": "success", "answer": 42})
        ex = store.start("Cut", {"intent": "Cut"}, "exec-cut")
        ex.event("INTENT_RECEIVED", {"intent": "Cut"})
        ex.event("AGENT_ATTEMPT_START", {"agent": "processor-a"})
    elif scenario == "outcomes":
        ex = store.start("Ask", {"intent": "Ask"}, "exec-failed")
        ex.event("llm.responded", {"response": {"model": "gpt-4o-mini", "usage": {"input_tokens": 1000, "output_tokens": 500}}})
        ex.event("tool.responded", {"name": "search", "error": {"code": "TOOL_TIMEOUT", "message": "took 30 s"}})
        ex.finish({"status": "error", "error": {"code": "TOOL_TIMEOUT"}})
        ex = store.start("Ask", {"intent": "Ask"}, "exec-left")
        ex.event("llm.responded", {"response": {"model": "my-own-model", "usage": {"input_tokens": 7, "output_tokens": 3}}})
    elif scenario == "interleaved":
        n, e = int(sys.argv[3]), int(sys.argv[4])
        early = store.start("Early", {"early": True}, "exec-early")  # one event, then nothing
        early.event("tool.step", {"early": True})
        handles = [store.start("Mixed", {"i": i}, f"exec-{i:05d}") for i in range(n)]
        for j in range(e):
            for i, ex in enumerate(handles):
                ex.event("tool.step", {"i": i, "j": j, "pad": "p" * 40})
        for ex in handles[::2]:
            ex.finish({"status": "success"})
    else:
        n, e = int(sys.argv[3]), int(sys.argv[4])
        first = int(sys.argv[6]) if len(sys.argv) > 6 else 0
        for i in range(first, first + n):
            ex = store.start("Bulk", {"i": i}, f"exec-{i:05d}")
            for j in range(e - 1):
                ex.event("tool.step", {"i": i, "j": j, "pad": "p" * 40})
            ex.finish({"status": "success", "i": i})
        if scenario == "compacted":
            store.compact()
    sys.stdout.write(f"READY {store.durable_lsn}\n")
    sys.stdout.flush()
    threading.Event().wait()


if __name__ == "__main__":
    main()
