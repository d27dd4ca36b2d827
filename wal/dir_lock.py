"""The directory lock: one writer per WAL directory, through flock on its LOCK file."""

from __future__ import annotations

import errno
import fcntl
import os
import socket

from .errors import WalLockedError
from .fs import PRIVATE_FILE, OsFileSystem

LOCK_FILE = "LOCK"


def acquire_dir_lock(directory: str, fs=None) -> int:
    """flock the directory's LOCK file (made through `fs`, private) and write our pid and host
    into it; return its fd.

    Closing the fd releases the lock. Raises WalLockedError, naming the holder, when another
    process holds it."""
    path = os.path.join(directory, LOCK_FILE)
    fd = (fs or OsFileSystem()).open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)
            raise
        try:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)
        raise WalLockedError(directory, holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode(), 0)
    return fd


def is_locked(directory: str) -> bool:
    """True while a writer holds the directory's lock; False when it is free, or when no writer
    ever made the lock file. A shared probe: unlike taking the lock, it writes nothing into the
    lock file. Raises the OSError of a lock file this process may not open (another user's, a
    file system failing): whether a writer holds it cannot be told then."""
    try:
        fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases the probe
    return False
