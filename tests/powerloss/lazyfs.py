"""A FUSE file system that forgets, on a power cut, what was never made durable.

Every operation passes through to a backing directory, so that the processes under test read and
write ordinary files, while the file system keeps what a power cut would take back:

- per file, an undo log of every write and truncate since its last successful `fsync` or
  `fdatasync` (FUSE sends both as FSYNC, with a flag; `sync_file_range` never reaches a FUSE file
  system, so it does not count, as on a disk that loses power);
- per directory, the entries created, renamed or unlinked since its last `fsync` (FSYNCDIR). An
  unlinked name, or the file a rename replaced, is moved aside (the "grave", a directory next to
  the backing one) rather than deleted, so that a cut can bring it back.

A cut (`cut` on the control socket, or an armed trigger right after the call it names returned)
makes every later operation fail with EIO: the processes under test see the disk vanish. `apply`
then rewrites the backing directory to what the cut kept. With the `worst` policy nothing that
was not synced survives; with `random`, a seeded choice per file keeps none, all, or a prefix of
its unsynced writes (the last one torn at a random byte), and per directory a random prefix of
its unsynced entry changes, the rest undone newest first (a new name disappears, an unlinked name
comes back with its last synced content, a rename reverts).

The model is stricter than ext4 (whose journal commits every pending entry at the first fsync) and
models what POSIX promises: a name is durable once its directory was fsynced. Its limits: writes
since a sync survive as a prefix, in the order they were made (a disk may write pages in any
order); a hard link is refused; a directory is never renamed. Metadata (modes, owners, times) is
passed through and not modelled.

The kernel's page cache cannot hide a loss: writes reach this process before the writing call
returns (FUSE writes through unless mounted with writeback_cache), the undo logs are of the
backing files themselves, and after `apply` the file system is unmounted, so the checks read the
backing directory, which holds exactly what the model kept. Shared writable mmap (SQLite's -shm)
works as on any FUSE mount without direct_io; its pages are not durable state and are treated as
any other unsynced write.

Run as a process of its own (a FUSE daemon must not be called by its own threads):

    python -m tests.powerloss.lazyfs BACKING GRAVE MOUNTPOINT CONTROL_SOCKET

The control socket speaks one JSON object per line each way: `{"cmd": "arm", "trigger": {...}}`,
`{"cmd": "cut"}`, `{"cmd": "wait_cut", "timeout_s": 30}`, `{"cmd": "sync"}` (commit everything,
as `sync` does on a machine that did not lose power), `{"cmd": "apply", "policy": "worst" |
"random", "seed": N}`, `{"cmd": "status"}`. A trigger is `{"op": OP, "glob": PATTERN, "nth": N}`:
the Nth call of OP (write, truncate, create, mkdir, rename, unlink, rmdir, fsync, fdatasync,
sync — either of the two —, fsyncdir, or any) on a path matching PATTERN (fnmatch, on the path
inside the mount; for a rename, its destination), counted from the moment it is armed.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import random
import shutil
import socket
import stat
import sys
import threading
from dataclasses import dataclass, field
from typing import Optional

from mfusepy import FUSE, FuseOSError, Operations

_DIR_FH_BASE = 1 << 40  # directory handles live above any file descriptor number


@dataclass
class Change:
    """How to take back one write or truncate: the bytes it overwrote and the size before it."""

    offset: int
    old: bytes
    old_size: int
    length: Optional[int]  # bytes written; None for a truncate (never torn)


@dataclass(eq=False)
class DirOp:
    """One directory entry change not yet covered by an fsync of its directory."""

    kind: str  # create, unlink, rmdir, rename
    dirs: tuple
    path: str  # the name it made or removed (for a rename: the destination)
    src: Optional[str] = None  # rename: the name it came from
    grave: Optional[str] = None  # unlink: where the file waits; rename: the file it replaced
    mode: int = 0o755  # rmdir: the mode to make the directory with again

    def describe(self) -> str:
        return f"{self.kind} {self.src} -> {self.path}" if self.kind == "rename" else f"{self.kind} {self.path}"


@dataclass
class Trigger:
    op: str
    glob: str = "*"
    nth: int = 1
    seen: int = 0

    def matches(self, op: str, path: str) -> bool:
        if self.op == "any":
            pass
        elif self.op == "sync":
            if op not in ("fsync", "fdatasync"):
                return False
        elif self.op != op:
            return False
        return fnmatch.fnmatchcase(path, self.glob)


@dataclass
class Model:
    """What a cut would take back, keyed by the backing files' inode numbers (stable across renames
    and moves to the grave)."""

    changes: dict = field(default_factory=dict)  # inode -> [Change] since its last sync
    pending: list = field(default_factory=list)  # [DirOp] in the order they were made
    graves: int = 0


class LazyFS(Operations):
    use_ns = True

    def __init__(self, backing: str, grave: str):
        self.backing = os.path.realpath(backing)
        self.grave = os.path.realpath(grave)
        self.model = Model()
        self._mutex = threading.RLock()
        self.is_cut = False
        self.cut_reason = ""
        self.cut_event = threading.Event()
        self.trigger: Optional[Trigger] = None
        self.counts: dict[str, int] = {}
        self.handles: dict[int, int] = {}  # file handle -> inode
        self.dir_handles: dict[int, str] = {}
        self._next_dir_fh = _DIR_FH_BASE

    # -- bookkeeping ----------------------------------------------------------------------------

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _check(self) -> None:
        if self.is_cut:
            raise FuseOSError(errno.EIO)

    def _done(self, op: str, path: Optional[str]) -> None:
        """Count a call that succeeded; cut right after it when it is the armed trigger's."""
        self.counts[op] = self.counts.get(op, 0) + 1
        t = self.trigger
        if t is not None and path is not None and t.matches(op, path):
            t.seen += 1
            if t.seen == t.nth:
                self.trigger = None
                self._cut(f"after {op} #{t.nth} matching {t.glob!r}: {path}")

    def _cut(self, reason: str) -> None:
        self.is_cut = True
        self.cut_reason = reason
        self.cut_event.set()

    def _log_change(self, fd: int, offset: int, length: Optional[int], new_size: Optional[int] = None) -> None:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return
        size = st.st_size
        if length is None:  # truncate to new_size: what it cuts off comes back on undo
            old = os.pread(fd, size - new_size, new_size) if new_size < size else b""
            self.model.changes.setdefault(st.st_ino, []).append(Change(new_size, old, size, None))
        else:
            old = os.pread(fd, min(length, size - offset), offset) if offset < size else b""
            self.model.changes.setdefault(st.st_ino, []).append(Change(offset, old, size, length))

    def _bury(self, real: str) -> str:
        self.model.graves += 1
        dst = os.path.join(self.grave, f"{self.model.graves:08d}")
        os.rename(real, dst)
        return dst

    def _forget_grave(self, path: Optional[str]) -> None:
        if path is None:
            return
        try:
            ino = os.lstat(path).st_ino
            os.unlink(path)
        except FileNotFoundError:
            return
        if ino not in self.handles.values():
            self.model.changes.pop(ino, None)

    def _commit_dir(self, rel: str) -> None:
        keep = []
        for op in self.model.pending:
            if rel in op.dirs:
                self._forget_grave(op.grave)  # the unlink (or the replacement) is durable now
            else:
                keep.append(op)
        self.model.pending = keep

    # -- control --------------------------------------------------------------------------------

    def arm(self, spec: dict) -> None:
        with self._mutex:
            self.trigger = Trigger(spec["op"], spec.get("glob", "*"), int(spec.get("nth", 1)))

    def cut_now(self, reason: str = "cut on request") -> None:
        with self._mutex:
            if not self.is_cut:
                self._cut(reason)

    def sync_all(self) -> None:
        with self._mutex:
            self._check()
            for op in self.model.pending:
                self._forget_grave(op.grave)
            self.model.pending = []
            self.model.changes = {}

    def status(self) -> dict:
        with self._mutex:
            return {"cut": self.is_cut, "reason": self.cut_reason, "counts": dict(self.counts),
                    "pending_dir_ops": len(self.model.pending),
                    "files_with_unsynced_changes": sum(1 for c in self.model.changes.values() if c)}

    def apply(self, policy: str, seed: int) -> dict:
        """Rewrite the backing directory to what the cut kept; a report of what was taken back."""
        if policy not in ("worst", "random"):
            raise ValueError(f"unknown policy {policy!r}")
        rng = random.Random(seed)
        with self._mutex:
            if not self.is_cut:
                raise RuntimeError("apply before a cut")
            report = {"policy": policy, "seed": seed, "reason": self.cut_reason, "files": [], "undone": [], "kept": []}
            where = self._paths_by_inode()
            for ino in sorted(self.model.changes, key=lambda i: where.get(i, "")):
                changes = self.model.changes[ino]
                if not changes or ino not in where:
                    continue
                keep, torn = self._choose(rng, policy, changes)
                report["files"].append(self._revert(where[ino], changes, keep, torn))
            by_dir: dict[str, list] = {}
            for op in self.model.pending:
                for d in op.dirs:
                    by_dir.setdefault(d, []).append(op)
            undone: set = set()
            for d in sorted(by_dir):
                ops = by_dir[d]
                k = 0 if policy == "worst" else rng.randint(0, len(ops))
                undone.update(id(op) for op in ops[k:])
            for op in reversed(self.model.pending):
                if id(op) in undone:
                    self._undo(op)
                    report["undone"].append(op.describe())
                else:
                    report["kept"].append(op.describe())
            report["undone"].reverse()
            report["kept"].reverse()
            for name in os.listdir(self.grave):  # unlinked for good
                os.unlink(os.path.join(self.grave, name))
            self.model = Model()
            return report

    def _paths_by_inode(self) -> dict[int, str]:
        where = {}
        for top in (self.backing, self.grave):
            for root, dirs, files in os.walk(top):
                for name in files:
                    p = os.path.join(root, name)
                    st = os.lstat(p)
                    if stat.S_ISREG(st.st_mode):
                        where[st.st_ino] = p
        return where

    @staticmethod
    def _choose(rng: random.Random, policy: str, changes: list) -> tuple[int, Optional[int]]:
        """(how many changes to keep whole, bytes kept of the next one or None for none)."""
        if policy == "worst":
            return 0, None
        r = rng.random()
        if r < 1 / 3:
            return 0, None
        if r < 2 / 3:
            keep = rng.randrange(len(changes))
            nxt = changes[keep]
            return keep, (rng.randint(0, nxt.length) if nxt.length else None)
        return len(changes), None

    def _revert(self, path: str, changes: list, keep: int, torn: Optional[int]) -> dict:
        fd = os.open(path, os.O_RDWR)
        try:
            before = os.fstat(fd).st_size
            for c in reversed(changes[keep + 1:]):
                self._undo_change(fd, c)
            if keep < len(changes):
                c = changes[keep]
                if torn is None:
                    self._undo_change(fd, c)
                else:
                    rest = c.offset + torn
                    if torn < len(c.old):
                        os.pwrite(fd, c.old[torn:], rest)
                    os.ftruncate(fd, max(c.old_size, rest) if torn else c.old_size)
            after = os.fstat(fd).st_size
        finally:
            os.close(fd)
        rel = os.path.relpath(path, self.backing) if path.startswith(self.backing + os.sep) else "(unlinked) " + path
        return {"path": rel, "unsynced_changes": len(changes), "kept_whole": keep, "torn_at": torn,
                "size_before": before, "size_after": after}

    @staticmethod
    def _undo_change(fd: int, c: Change) -> None:
        if c.old:
            os.pwrite(fd, c.old, c.offset)
        os.ftruncate(fd, c.old_size)

    def _undo(self, op: DirOp) -> None:
        real = self._real(op.path)
        if op.kind == "create":
            if os.path.isdir(real) and not os.path.islink(real):
                shutil.rmtree(real)
            elif os.path.lexists(real):
                os.unlink(real)
        elif op.kind == "unlink":
            os.rename(op.grave, real)
        elif op.kind == "rmdir":
            os.mkdir(real, op.mode)
        elif op.kind == "rename":
            os.rename(real, self._real(op.src))
            if op.grave is not None:
                os.rename(op.grave, real)

    # -- file system operations -----------------------------------------------------------------

    def getattr(self, path, fh=None):
        with self._mutex:
            self._check()
            if fh is not None and fh in self.handles:
                st = os.fstat(fh)
            else:
                if path is None:
                    raise FuseOSError(errno.ESTALE)
                st = os.lstat(self._real(path))
            attrs = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino",
                                                "st_blocks", "st_rdev")}
            return attrs | {"st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    def access(self, path, amode):
        with self._mutex:
            self._check()
            if not os.access(self._real(path), amode):
                raise FuseOSError(errno.EACCES)
            return 0

    def statfs(self, path):
        with self._mutex:
            self._check()
            sv = os.statvfs(self._real(path))
            return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                                                "f_files", "f_flag", "f_frsize", "f_namemax")}

    def readlink(self, path):
        with self._mutex:
            self._check()
            return os.readlink(self._real(path))

    def chmod(self, path, mode):
        with self._mutex:
            self._check()
            if path is None:
                raise FuseOSError(errno.ESTALE)
            os.chmod(self._real(path), mode)
            return 0

    def chown(self, path, uid, gid):
        with self._mutex:
            self._check()
            if path is None:
                raise FuseOSError(errno.ESTALE)
            os.chown(self._real(path), uid, gid, follow_symlinks=False)
            return 0

    def utimens(self, path, times=None):
        with self._mutex:
            self._check()
            if path is None:
                raise FuseOSError(errno.ESTALE)
            os.utime(self._real(path), ns=times, follow_symlinks=False) if times else os.utime(self._real(path))
            return 0

    def opendir(self, path):
        with self._mutex:
            self._check()
            if not os.path.isdir(self._real(path)):
                raise FuseOSError(errno.ENOTDIR)
            self._next_dir_fh += 1
            self.dir_handles[self._next_dir_fh] = path
            return self._next_dir_fh

    def readdir(self, path, fh):
        with self._mutex:
            self._check()
            return [".", "..", *os.listdir(self._real(self.dir_handles.get(fh, path)))]

    def releasedir(self, path, fh):
        with self._mutex:
            self.dir_handles.pop(fh, None)
            return 0

    def fsyncdir(self, path, datasync, fh):
        with self._mutex:
            self._check()
            rel = "/" + self.dir_handles.get(fh, path or "/").strip("/")
            self._commit_dir(rel)
            self._done("fsyncdir", rel)
            return 0

    def mkdir(self, path, mode):
        with self._mutex:
            self._check()
            os.mkdir(self._real(path), mode)
            self.model.pending.append(DirOp("create", (_parent(path),), path))
            self._done("mkdir", path)
            return 0

    def rmdir(self, path):
        with self._mutex:
            self._check()
            real = self._real(path)
            mode = stat.S_IMODE(os.lstat(real).st_mode)
            os.rmdir(real)
            self.model.pending.append(DirOp("rmdir", (_parent(path),), path, mode=mode))
            self._done("rmdir", path)
            return 0

    def mknod(self, path, mode, dev):
        with self._mutex:
            self._check()
            os.mknod(self._real(path), mode, dev)
            self.model.pending.append(DirOp("create", (_parent(path),), path))
            self._done("create", path)
            return 0

    def symlink(self, target, source):
        with self._mutex:
            self._check()
            os.symlink(source, self._real(target))
            self.model.pending.append(DirOp("create", (_parent(target),), target))
            self._done("create", target)
            return 0

    def link(self, target, source):
        raise FuseOSError(errno.EPERM)  # the model follows one name per file

    def unlink(self, path):
        with self._mutex:
            self._check()
            grave = self._bury(self._real(path))
            self.model.pending.append(DirOp("unlink", (_parent(path),), path, grave=grave))
            self._done("unlink", path)
            return 0

    def rename(self, old, new):
        with self._mutex:
            self._check()
            src, dst = self._real(old), self._real(new)
            if os.path.isdir(src) and not os.path.islink(src):
                raise FuseOSError(errno.EXDEV)  # directories are not renamed here (see the module doc)
            replaced = self._bury(dst) if os.path.lexists(dst) else None
            try:
                os.rename(src, dst)
            except OSError:
                if replaced is not None:
                    os.rename(replaced, dst)
                raise
            self.model.pending.append(DirOp("rename", tuple(dict.fromkeys((_parent(old), _parent(new)))), new,
                                            src=old, grave=replaced))
            self._done("rename", new)
            return 0

    def _open_backing(self, real: str, flags: int, mode: Optional[int] = None) -> int:
        acc = flags & os.O_ACCMODE
        # Read access too: a write keeps the bytes it overwrites. No O_APPEND: the kernel gives
        # every write its offset, and pwrite on an O_APPEND descriptor would ignore it.
        keep = flags & ~(os.O_ACCMODE | os.O_APPEND | os.O_TRUNC | os.O_CREAT | os.O_EXCL | getattr(os, "O_DIRECT", 0))
        keep |= os.O_RDONLY if acc == os.O_RDONLY else os.O_RDWR
        if mode is None:
            return os.open(real, keep)
        return os.open(real, keep | os.O_CREAT | os.O_EXCL, mode)

    def create(self, path, mode, flags=0):
        with self._mutex:
            self._check()
            fd = self._open_backing(self._real(path), flags or os.O_RDWR, mode)
            self.handles[fd] = os.fstat(fd).st_ino
            self.model.pending.append(DirOp("create", (_parent(path),), path))
            self._done("create", path)
            return fd

    def open(self, path, flags):
        with self._mutex:
            self._check()
            fd = self._open_backing(self._real(path), flags)
            self.handles[fd] = os.fstat(fd).st_ino
            if flags & os.O_TRUNC and (flags & os.O_ACCMODE) != os.O_RDONLY:
                self._log_change(fd, 0, None, 0)
                os.ftruncate(fd, 0)
                self._done("truncate", path)
            return fd

    def read(self, path, size, offset, fh):
        with self._mutex:
            self._check()
            return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        with self._mutex:
            self._check()
            self._log_change(fh, offset, len(data))
            n = os.pwrite(fh, data, offset)
            self._done("write", path)
            return n

    def truncate(self, path, length, fh=None):
        with self._mutex:
            self._check()
            if path is None:
                raise FuseOSError(errno.ESTALE)
            fd = os.open(self._real(path), os.O_RDWR)
            try:
                self._log_change(fd, 0, None, length)
                os.ftruncate(fd, length)
            finally:
                os.close(fd)
            self._done("truncate", path)
            return 0

    def fsync(self, path, datasync, fh):
        with self._mutex:
            self._check()
            ino = self.handles.get(fh)
            if ino is not None:
                self.model.changes.pop(ino, None)
            self._done("fdatasync" if datasync else "fsync", path or f"(fd {fh})")
            return 0

    def flush(self, path, fh):
        with self._mutex:
            self._check()
            return 0

    def release(self, path, fh):
        # Runs after a cut too: a killed process's descriptors must close.
        with self._mutex:
            ino = self.handles.pop(fh, None)
            try:
                if ino is not None and os.fstat(fh).st_nlink == 0 and ino not in self.handles.values():
                    self.model.changes.pop(ino, None)
            finally:
                os.close(fh)
            return 0


