"""A fault-injecting file layer for the WAL tests, after LevelDB's fault_injection_test and
SQLite's crash VFS.

`FaultFS` has the methods of `wal.fs.OsFileSystem` and passes every call through to the real
files, while it models what a power loss would keep:

* per file (identified like an inode, so renames and unlinks are followed), the content covered by
  the last successful `fsync`/`fdatasync`;
* per directory entry, the state made durable by the last `fsync_dir`;
* the directory's own entry in its parent, when it is made through this layer (`mkdir`): lost in
  a crash until its parent is fsynced.

It can fail one call with an errno (`fail={"fdatasync": (3, errno.EIO)}`), fill the disk after a
number of bytes (`disk_full_after=`), or simulate a crash at the Nth call (`crash_at=`): that call
and every later one (except `close`) raise `SimulatedCrash`. Once the writer is closed,
`materialize_crash(rng)` rewrites the directory as the disk might hold it after the crash:
directory entries not yet fsynced may be undone, and each file's bytes not yet fsynced are kept,
dropped, cut to a random prefix, or garbled.
"""

from __future__ import annotations

import errno as errno_mod
import os
import random
import shutil
import threading
from collections import Counter
from typing import Callable, Optional

from wal.aio import ThreadSyncer
from wal.fs import OsFileSystem

IGNORED_NAMES = frozenset({"LOCK"})
DATA_MODES = ("keep", "drop", "prefix", "garble")
DIR_MODES = ("keep", "undo", "random")


class SimulatedCrash(OSError):
    """Raised by the call at which the simulated power loss happens, and by every later call."""

    def __init__(self, op: str):
        super().__init__(errno_mod.EIO, f"simulated crash at {op}")
        self.op = op


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def lose_unsynced(durable: bytes, current: bytes, mode: str, rng: random.Random) -> bytes:
    """What a file may hold after a crash, given its fsynced and its current content."""
    if mode == "keep":
        return current
    if mode == "drop":
        return durable
    base = _common_prefix(durable, current)
    unsynced = len(current) - base
    # Past the point where the new bytes stop, the disk still holds the durable ones: a file
    # whose size was synced (a preallocated segment written over) never comes back shorter.
    if mode == "prefix":
        cut = base + rng.randint(0, unsynced)
        return current[:cut] + durable[cut:]
    if mode == "garble":
        out = current[:base] + rng.randbytes(unsynced)
        return out + durable[len(out):]
    raise ValueError(mode)


