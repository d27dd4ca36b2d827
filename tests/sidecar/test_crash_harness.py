"""The crash harness (scripts/crash_harness), run with few rounds; and its checks can fail."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

from tests.serving import ROOT

HARNESS = os.path.join(ROOT, "scripts", "crash_harness")


def _load_harness():
    loader = importlib.machinery.SourceFileLoader("crash_harness", HARNESS)
    spec = importlib.util.spec_from_loader("crash_harness", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["crash_harness"] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


def test_crash_harness_few_rounds(tdir):
    assert os.access(HARNESS, os.X_OK)
    data = os.path.join(tdir, "data")
    r = subprocess.run(
        [sys.executable, HARNESS, "--rounds", "3", "--clients", "8", "--max-run-s", "0.6", "--seed", "11",
         "--data-dir", data, "--json"],
        capture_output=True, text=True, timeout=120,
    )
    summary = json.loads(r.stdout)
    assert r.returncode == 0, summary["problems"]
    assert summary["ok"] and summary["rounds"] == 3
    assert summary["acked_events"] > 0 and summary["executions"] > 0

    # The checks are real: an acknowledged event the store does not hold is reported.
    harness = _load_harness()
    led = harness.Ledger("exec-never-recorded")
    led.events[1] = {"nonce": 1}
    problems, _counts = harness.verify(data, {"exec-never-recorded": led})
    assert any("exec-never-recorded" in p for p in problems)
