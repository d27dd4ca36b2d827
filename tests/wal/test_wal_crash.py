"""Crash consistency under the fault-injecting file layer (tests/wal/faultfs.py).

A deterministic workload (appends, batches, rotations with a tiny segment size, mark_applied,
a reopen that recovers a torn tail left by a killed writer) runs until a simulated power loss at
its Nth file-system call; the directory is then rewritten as the disk may hold it, reopened and
read. Whatever happened: acknowledged <= recovered <= attempted, in LSN order.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wal
from wal import format as fmt
from faultfs import DATA_MODES, FaultFS, SimulatedCrash
from helpers import (
    append_bytes,
    read_all,
    read_bytes,
    record_spans,
    salt_of,
    segment_paths,
    flip_bit,
)

SEGMENT_SIZE = 256


def payload(lsn: int) -> bytes:
    return (f"L{lsn}:" + "abcdefgh"[: lsn % 8] * (lsn % 5)).encode()


class Stop(Exception):
    """The simulated crash interrupted the workload."""


def run_until_crash(fs, fn, *args) -> None:
    """Run a workload under `fs`, which must crash somewhere in it. The crash may stop the
    workload (Stop), or hit a segment rotation that runs after the last acknowledgment, in the
    background, where the workload does not see it."""
    try:
        fn(*args)
    except Stop:
        pass
    assert fs.crash_op is not None, "the crash point was never reached"


@dataclass
class Trace:
    attempted: dict[int, bytes] = field(default_factory=dict)
    acknowledged: set[int] = field(default_factory=set)
    applied_floor: int = 1
    next_lsn: int = 1


def _append(w: wal.Wal, trace: Trace, count: int, *, many: bool = False, extra=()) -> None:
    """Append `count` records (`extra[i]` more bytes on the i-th); Stop if the crash hit."""
    lsns = list(range(trace.next_lsn, trace.next_lsn + count))
    trace.next_lsn += count
    payloads = [payload(lsn) + b"#" * (extra[i] if i < len(extra) else 0) for i, lsn in enumerate(lsns)]
    trace.attempted.update(zip(lsns, payloads))
    try:
        if many:
            got = w.append_many(payloads)
        else:
            assert count == 1
            got = [w.append(payloads[0])]
    except (wal.WalFailedError, SimulatedCrash) as e:
        raise Stop() from e
    assert got == lsns
    trace.acknowledged.update(got)


def _mark_applied(w: wal.Wal, trace: Trace, lsn: int) -> None:
    trace.applied_floor = max(trace.applied_floor, lsn)
    try:
        w.mark_applied(lsn)
    except (wal.WalFailedError, SimulatedCrash) as e:
        raise Stop() from e


def _open(d, fs, trace: Trace, segment_size: int = SEGMENT_SIZE, preallocate: bool = False) -> wal.Wal:
    try:
        w = wal.Wal(
            d, fs=fs, segment_size_bytes=segment_size, preallocate=preallocate, preallocate_after_bytes=0
        )
    except SimulatedCrash as e:
        raise Stop() from e
    if preallocate:
        # Let the first zero-filled spare be made, so that the workload rotates into it.
        assert w._spare_event.wait(30)
    trace.next_lsn = w.open_result.last_lsn + 1
    return w


def _leave_a_killed_writers_tail(d, trace: Trace) -> None:
    """What a SIGKILLed writer leaves in the page cache: one whole record and half of the next,
    never fsynced (written around the fault layer, so the model counts them as not durable)."""
    last = segment_paths(d)[-1]
    seed = fmt.salt_seed(salt_of(last))
    lsn = trace.next_lsn
    whole = fmt.encode_record(seed, lsn, fmt.TYPE_DATA, payload(lsn))
    half = fmt.encode_record(seed, lsn + 1, fmt.TYPE_DATA, payload(lsn + 1) + b"!" * 30)
    trace.attempted[lsn] = payload(lsn)
    # At the writer's position: the end of the data, before any preallocated zeros.
    end = wal.scan(d).end_offset
    with open(last, "r+b") as f:
        f.seek(end)
        f.write(whole + half[: len(half) // 2])


def workload(d, fs, trace: Trace, preallocate: bool = False) -> None:
    w = _open(d, fs, trace, preallocate=preallocate)
    try:
        for _ in range(8):
            _append(w, trace, 1)
        _append(w, trace, 3, many=True)
        _mark_applied(w, trace, w.durable_lsn - 1)
        for _ in range(4):
            _append(w, trace, 1)
        _append(w, trace, 3, many=True)
    finally:
        w.close()
    if w.failed is not None:
        raise Stop()  # failed closed in a rotation after its last acknowledgment: no tail
    _leave_a_killed_writers_tail(d, trace)
    w = _open(d, fs, trace, preallocate=preallocate)
    try:
        for _ in range(4):
            _append(w, trace, 1)
        _mark_applied(w, trace, w.durable_lsn + 1)
        _append(w, trace, 4, many=True)
        for _ in range(2):
            _append(w, trace, 1)
    finally:
        w.close()


def check_recovery(d, trace: Trace, context: str, segment_size: int = SEGMENT_SIZE) -> None:
    """Reopen, read, and check acknowledged <= recovered <= attempted; then append again."""
    with wal.Wal(d, segment_size_bytes=segment_size) as w:
        recovered = read_all(d)
        lsns = [r.lsn for r in recovered]
        assert lsns == list(range(lsns[0], lsns[0] + len(lsns))) if lsns else True, context
        for r in recovered:
            assert trace.attempted.get(r.lsn) == r.payload, f"LSN {r.lsn} not as attempted; {context}"
        must = {lsn for lsn in trace.acknowledged if lsn >= trace.applied_floor}
        missing = sorted(must - set(lsns))
        assert not missing, f"acknowledged LSNs lost: {missing}; {context}"
        if trace.applied_floor == 1 and lsns:
            assert lsns[0] == 1, context
        last = lsns[-1] if lsns else w.open_result.last_lsn
        assert w.open_result.last_lsn == last, context
        assert w.append(b"after the crash") == last + 1, context
    again = [(r.lsn, r.payload) for r in read_all(d, mode="absolute")]
    assert again == [(r.lsn, r.payload) for r in recovered] + [(last + 1, b"after the crash")], context


def _count_ops(tmp_path) -> int:
    d = str(tmp_path / "dry-run")
    fs = FaultFS(d)
    trace = Trace()
    workload(d, fs, trace)
    assert len(set(trace.attempted) - trace.acknowledged) == 1, "only the killed writer's record"
    check_recovery(d, trace, "no crash")
    return fs.total_ops


VARIANTS = [
    ("undo", "drop"),
    ("undo", "garble"),
    ("random", None),
    ("keep", "prefix"),
]


def test_workload_without_a_crash_acknowledges_everything_it_attempted(tmp_path):
    assert _count_ops(tmp_path) > 90


@pytest.mark.slow
def test_a_crash_at_every_file_system_call_keeps_every_acknowledged_record(tmp_path):
    total = _count_ops(tmp_path)
    rng = random.Random(20240601)
    kinds_crashed = set()
    for crash_at in range(1, total + 1):
        for variant, (dir_mode, data_mode) in enumerate(VARIANTS):
            d = str(tmp_path / f"c{crash_at}-{variant}")
            fs = FaultFS(d, crash_at=crash_at)
            trace = Trace()
            run_until_crash(fs, workload, d, fs, trace)
            kinds_crashed.add(fs.crash_op.split()[1])
            how = fs.materialize_crash(rng, dir_mode=dir_mode, data_mode=data_mode)
            check_recovery(d, trace, how)
            shutil.rmtree(d)
    assert {"write", "fdatasync", "fsync", "rename", "unlink", "fsync_dir", "ftruncate"} <= kinds_crashed


@pytest.mark.slow
def test_a_crash_at_every_call_with_preallocated_segments_keeps_every_acknowledged_record(tmp_path):
    """The same, with zero-filled spare segments: records overwrite durable zeros, so a lost
    write reads back as zeros (the end of the data) rather than as a shorter file."""
    d = str(tmp_path / "dry-run")
    fs = FaultFS(d)
    trace = Trace()
    workload(d, fs, trace, preallocate=True)
    assert any(kind == "rename" and "preallocated.tmp" in detail for kind, detail in fs.ops)
    check_recovery(d, trace, "no crash")
    total = fs.total_ops
    rng = random.Random(20261122)
    for crash_at in range(1, total + 1):
        for variant, (dir_mode, data_mode) in enumerate(VARIANTS):
            d = str(tmp_path / f"p{crash_at}-{variant}")
            fs = FaultFS(d, crash_at=crash_at)
            trace = Trace()
            try:
                workload(d, fs, trace, preallocate=True)
            except Stop:
                pass
            except AssertionError:
                # The crash hit the spare's preparation before it was ready: the writer goes on
                # with plain segments, which the test above covers.
                pass
            if fs.crash_op is None:
                shutil.rmtree(d)
                continue
            how = fs.materialize_crash(rng, dir_mode=dir_mode, data_mode=data_mode)
            check_recovery(d, trace, how)
            shutil.rmtree(d)


def test_crashes_during_segment_rotation_keep_every_acknowledged_record(tmp_path):
    """Every call from the SEAL's write to the first group synced in the next segment, under
    every combination of directory and data loss."""
    d = str(tmp_path / "probe")
    fs = FaultFS(d)
    workload(d, fs, Trace())
    shutil.rmtree(d)
    rotation_ops: set[int] = set()
    new_segments = [
        i for i, (kind, detail) in enumerate(fs.ops, start=1) if kind == "open" and detail.endswith(".wal.tmp")
    ]
    for i in new_segments[1:]:  # the first is the log's first segment, made when it opens
        rotation_ops |= set(range(i - 2, min(i + 8, fs.total_ops + 1)))
    assert len(rotation_ops) >= 20
    rng = random.Random(7)
    for crash_at in sorted(rotation_ops):
        for dir_mode in ("undo", "random", "keep"):
            for data_mode in DATA_MODES:
                d = str(tmp_path / f"r{crash_at}-{dir_mode}-{data_mode}")
                fs = FaultFS(d, crash_at=crash_at)
                trace = Trace()
                run_until_crash(fs, workload, d, fs, trace)
                how = fs.materialize_crash(rng, dir_mode=dir_mode, data_mode=data_mode)
                check_recovery(d, trace, how)
                shutil.rmtree(d)


def test_crashes_during_mark_applied_keep_every_record_not_yet_applied(tmp_path):
    d = str(tmp_path / "probe")
    fs = FaultFS(d)
    workload(d, fs, Trace())
    shutil.rmtree(d)
    applied_ops = [
        i for i, (k, detail) in enumerate(fs.ops, start=1)
        if "APPLIED" in detail or k in ("unlink", "fsync_dir")
    ]
    assert any(k == "unlink" for k, _ in fs.ops), "the workload deletes applied segments"
    rng = random.Random(11)
    most_pending = 0
    for crash_at in applied_ops:
        subset = 0
        while True:  # every subset of the pending directory changes is undone once
            d = str(tmp_path / f"a{crash_at}-{subset}")
            fs = FaultFS(d, crash_at=crash_at)
            trace = Trace()
            run_until_crash(fs, workload, d, fs, trace)
            pending = len(fs.pending_dir_changes())
            most_pending = max(most_pending, pending)
            undo = {i for i in range(pending) if subset >> i & 1}
            how = fs.materialize_crash(rng, dir_mode=undo)
            check_recovery(d, trace, how)
            shutil.rmtree(d)
            subset += 1
            if subset >= 2**pending:
                break
    assert most_pending >= 2, "a crash point with several pending deletes was tried"


# -- random workloads ---------------------------------------------------------------------
OPS = st.one_of(
    st.tuples(st.just("append"), st.lists(st.integers(0, 120), min_size=1, max_size=1)),
    st.tuples(st.just("many"), st.lists(st.integers(0, 60), min_size=1, max_size=5)),
    st.tuples(st.just("applied"), st.lists(st.integers(0, 3), min_size=1, max_size=1)),
    st.tuples(st.just("kill"), st.just([])),
)


def run_ops(d, fs, trace: Trace, ops, segment_size: int) -> None:
    """Interpret `ops`: append, append_many, mark_applied (a few LSNs below the durable one),
    or kill (close, leave a killed writer's unsynced tail, reopen)."""
    w = _open(d, fs, trace, segment_size)
    try:
        for kind, args in ops:
            if kind == "append":
                _append(w, trace, 1, extra=args)
            elif kind == "many":
                _append(w, trace, len(args), many=True, extra=args)
            elif kind == "applied":
                _mark_applied(w, trace, max(1, w.durable_lsn + 1 - args[0]))
            else:
                w.close()
                if w.failed is not None:
                    # A writer that failed closed (here: its rotation hit the crash after the
                    # last acknowledgment) writes nothing more: there is no tail to leave.
                    raise Stop()
                _leave_a_killed_writers_tail(d, trace)
                w = _open(d, fs, trace, segment_size)
    finally:
        w.close()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(OPS, min_size=1, max_size=40),
    segment_size=st.sampled_from([64, 160, 400, 1 << 20]),
    where=st.floats(0, 1),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_workloads_crashed_at_any_call_keep_every_acknowledged_record(
    tmp_path, ops, segment_size, where, seed
):
    base = tempfile.mkdtemp(dir=tmp_path)
    dry = os.path.join(base, "dry")
    probe = FaultFS(dry)
    run_ops(dry, probe, Trace(), ops, segment_size)
    crash_at = 1 + int(where * (probe.total_ops - 1))
    d = os.path.join(base, "crash")
    fs = FaultFS(d, crash_at=crash_at)
    trace = Trace()
    run_until_crash(fs, run_ops, d, fs, trace, ops, segment_size)
    how = fs.materialize_crash(random.Random(seed))
    check_recovery(d, trace, how, segment_size)
    shutil.rmtree(base)


# -- repair under crashes -----------------------------------------------------------------
def _damaged_log(d) -> dict[str, bytes]:
    """A log with a flipped bit in its second segment; returns every segment's bytes."""
    with wal.Wal(d, segment_size_bytes=150) as w:
        for i in range(1, 15):
            w.append(payload(i))
    paths = segment_paths(d)
    assert len(paths) >= 4
    spans = record_spans(paths[1])
    flip_bit(paths[1], spans[1].offset + 21)
    return {p: read_bytes(p) for p in paths}


def test_a_crash_during_repair_never_loses_the_damaged_bytes(tmp_path):
    probe = str(tmp_path / "probe")
    _damaged_log(probe)
    fs = FaultFS(probe)
    wal.repair(probe, fs=fs)
    total = fs.total_ops
    rng = random.Random(3)
    for crash_at in range(1, total + 1):
        for dir_mode in ("undo", "random"):
            d = str(tmp_path / f"x{crash_at}-{dir_mode}")
            originals = _damaged_log(d)
            fs = FaultFS(d, crash_at=crash_at)
            with pytest.raises(SimulatedCrash):
                wal.repair(d, fs=fs)
            how = fs.materialize_crash(rng, dir_mode=dir_mode)
            for path, data in originals.items():
                kept = [p for p in (path, path + ".broken") if os.path.exists(p)]
                assert any(read_bytes(p) == data for p in kept), f"{path} lost; {how}"
            wal.repair(d)  # finishing the job must not overwrite what the first run kept
            for path, data in originals.items():
                kept = [p for p in os.listdir(d) if p.startswith(os.path.basename(path))]
                assert any(read_bytes(os.path.join(d, p)) == data for p in kept), f"{path}; {how}"
            with wal.Wal(d) as w:
                assert w.append(b"after repair") == w.open_result.last_lsn + 1
            shutil.rmtree(d)


def test_records_the_writer_recovers_on_open_are_made_durable_before_it_builds_on_them(tmp_path):
    d = str(tmp_path / "wal")
    with wal.Wal(d) as w:
        w.append(payload(1))
    fs = FaultFS(d)
    trace = Trace(next_lsn=2)
    _leave_a_killed_writers_tail(d, trace)  # LSN 2, in the page cache only
    with wal.Wal(d, fs=fs) as w:
        assert w.open_result.last_lsn == 2, "the writer continues after the recovered record"
    fs.materialize_crash(random.Random(0), dir_mode="undo", data_mode="drop")
    assert [(r.lsn, r.payload) for r in read_all(d)] == [(1, payload(1)), (2, payload(2))]
