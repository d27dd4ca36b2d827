"""The file operations the writer uses, in one object, so tests can inject faults.

`OsFileSystem` is the real thing. A test substitutes an object with the same methods that fails
a chosen call (EIO, ENOSPC) or simulates a crash that loses bytes not yet fsynced.

Every file the log creates is private to its owner (`PRIVATE_FILE`), and every directory
(`PRIVATE_DIR`), whatever the process's umask: what is recorded is for the recorder's user alone.
The umask is never changed (the log may run inside another program's process); the mode is set
on the descriptor instead.
"""

from __future__ import annotations

import os
import stat

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def make_private(fd: int, mode: int = PRIVATE_FILE) -> None:
    """Give the open file `fd` exactly `mode` if it is ours: a umask may have cleared bits of a
    new file's mode, and a file kept from an older version may have more. A file of another
    user keeps its mode (changing it is not ours to do)."""
    st = os.fstat(fd)
    if stat.S_IMODE(st.st_mode) != mode and st.st_uid == os.geteuid():
        os.fchmod(fd, mode)


class OsFileSystem:
    """Plain POSIX calls. Every method is a thin wrapper; errors propagate as OSError."""

    def open(self, path: str, flags: int, mode: int = PRIVATE_FILE) -> int:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), mode)
        if flags & os.O_CREAT:
            try:
                make_private(fd, mode)
            except BaseException:
                os.close(fd)
                raise
        return fd

    def write(self, fd: int, data) -> int:
        return os.write(fd, data)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def mkdir(self, path: str, mode: int = PRIVATE_DIR) -> None:
        os.mkdir(path, mode)
        os.chmod(path, mode)  # the umask may have cleared bits of it

    def async_syncer(self, directory: str):
        """An object that runs an fdatasync of a file in `directory` in the background (see
        wal/aio.py), or None where the system has none."""
        from .aio import default_syncer

        return default_syncer(directory)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def make_dirs(fs, path: str, mode: int = PRIVATE_DIR) -> list[str]:
    """Create the directory `path` and every missing directory above it, each `mode`, each
    fsynced into its parent as soon as it is made (a directory entry is durable only once its
    parent is fsynced: without that, a power cut can take a new directory away with every file
    acknowledged in it). Returns the directories made, outermost first; [] when `path` existed.
    An existing directory keeps its mode."""
    path = os.path.abspath(path)
    missing = []
    at = path
    while not os.path.isdir(at):
        missing.append(at)
        parent = os.path.dirname(at)
        if parent == at:
            break
        at = parent
    made = []
    for d in reversed(missing):
        try:
            fs.mkdir(d, mode)
        except FileExistsError:
            if not os.path.isdir(d):
                raise
            continue  # made meanwhile by another process, which syncs it
        fs.fsync_dir(os.path.dirname(d))
        made.append(d)
    return made


def write_all(fs, fd: int, data) -> None:
    """Write every byte; a short write is continued, an error propagates."""
    view = memoryview(data)
    while view:
        n = fs.write(fd, view)
        if n <= 0:
            raise OSError(f"short write of {len(view)} bytes returned {n}")
        view = view[n:]


def write_file_atomic(fs, directory: str, name: str, data: bytes) -> None:
    """Write `name` via a temp file: write, fsync, rename, fsync the directory."""
    tmp = os.path.join(directory, name + ".tmp")
    fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        write_all(fs, fd, data)
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.rename(tmp, os.path.join(directory, name))
    fs.fsync_dir(directory)


def copy_to_new_file(fs, src_fd: int, dst: str) -> int:
    """Copy what `src_fd` reads, from its current offset, into the new private file `dst`
    (refused if it exists: a copy never overwrites anything), fsynced; the bytes copied. The
    directory is the caller's to fsync once its new entries are all made."""
    fd = fs.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    n = 0
    try:
        while chunk := os.read(src_fd, 1 << 20):
            write_all(fs, fd, chunk)
            n += len(chunk)
        fs.fsync(fd)
    finally:
        fs.close(fd)
    return n
