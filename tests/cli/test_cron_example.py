"""config/cron.example's line runs as cron runs it: /bin/sh, cron's PATH, `\\%` unescaped. Each run
adds one stamped line to the log; a failing prune makes the line fail with prune's status and
print what prune said (cron mails a job's output), a working one prints nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import tracedb

from .conftest import settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def run_cron_line(data_dir: str, log) -> subprocess.CompletedProcess:
    with open(os.path.join(ROOT, "config", "cron.example"), encoding="utf-8") as f:
        (line,) = [l[1:].strip() for l in f if re.match(r"#\s*[\d*]+ [\d*]+ \* \* \*", l)]
    command = line.split(None, 5)[5].replace("\\%", "%")  # what cron hands to /bin/sh
    tracedb_bin = os.path.join(os.path.dirname(sys.executable), "tracedb")
    command = (command.replace("/opt/tracedb/.venv/bin/tracedb", tracedb_bin)
               .replace("/var/lib/tracedb", data_dir).replace("/var/log/tracedb-prune.log", str(log)))
    return subprocess.run(["/bin/sh", "-c", command], env={"PATH": "/usr/bin:/bin", "HOME": os.path.dirname(str(log))},
                          capture_output=True, text=True, timeout=120)


def test_the_cron_line_prunes_and_stamps_its_log(data_dir, tmp_path):
    with tracedb.open(data_dir, config=settings()) as store:
        store.start("Old", {}, created_at_ns=1).finish({"status": "success"})
    log = tmp_path / "prune.log"
    r = run_cron_line(data_dir, log)
    assert r.returncode == 0, r.stderr
    assert r.stdout == r.stderr == ""  # nothing for cron to mail
    (entry,) = log.read_text().splitlines()
    assert re.fullmatch(STAMP + r" deleted 1 trace\(s\) .*", entry), entry
    assert run_cron_line(data_dir, log).returncode == 0
    assert len(log.read_text().splitlines()) == 2  # one line per run


def test_a_failing_prune_fails_the_cron_line_and_says_why(tmp_path):
    missing = str(tmp_path / "no-store")
    log = tmp_path / "prune.log"
    r = run_cron_line(missing, log)
    assert r.returncode == 3, (r.returncode, r.stderr)  # prune's own status: no trace store
    assert r.stderr.startswith(f"error: no trace store at {missing}/traces.db\nhint: "), r.stderr  # what cron mails
    (entry,) = log.read_text().splitlines()
    assert re.fullmatch(STAMP + rf" error: no trace store at {re.escape(missing)}/traces\.db hint: .+", entry), entry
    assert not os.path.exists(missing)
