"""One client process of the power-loss scenarios: records executions through `tracedb serve` and
writes down, in a ledger outside the mount, everything the recorder acknowledged.

    python -m tests.powerloss.load_client SOCKET LEDGER WORKER SEED

Each ledger line is written and fdatasynced after the acknowledgment it records and before the
next request, so the ledger is never ahead of the recorder, and a SIGKILL loses at most the
line of an answer it was writing:

    S <execution id> <envelope hash>          the start was acknowledged
    E <execution id> <seq> <payload sha256>   an event was acknowledged at seq
    f <execution id> <response sha256>        the finish is about to be sent
    F <execution id> <seq> <response sha256>  the finish was acknowledged

Some executions are left unfinished on purpose (no `f` line): recovery must mark those
incomplete, never completed.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys

import orjson

from benchmarks.sidecar import accepts
from tests.waiting import wait_until
from tracedb.client import connect


def digest(value) -> str:
    """The hash the checks compare: of the value's canonical JSON text."""
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def main(socket_path: str, ledger_path: str, worker: int, seed: int) -> int:
    rng = random.Random(seed * 1000 + worker)
    fd = os.open(ledger_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def note(*fields) -> None:
        os.write(fd, (" ".join(map(str, fields)) + "\n").encode())
        os.fdatasync(fd)

    try:
        # Started with the recorder: connect as soon as it listens.
        wait_until(lambda: accepts(socket_path), 120, "tracedb serve to listen")
        with connect("unix:" + socket_path, reconnect_timeout_s=5.0) as client:
            n = 0
            while True:
                n += 1
                ex = client.start("PowerLoss", {"intent": "PowerLoss", "worker": worker, "n": n})
                note("S", ex.execution_id, ex.envelope_hash)
                for k in range(rng.randint(2, 10)):
                    payload = {"worker": worker, "n": n, "k": k, "text": "p" * rng.randint(20, 600)}
                    seq = ex.event("tool.responded", payload)
                    note("E", ex.execution_id, seq, digest(payload))
                if rng.random() < 0.2:
                    continue  # left running: recovery marks it incomplete
                response = {"status": "success", "payload": {"worker": worker, "n": n}}
                note("f", ex.execution_id, digest(response))
                seq = ex.finish(response)
                note("F", ex.execution_id, seq, digest(response))
    except Exception as e:  # noqa: BLE001 - the disk vanished: the recorder failed or was killed
        print(f"client {worker} stopped: {type(e).__name__}: {e}", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
