"""config/cron.example's line runs as cron runs it: /bin/sh, cron's PATH, `\\%` unescaped."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import tracedb

from .conftest import settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_cron_line_prunes_and_stamps_its_log(data_dir, tmp_path):
    with tracedb.open(data_dir, config=settings()) as store:
        store.start("Old", {}, created_at_ns=1).finish({"status": "success"})
    with open(os.path.join(ROOT, "config", "cron.example"), encoding="utf-8") as f:
        (line,) = [l[1:].strip() for l in f if re.match(r"#\s*[\d*]+ [\d*]+ \* \* \*", l)]
    command = line.split(None, 5)[5].replace("\\%", "%")  # what cron hands to /bin/sh
    tracedb_bin = os.path.join(os.path.dirname(sys.executable), "tracedb")
    log = tmp_path / "prune.log"
    command = (command.replace("/opt/tracedb/.venv/bin/tracedb", tracedb_bin)
               .replace("/var/lib/tracedb", data_dir).replace("/var/log/tracedb-prune.log", str(log)))
    r = subprocess.run(["/bin/sh", "-c", command], env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (entry,) = log.read_text().splitlines()
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ deleted 1 trace\(s\)", entry), entry
