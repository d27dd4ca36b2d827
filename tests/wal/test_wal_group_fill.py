"""The flusher thread's wait for the blocking callers a group released (GroupCommit.expect_locked):
who waits, for how many, and until when. Times are passed in: nothing here sleeps."""

from __future__ import annotations

import pytest

import wal
from wal.errors import WalFailedError
from wal.group_commit import GroupCommit


def _group_of(commit: GroupCommit, callers: int) -> None:
    """`callers` blocking calls append to the open group, which is then taken for flushing."""
    with commit.lock:
        for _ in range(callers):
            commit.data += b"x"
            commit.gate_locked()
        commit.take_locked()


def _append(commit: GroupCommit, callers: int) -> None:
    with commit.lock:
        for _ in range(callers):
            commit.data += b"x"
            commit.gate_locked()


def test_after_a_group_of_many_callers_the_flusher_waits_for_them_and_for_those_already_pending():
    commit = GroupCommit("d")
    _group_of(commit, 5)
    _append(commit, 2)  # arrived while the group was being synced
    with commit.lock:
        commit.expect_locked(now=10.0, bound_s=0.001)
        assert commit.want == 7
        assert commit.filling_locked(10.0) == pytest.approx(0.001)
    _append(commit, 4)
    with commit.lock:
        assert 0 < commit.filling_locked(10.0004) < 0.001
    _append(commit, 1)
    with commit.lock:
        assert commit.filling_locked(10.0004) == 0.0  # all seven are in: take it now


def test_the_wait_ends_at_its_bound_however_few_callers_came_back():
    commit = GroupCommit("d")
    _group_of(commit, 8)
    _append(commit, 1)
    with commit.lock:
        commit.expect_locked(now=5.0, bound_s=0.002)
        assert commit.filling_locked(5.002) == 0.0
        assert commit.filling_locked(7.0) == 0.0


def test_a_lone_blocking_caller_never_makes_the_flusher_wait():
    commit = GroupCommit("d")
    _group_of(commit, 1)
    with commit.lock:
        commit.expect_locked(now=1.0, bound_s=0.001)
        assert commit.want == 0
        assert commit.filling_locked(1.0) == 0.0


def test_async_appends_are_not_counted_so_their_groups_never_make_the_flusher_wait():
    commit = GroupCommit("d")
    with commit.lock:
        commit.data += b"x" * 64  # framed by append_future: no gate, no caller counted
        commit.take_locked()
        commit.expect_locked(now=1.0, bound_s=0.001)
        assert commit.want == 0


def test_taking_the_group_resets_the_wait_and_counts_its_callers_as_in_flight():
    commit = GroupCommit("d")
    _group_of(commit, 4)
    _append(commit, 1)
    with commit.lock:
        commit.expect_locked(now=1.0, bound_s=0.001)
        commit.take_locked()
        assert (commit.writing_callers, commit.callers, commit.want) == (1, 0, 0)
        assert commit.filling_locked(1.0) == 0.0


def _close(commit):
    commit.closed = True


def _fail(commit):
    commit.fail_locked(WalFailedError("fdatasync", OSError(5, "EIO")), from_flusher=False)


@pytest.mark.parametrize("end", [_close, _fail], ids=["closed", "failed"])
def test_a_failed_or_closed_log_is_never_waited_for(end):
    commit = GroupCommit("d")
    _group_of(commit, 4)
    with commit.lock:
        commit.expect_locked(now=1.0, bound_s=0.001)
        end(commit)
        assert commit.filling_locked(1.0) == 0.0


def test_one_thread_appending_alone_gets_one_group_per_append_and_no_wait(tmp_path):
    w = wal.Wal(str(tmp_path / "w"))
    try:
        lsns = [w.append(b"r%d" % i) for i in range(20)]
        assert lsns == list(range(lsns[0], lsns[0] + 20))
        assert w.stats().groups == 20
        assert w._commit.want == 0
    finally:
        w.close()
