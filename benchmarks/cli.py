"""The CLI's read commands as a user runs them: a new `tracedb` process each time, on a store
recorded through the public API, with no recorder running (each command also checks whether the
store needs recovery). Wall time of the whole process, and its peak RSS (from wait4's rusage).

    from benchmarks import cli
    result = cli.run(sizes=(10_000, 100_000, 1_000_000), workdir="bench-out")
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Sequence

from . import api

# The commands, with ID standing for a full execution id of the store.
COMMANDS = (
    ("inspect --list", ["inspect", "--list"]),
    ("inspect ID", ["inspect", "ID"]),
    ("trace get ID", ["trace", "get", "ID"]),
    ("replay ID", ["replay", "ID"]),
    ("verify", ["verify"]),
    ("prune --older-than 30d --dry-run", ["prune", "--older-than", "30d", "--dry-run"]),
)
# Lookups of one execution or one page: their time must not grow with the store.
LOOKUPS = ("inspect --list", "inspect ID", "trace get ID", "replay ID")
# Whole-store work: linear in the store's size.
LINEAR = ("verify", "prune --older-than 30d --dry-run")


def tracedb_command() -> list[str]:
    """The `tracedb` console script next to this interpreter (what a user runs), else `-m tracedb`."""
    script = os.path.join(os.path.dirname(sys.executable), "tracedb")
    return [script] if os.access(script, os.X_OK) else [sys.executable, "-m", "tracedb"]


def clean_env() -> dict:
    """This environment without tracedb's settings, so that only the flags choose the store."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("TRACEDB_") and k not in ("TRACE_STORAGE_PATH", "TRACE_RETENTION_DAYS",
                                                          "TRACING_ENABLED")}


# Runs one command and reports (wall seconds, peak RSS in KiB, exit code) on its stdout. The
# command is spawned from this small process, not from the bench: a child's peak RSS (wait4's
# ru_maxrss) starts from the memory of the process it was forked from, and the bench's own is
# larger than a CLI command's.
_LAUNCHER = """
import os, sys, time
argv = sys.argv[1:]
null = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)]
t0 = time.perf_counter()
pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=null)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - t0
print(wall, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def time_command(argv: Sequence[str], env: dict, cwd: str) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MB, exit code) of one run of `argv`, its output discarded."""
    out = subprocess.run([sys.executable, "-I", "-S", "-c", _LAUNCHER, *argv], env=env, cwd=cwd,
                         stdout=subprocess.PIPE, check=True, text=True).stdout.split()
    return float(out[0]), int(out[1]) / 1024.0, int(out[2])


def measure(argv: Sequence[str], env: dict, cwd: str, runs: int) -> dict:
    """One run not counted (the page cache), then `runs` runs: median and best wall, peak RSS."""
    time_command(argv, env, cwd)
    walls, rss, codes = [], [], set()
    for _ in range(runs):
        w, r, rc = time_command(argv, env, cwd)
        walls.append(w)
        rss.append(r)
        codes.add(rc)
    return {"wall_s": statistics.median(walls), "wall_min_s": min(walls), "rss_mb": max(rss),
            "exit_codes": sorted(codes), "runs": runs}


def run(sizes: Sequence[int] = (10_000, 100_000, 1_000_000), workdir: str = ".", runs: int = 3,
        on_result=None) -> dict:
    """Build a store of each size (events, 10 per execution, 64 executions recording at once,
    generated ids, ~200-byte payloads) and time every command on it. `on_result(size, name,
    figures)` is called as each command's figures arrive."""
    base = tracedb_command()
    env = clean_env()
    d = os.path.abspath(tempfile.mkdtemp(dir=workdir))
    out: dict = {"command": " ".join(os.path.basename(a) for a in base), "help": {}, "stores": {}}
    try:
        out["help"] = measure([*base, "--help"], env, d, runs)
        if on_result:
            on_result(None, "tracedb --help", out["help"])
        for size in sizes:
            data = os.path.join(d, f"store-{size}")
            ids, build_s = api.build_store(data, size)
            eid = ids[len(ids) // 2]
            store = {"events": size, "executions": len(ids), "build_s": build_s,
                     "db_mb": os.path.getsize(os.path.join(data, "traces.db")) / 1e6, "commands": {}}
            out["stores"][str(size)] = store
            if on_result:
                on_result(size, "build", store)
            for name, args in COMMANDS:
                argv = [*base, "--data-dir", data, *[eid if a == "ID" else a for a in args]]
                fig = measure(argv, env, d, runs)
                store["commands"][name] = fig
                if on_result:
                    on_result(size, name, fig)
            shutil.rmtree(data)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return out
