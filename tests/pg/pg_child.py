"""A recorder process compacting into the database at TRACEDB_DB_URL (tests/pg).

usage: pg_child.py DATA_DIR SCENARIO [ARGS]
  during           start exec-e5f6g7h8, INTENT_RECEIVED, AGENT_ATTEMPT_START, compact, then READY
                   and wait to be killed (seed 002 scenario 2 on a shared database)
  fleet N E BATCH  record N executions of E events (+ FINAL_RESPONSE) without compacting, say
                   "RECORDED <durable_lsn> <recorder_id>", wait for a line on stdin, compact in
                   batches of BATCH records, say "COMPACTED <applied_lsn> <records> <steps>", close
"""

from __future__ import annotations

import sys
import threading

import tracedb
from tests.children import say


def main() -> None:
    data_dir, scenario = sys.argv[1], sys.argv[2]
    settings = {"compact_interval_ms": 0, "idle_timeout_s": 0}
    if scenario == "during":
        store = tracedb.open(data_dir, config=settings)
        ex = store.start("ProcessIntent", {"intent": "ProcessIntent"}, "exec-e5f6g7h8")
        ex.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
        ex.event("AGENT_ATTEMPT_START", {"agent": "processor-a"})
        store.compact()
        say("READY")
        threading.Event().wait()
    elif scenario == "fleet":
        n, e, batch = (int(x) for x in sys.argv[3:6])
        settings["compact_batch_records"] = batch
        store = tracedb.open(data_dir, config=settings)
        rid = store.recorder_id

        def record(start: int, stop: int) -> None:
            for i in range(start, stop):
                ex = store.start("Fleet", {"recorder": rid, "i": i}, f"{rid}-{i:05d}")
                for j in range(e):
                    ex.event("tool.requested", {"i": i, "j": j})
                ex.finish({"status": "success", "i": i})

        # Four threads: their appends share fsyncs (group commit), so recording is quick.
        threads = [threading.Thread(target=record, args=(k * n // 4, (k + 1) * n // 4)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        say(f"RECORDED {store.durable_lsn} {rid}")
        sys.stdin.readline()
        result = store.compact()
        say(f"COMPACTED {store.applied_lsn} {result.records} {result.steps}")
        store.close()
    else:
        raise SystemExit(f"unknown scenario {scenario}")


if __name__ == "__main__":
    main()
