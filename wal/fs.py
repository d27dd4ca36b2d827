"""The file operations the writer uses, in one object, so tests can inject faults.

`OsFileSystem` is the real thing. A test substitutes an object with the same methods that fails
a chosen call (EIO, ENOSPC) or simulates a crash that loses bytes not yet fsynced.
"""

from __future__ import annotations

import os


class OsFileSystem:
    """Plain POSIX calls. Every method is a thin wrapper; errors propagate as OSError."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags | getattr(os, "O_CLOEXEC", 0), mode)

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
    fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fs, fd, data)
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.rename(tmp, os.path.join(directory, name))
    fs.fsync_dir(directory)
