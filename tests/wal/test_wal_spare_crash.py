"""Crash consistency of the spare segments made as the recording rate asks (wal/FORMAT.md,
"Preallocation"): a spare asked for when the open segment is half full, sized like it; a
segment sealed before its spare is ready (the next one is plain, left early for the spare);
an unused spare removed when the writer closes. A simulated power loss at every file-system
call (tests/wal/faultfs.py) keeps every acknowledged record.
"""

from __future__ import annotations

import random
import shutil
import threading

import pytest

import wal
from faultfs import FaultFS, SimulatedCrash
from test_wal_crash import VARIANTS, Stop, Trace, _append, check_recovery

SEGMENT_SIZE = 512
BIG = (100,)  # 100 more bytes per record: about three records a segment


class SpareGate:
    """Holds the spare thread before its next file-system call while closed."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()

    def __call__(self, kind: str, n: int) -> None:
        if threading.current_thread().name == "wal-prealloc":
            self.open.wait()


def spare_workload(d, fs, trace: Trace, gate: SpareGate) -> None:
    try:
        w = wal.Wal(
            d, fs=fs, segment_size_bytes=SEGMENT_SIZE, preallocate=True, preallocate_after_bytes=0
        )
    except SimulatedCrash as e:
        raise Stop() from e
    trace.next_lsn = w.open_result.last_lsn + 1
    try:
        w._spare_event.wait(30)
        for _ in range(8):  # through spares, each asked for at half of the segment before
            _append(w, trace, 1, extra=BIG)
        gate.open.clear()  # the spare asked for next is not ready in time
        for _ in range(8):
            _append(w, trace, 1, extra=BIG)
        gate.open.set()
        if w._spare_asked:
            w._spare_event.wait(30)
        for _ in range(4):  # the plain segment is left early for the spare
            _append(w, trace, 1, extra=BIG)
        while not w._spare_asked and w.failed is None:
            _append(w, trace, 1, extra=BIG)
        w._spare_event.wait(30)  # ready, and never used: closing removes it
    finally:
        gate.open.set()
        w.close()


def test_spare_workload_without_a_crash(tmp_path):
    d = str(tmp_path / "dry-run")
    fs = FaultFS(d, before=SpareGate())
    trace = Trace()
    spare_workload(d, fs, trace, fs.before)
    renames = [detail for kind, detail in fs.ops if kind == "rename"]
    installed = [i for i, r in enumerate(renames) if r.startswith("preallocated.tmp")]
    assert len(installed) >= 3, renames
    plain = [i for i, r in enumerate(renames) if ".wal.tmp ->" in r]
    assert any(installed[0] < i < installed[-1] for i in plain), f"no plain segment between spares: {renames}"
    assert ("unlink", "preallocated.tmp") in fs.ops, "the unused spare was not removed on close"
    assert set(trace.acknowledged) == set(trace.attempted)
    check_recovery(d, trace, "no crash", segment_size=SEGMENT_SIZE)


@pytest.mark.slow
def test_a_crash_at_every_call_of_the_spare_workload_keeps_every_acknowledged_record(tmp_path):
    d = str(tmp_path / "dry-run")
    fs = FaultFS(d, before=SpareGate())
    spare_workload(d, fs, Trace(), fs.before)
    total = fs.total_ops
    rng = random.Random(20260314)
    crashed = 0
    for crash_at in range(1, total + 1):
        for variant, (dir_mode, data_mode) in enumerate(VARIANTS):
            d = str(tmp_path / f"s{crash_at}-{variant}")
            gate = SpareGate()
            fs = FaultFS(d, crash_at=crash_at, before=gate)
            trace = Trace()
            try:
                spare_workload(d, fs, trace, gate)
            except Stop:
                pass
            if fs.crash_op is None:  # the threads interleaved differently: fewer calls
                shutil.rmtree(d)
                continue
            crashed += 1
            how = fs.materialize_crash(rng, dir_mode=dir_mode, data_mode=data_mode)
            check_recovery(d, trace, how, segment_size=SEGMENT_SIZE)
            shutil.rmtree(d)
    assert crashed >= total  # most crash points were reached