class FaultFS:
    """`OsFileSystem` with a durability model, crash points and injected errors."""

    def __init__(
        self,
        directory: str,
        *,
        crash_at: Optional[int] = None,
        fail: Optional[dict[str, tuple[int, int]]] = None,
        disk_full_after: Optional[int] = None,
        before: Optional[Callable[[str, int], None]] = None,
        async_syncer: bool = True,
        create: bool = True,
    ):
        self.directory = os.path.abspath(directory)
        self.real = OsFileSystem()
        self.crash_at = crash_at
        self.fail = dict(fail or {})
        self.disk_full_after = disk_full_after
        self.before = before
        self.loop_sync = async_syncer
        self.crashed = False
        self.crash_op: Optional[str] = None
        self.calls: Counter = Counter()
        self.ops: list[tuple[str, str]] = []
        self.bytes_written = 0
        self._lock = threading.RLock()
        self._ids: dict[tuple[int, int], int] = {}
        self._next_id = 0
        self._durable: dict[int, bytes] = {}
        self._unlinked: dict[int, bytes] = {}
        self._fd_path: dict[int, str] = {}
        if create:
            os.makedirs(self.directory, exist_ok=True)
        # A directory that exists already is durable; one the code under test makes (`mkdir`)
        # is lost in a crash until its parent is fsynced.
        self._entry_durable = os.path.isdir(self.directory)
        self._durable_dir: dict[str, int] = self._listing()
        for name, fid in self._durable_dir.items():
            self._durable[fid] = _read(os.path.join(self.directory, name))

    # -- the model -------------------------------------------------------------------------
    def _id(self, path: str) -> int:
        st = os.stat(path)
        key = (st.st_dev, st.st_ino)
        fid = self._ids.get(key)
        if fid is None:
            fid = self._ids[key] = self._next_id
            self._next_id += 1
            self._durable.setdefault(fid, b"")
        return fid

    def _forget(self, path: str) -> None:
        """`path` is about to lose its last link: remember its bytes, retire its inode number."""
        fid = self._id(path)
        self._unlinked[fid] = _read(path)
        st = os.stat(path)
        del self._ids[(st.st_dev, st.st_ino)]

    def _listing(self) -> dict[str, int]:
        out = {}
        if not os.path.isdir(self.directory):
            return out
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if name in IGNORED_NAMES or not os.path.isfile(path):
                continue
            out[name] = self._id(path)
        return out

    def _in_dir(self, path: str) -> bool:
        return os.path.dirname(os.path.abspath(path)) == self.directory

    def _step(self, kind: str, detail: str) -> None:
        """Count a call; raise if it is the crash point or an injected failure."""
        with self._lock:
            self.calls[kind] += 1
            self.ops.append((kind, detail))
            n = self.calls[kind]
            total = len(self.ops)
        if self.before is not None:
            self.before(kind, n)
        with self._lock:
            if self.crashed:
                raise SimulatedCrash(f"{kind} {detail} (after the crash)")
            if self.crash_at is not None and total == self.crash_at:
                self.crashed = True
                self.crash_op = f"#{total} {kind} {detail}"
                raise SimulatedCrash(self.crash_op)
            rule = self.fail.get(kind)
            if rule is not None and rule[0] == n:
                raise OSError(rule[1], f"injected {os.strerror(rule[1])} in {kind}")

    @property
    def total_ops(self) -> int:
        return len(self.ops)

    # -- OsFileSystem's methods ------------------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        self._step("open", os.path.basename(path))
        fd = self.real.open(path, flags, mode)
        with self._lock:
            self._fd_path[fd] = os.path.abspath(path)
            if self._in_dir(path):
                self._id(path)
        return fd

    def write(self, fd: int, data) -> int:
        self._step("write", os.path.basename(self._fd_path.get(fd, "?")))
        data = memoryview(data)
        if self.disk_full_after is not None:
            room = self.disk_full_after - self.bytes_written
            if room <= 0:
                raise OSError(errno_mod.ENOSPC, "injected: no space left on device")
            data = data[:room]
        n = self.real.write(fd, data)
        self.bytes_written += n
        return n

    def _sync(self, kind: str, fd: int) -> None:
        self._step(kind, os.path.basename(self._fd_path.get(fd, "?")))
        getattr(self.real, kind)(fd)
        with self._lock:
            path = self._fd_path.get(fd)
            if path is not None and self._in_dir(path):
                self._durable[self._id(path)] = _read(path)

    def fdatasync(self, fd: int) -> None:
        self._sync("fdatasync", fd)

    def fsync(self, fd: int) -> None:
        self._sync("fsync", fd)

    def ftruncate(self, fd: int, size: int) -> None:
        self._step("ftruncate", os.path.basename(self._fd_path.get(fd, "?")))
        self.real.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        with self._lock:
            self._fd_path.pop(fd, None)
        self.real.close(fd)

    def rename(self, src: str, dst: str) -> None:
        self._step("rename", f"{os.path.basename(src)} -> {os.path.basename(dst)}")
        with self._lock:
            if os.path.exists(dst) and self._in_dir(dst):
                self._forget(dst)
            if self._in_dir(src):
                self._id(src)
            self.real.rename(src, dst)
            src_abs, dst_abs = os.path.abspath(src), os.path.abspath(dst)
            for fd, p in self._fd_path.items():
                if p == src_abs:
                    self._fd_path[fd] = dst_abs

    def unlink(self, path: str) -> None:
        self._step("unlink", os.path.basename(path))
        with self._lock:
            if self._in_dir(path) and os.path.exists(path):
                self._forget(path)
            self.real.unlink(path)

    def async_syncer(self, directory: str):
        """The background fdatasync an attached event loop uses (wal/aio.py): this layer's own
        `fdatasync` in a helper thread, so the loop-driven path meets the same crash points
        and injected errors. None when made with `async_syncer=False`."""
        return ThreadSyncer(self) if self.loop_sync else None

    def mkdir(self, path: str, mode: int = 0o700) -> None:
        self._step("mkdir", os.path.basename(path))
        self.real.mkdir(path, mode)
        with self._lock:
            if os.path.abspath(path) == self.directory:
                self._entry_durable = False

    def fsync_dir(self, path: str) -> None:
        self._step("fsync_dir", os.path.basename(path))
        self.real.fsync_dir(path)
        with self._lock:
            if os.path.abspath(path) == self.directory:
                self._durable_dir = self._listing()
            elif os.path.abspath(path) == os.path.dirname(self.directory) and os.path.isdir(self.directory):
                self._entry_durable = True

    # -- the crash -------------------------------------------------------------------------
    def pending_dir_changes(self) -> list[set[str]]:
        """The directory changes not yet covered by fsync_dir, as groups of names that can only
        be undone together (a rename touches two names), in a stable order."""
        with self._lock:
            return self._dir_groups(self._listing())

    def _dir_groups(self, current: dict[str, int]) -> list[set[str]]:
        dirty = sorted(
            n for n in set(current) | set(self._durable_dir)
            if current.get(n) != self._durable_dir.get(n)
        )
        groups: list[set[str]] = []
        for name in dirty:
            ids = {current.get(name), self._durable_dir.get(name)} - {None}
            merged = {name}
            for g in [g for g in groups if any(
                {current.get(m), self._durable_dir.get(m)} & ids for m in g
            )]:
                merged |= g
                groups.remove(g)
            groups.append(merged)
        return sorted(groups, key=sorted)

    def materialize_crash(
        self,
        rng: random.Random,
        *,
        dir_mode=None,
        data_mode: Optional[str] = None,
    ) -> str:
        """Rewrite the directory as the disk may hold it after a power loss now.

        `dir_mode`: "keep" every directory change, "undo" every change not covered by fsync_dir,
        undo a "random" subset, or undo the groups whose indexes (into `pending_dir_changes()`)
        are in the given set. "undo" (and "random", half the time) also loses the directory
        itself, with everything in it, when it was made here and its parent never fsynced. `data_mode`: what happens to each file's bytes not covered by its
        last fsync (one of DATA_MODES), random per file if None. Returns a description for
        assertion messages. Call it only once no file of the directory is open for writing.
        """
        with self._lock:
            if dir_mode is None:
                dir_mode = rng.choice(DIR_MODES)
            if not self._entry_durable and os.path.isdir(self.directory) and (
                dir_mode == "undo" or (dir_mode == "random" and rng.random() < 0.5)
            ):
                shutil.rmtree(self.directory)
                return f"crash {self.crash_op}; dir {dir_mode}: the directory itself, never synced into its parent, is lost"
            current = self._listing()
            contents: dict[int, bytes] = dict(self._unlinked)
            for name, fid in current.items():
                contents[fid] = _read(os.path.join(self.directory, name))
            final = dict(current)
            undone = []
            for i, g in enumerate(self._dir_groups(current)):
                if isinstance(dir_mode, str):
                    undo = dir_mode == "undo" or (dir_mode == "random" and rng.random() < 0.5)
                else:
                    undo = i in dir_mode
                if undo:
                    undone.extend(sorted(g))
                    for name in g:
                        fid = self._durable_dir.get(name)
                        if fid is None:
                            final.pop(name, None)
                        else:
                            final[name] = fid
            image = {}
            notes = []
            for name in sorted(final):
                fid = final[name]
                durable = self._durable.get(fid, b"")
                cur = contents.get(fid, durable)
                mode = data_mode or rng.choice(DATA_MODES)
                image[name] = lose_unsynced(durable, cur, mode, rng)
                if cur != durable:
                    notes.append(f"{name}:{mode}({len(durable)}->{len(cur)}->{len(image[name])})")
            for name in current:
                os.unlink(os.path.join(self.directory, name))
            for name, data in image.items():
                with open(os.path.join(self.directory, name), "wb") as f:
                    f.write(data)
            return f"crash {self.crash_op}; dir {dir_mode} undone={undone}; files {notes}"
