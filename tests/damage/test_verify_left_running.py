"""`verify` after a crash that left many executions running: one line says how many, naming a
few; --json lists every one."""

from __future__ import annotations

import orjson
import pytest

pytestmark = pytest.mark.timeout(120)


def test_executions_left_running_are_one_line_with_a_count_and_a_few_ids(recorded, cli):
    # exec-early and every other of 200 executions were still running when the recorder died.
    data_dir, _ = recorded("interleaved", 200, 1, 1 << 20)
    run = cli(data_dir)
    r = run("verify")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    about = [line for line in lines if "left running" in line]
    assert about == [
        "note: 101 execution(s) were left running with no recorder (exec-00001, exec-00003, exec-00005, ...): "
        "`tracedb recover` marks them incomplete"
    ], lines
    assert len(lines) <= 5, lines
    report = orjson.loads(run("verify", "--json").stdout)
    assert len(report["left_running"]) == 101 and "exec-early" in report["left_running"]
