"""Run a test's recorder script with a compaction pause hook installed (crash tests).

usage: pause_launcher.py POINT:BATCH SCRIPT [ARGS...]

Installs `tracedb.projection.compactor.pause_hook` so that the compactor, on reaching POINT (before_commit
or after_commit) of batch BATCH (counted from 1), writes `PAUSED POINT` to stdout and blocks
until the test kills the process; then runs SCRIPT as `__main__` with ARGS.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading

PATH = os.path.abspath(__file__)


def command(point: str, script: str, *args: str) -> list[str]:
    """The argv that runs `script args` under this launcher, pausing at `point`."""
    return [sys.executable, PATH, point, script, *args]


def main() -> None:
    point, script = sys.argv[1], sys.argv[2]
    want_point, _, want_batch = point.partition(":")
    batch = int(want_batch)

    def pause(at: str, n: int) -> None:
        if (at, n) == (want_point, batch):
            os.write(1, f"PAUSED {at}\n".encode())
            threading.Event().wait()

    # As if the script were run itself: its folder first on the path, not this one (whose
    # tests/wal would shadow the wal package).
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    sys.argv = [script, *sys.argv[3:]]
    from tracedb.projection import compactor

    compactor.pause_hook = pause
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