def _parent(path: str) -> str:
    return "/" + os.path.dirname(path).strip("/")


class Control:
    """The control socket's server: one thread per connection, one JSON line per command."""

    def __init__(self, fs: LazyFS, path: str):
        self.fs = fs
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as f:
            for line in f:
                try:
                    answer = {"ok": True, **self._handle(json.loads(line))}
                except Exception as e:  # noqa: BLE001 - reported to the harness
                    answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                f.write(json.dumps(answer).encode() + b"\n")
                f.flush()

    def _handle(self, req: dict) -> dict:
        cmd = req["cmd"]
        fs = self.fs
        if cmd == "arm":
            fs.arm(req["trigger"])
            return {}
        if cmd == "cut":
            fs.cut_now(req.get("reason", "cut on request"))
            return fs.status()
        if cmd == "wait_cut":
            fs.cut_event.wait(float(req.get("timeout_s", 0)))
            return fs.status()
        if cmd == "sync":
            fs.sync_all()
            return {}
        if cmd == "apply":
            return {"report": fs.apply(req["policy"], int(req["seed"]))}
        if cmd == "status":
            return fs.status()
        raise ValueError(f"unknown command {cmd!r}")


def main(argv: list[str]) -> int:
    backing, grave, mountpoint, control = argv
    fs = LazyFS(backing, grave)
    Control(fs, control)
    # hard_remove: an unlinked file is unlinked (into the grave), not renamed to .fuse_hidden*,
    # and a descriptor still open on it goes on working through its handle.
    FUSE(fs, mountpoint, foreground=True, hard_remove=True, fsname="lazyfs", auto_unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
