"""The lazy file system itself: it really forgets what was not synced, and keeps what was. A green
power-loss run means something only if these hold."""

from __future__ import annotations

import errno
import os

import pytest

from .harness import LazyMount


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: str, data: bytes, sync: str = "", flags: int = os.O_CREAT | os.O_WRONLY) -> None:
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, data)
        if sync == "fsync":
            os.fsync(fd)
        elif sync == "fdatasync":
            os.fdatasync(fd)
    finally:
        os.close(fd)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture
def lazy(lazy_root):
    m = LazyMount(lazy_root)
    yield m
    m.close()


def test_a_write_never_synced_is_lost_and_a_synced_one_kept(lazy):
    mnt = lazy.mnt
    _write(f"{mnt}/kept", b"durable", sync="fdatasync")
    _write(f"{mnt}/lost", b"")
    _fsync_dir(mnt)  # both names durable
    _write(f"{mnt}/lost", b"never synced")
    _write(f"{mnt}/kept", b" and more, never synced", flags=os.O_WRONLY | os.O_APPEND)
    # Before the cut the writes are in the backing files: the model works on what the daemon
    # received, not on something the kernel keeps.
    assert _read(f"{lazy.backing}/lost") == b"never synced"
    assert _read(f"{mnt}/kept") == b"durable and more, never synced"

    lazy.cut("test")
    with pytest.raises(OSError) as e:
        _read(f"{mnt}/kept")
    assert e.value.errno == errno.EIO  # from the cut on, the disk is gone
    report = lazy.apply("worst", 1)
    lazy.unmount()

    assert _read(f"{lazy.backing}/lost") == b""
    assert _read(f"{lazy.backing}/kept") == b"durable"
    assert {f["path"] for f in report["files"]} == {"kept", "lost"}


def test_a_file_synced_in_a_directory_never_synced_disappears(lazy):
    mnt = lazy.mnt
    os.mkdir(f"{mnt}/d")
    _fsync_dir(mnt)
    _write(f"{mnt}/d/synced-file", b"data", sync="fsync")  # the file, not its name
    _write(f"{mnt}/d/named", b"named", sync="fsync")
    _fsync_dir(f"{mnt}/d")  # from here on, both names are durable...
    _write(f"{mnt}/d/late", b"late", sync="fsync")  # ...but not this one
    os.mkdir(f"{mnt}/newdir")  # a new directory whose parent was not synced
    _write(f"{mnt}/newdir/inside", b"x", sync="fsync")
    _fsync_dir(f"{mnt}/newdir")

    lazy.cut("test")
    report = lazy.apply("worst", 1)
    lazy.unmount()

    assert sorted(os.listdir(f"{lazy.backing}/d")) == ["named", "synced-file"]
    assert not os.path.exists(f"{lazy.backing}/newdir")
    assert report["undone"] == ["create /d/late", "create /newdir"]


def test_unlink_and_rename_not_synced_are_undone(lazy):
    mnt = lazy.mnt
    for name, data in (("a", b"A1"), ("b", b"B1"), ("gone", b"G1")):
        _write(f"{mnt}/{name}", data, sync="fsync")
    _fsync_dir(mnt)
    _write(f"{mnt}/gone", b"G2 never synced", flags=os.O_WRONLY | os.O_TRUNC)
    os.unlink(f"{mnt}/gone")
    _write(f"{mnt}/tmp", b"T", sync="fsync")
    os.rename(f"{mnt}/tmp", f"{mnt}/a")  # replaces a: write_file_atomic without its directory fsync
    os.rename(f"{mnt}/b", f"{mnt}/c")

    lazy.cut("test")
    lazy.apply("worst", 1)
    lazy.unmount()

    b = lazy.backing
    assert sorted(os.listdir(b)) == ["a", "b", "gone"]
    assert (_read(f"{b}/a"), _read(f"{b}/b"), _read(f"{b}/gone")) == (b"A1", b"B1", b"G1")
    assert os.listdir(lazy.grave) == []


def test_synced_directory_changes_survive_a_cut(lazy):
    mnt = lazy.mnt
    _write(f"{mnt}/x", b"X", sync="fsync")
    _write(f"{mnt}/y", b"Y", sync="fsync")
    _fsync_dir(mnt)
    os.unlink(f"{mnt}/x")
    os.rename(f"{mnt}/y", f"{mnt}/z")
    _fsync_dir(mnt)

    lazy.cut("test")
    report = lazy.apply("worst", 1)
    lazy.unmount()

    assert os.listdir(lazy.backing) == ["z"] and _read(f"{lazy.backing}/z") == b"Y"
    assert report["undone"] == [] and report["files"] == []


# Seeds whose choice for the file is: all kept (0), all lost (1), torn in the middle of an
# appended write (9), torn inside the overwrite that came last (11).
@pytest.mark.parametrize("seed", [0, 1, 9, 11])
def test_the_random_policy_keeps_a_prefix_of_the_unsynced_writes(lazy, seed):
    mnt = lazy.mnt
    base = b"S" * 100
    _write(f"{mnt}/f", base, sync="fsync")
    _fsync_dir(mnt)
    writes = [(100 + 50 * i, bytes([65 + i]) * 50) for i in range(8)] + [(10, b"overwritten")]
    fd = os.open(f"{mnt}/f", os.O_WRONLY)
    for offset, data in writes:
        os.pwrite(fd, data, offset)
    os.close(fd)

    lazy.cut("test")
    report = lazy.apply("random", seed)
    lazy.unmount()

    (f,) = report["files"]
    assert f["unsynced_changes"] == len(writes)
    # The first writes in order, the next one cut at a byte (what a disk that lost power
    # mid-write shows), nothing after it.
    survived = writes[:f["kept_whole"]]
    if f["torn_at"] is not None:
        offset, data = writes[f["kept_whole"]]
        survived.append((offset, data[:f["torn_at"]]))
    kept = bytearray(base)
    for offset, data in survived:
        kept[offset:offset + len(data)] = data
    assert _read(f"{lazy.backing}/f") == bytes(kept)
