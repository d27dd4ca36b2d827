"""A recorder process for the crash tests: records a scenario, says READY, waits to be killed.

usage: child.py DATA_DIR SCENARIO [N]
  during      start, INTENT_RECEIVED, AGENT_ATTEMPT_START, then READY (seed 002 scenario 2)
  after       the whole seed 002 execution, FINAL_RESPONSE included, then READY (scenario 3)
  before      open the store only, then READY (scenario 1: crash before the intent is recorded)
  bulk N      N executions of 10 events each recorded without compaction, then READY, then
              compact (the test runs it under tests/pause_launcher.py, which pauses it, and kills it there)
  flagged [compacted]
              start, one event, flagged recording_failure with a lost-records note (`NOTE`),
              compacted first if asked, then READY
"""

from __future__ import annotations

import sys
import threading

import tracedb
from tests.children import say
from tests.conftest import SEED_002
from tracedb.records.record import lost_records_note

EVENTS = SEED_002
# 3 records lost between 2024-01-15T10:30:01Z and 10:30:04Z.
NOTE = lost_records_note(3, 1_705_314_601_000_000_000, 1_705_314_604_000_000_000)


def main() -> None:
    data_dir, scenario = sys.argv[1], sys.argv[2]
    settings = {"compact_interval_ms": 0, "idle_timeout_s": 0}
    if scenario == "bulk":
        settings["compact_batch_records"] = 100
    store = tracedb.open(data_dir, config=settings)
    if scenario == "before":
        say("READY")
    elif scenario == "during":
        ex = store.start("ProcessIntent", {"intent": "ProcessIntent"}, "exec-e5f6g7h8")
        ex.event(*EVENTS[0])
        ex.event(*EVENTS[1])
        say("READY")
    elif scenario == "after":
        ex = store.start("ProcessIntent", {"intent": "ProcessIntent"}, "exec-a1b2c3d4")
        for e in EVENTS:
            ex.event(*e)
        ex.finish({"status": "success"})
        say("READY")
    elif scenario == "flagged":
        ex = store.start("ProcessIntent", {"intent": "ProcessIntent"}, "exec-lost")
        ex.event(*EVENTS[0])
        ex.mark_recording_failure(NOTE)
        if sys.argv[3:] == ["compacted"]:
            store.compact()
        say("READY")
    elif scenario == "bulk":
        n = int(sys.argv[3])
        for i in range(n):
            ex = store.start("Bulk", {"i": i}, f"exec-{i:05d}")
            for j in range(10):
                ex.event("tool.requested", {"i": i, "j": j})
            if i % 2 == 0:
                ex.finish({"status": "success", "i": i})
        say(f"RECORDED {store.durable_lsn}")
        store.compact()
        say("COMPACTED")
    threading.Event().wait()


if __name__ == "__main__":
    main()
