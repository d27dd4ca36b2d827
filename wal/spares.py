"""Spare segments: zero-filled, fsynced segment files made ahead of rotation by a thread."""

from __future__ import annotations

import os
import threading
from typing import Callable

from .fs import PRIVATE_FILE, write_all

SPARE_FILE = "preallocated.tmp"
_ZERO_CHUNK = bytes(1 << 20)
_SYNC_BYTES = 1 << 20


class SpareSegments:
    """Makes one zero-filled, fsynced spare segment file when the writer asks for one.

    fdatasync over preallocated blocks skips the file-size journal commit that an append costs.
    The spare is only an optimisation: if making it fails (a full disk), rotation creates plain
    segments and the flusher reports the disk's state on its own writes.

    The writer asks (`request`, with the size it wants) when its open segment fills at a rate
    that will need one; a thread of its own zero-fills the file, fsyncs it, then calls
    `on_ready(size)`. `install` turns it into the next segment; nothing more is made until the
    next request. `stop` ends the thread, `join` waits for it, `discard` removes a spare left
    unused.
    """

    def __init__(self, fs, directory: str, on_ready: Callable[[int], None]):
        self.fs = fs
        self.directory = directory
        self.path = os.path.join(directory, SPARE_FILE)
        self._size = 0  # of the spare asked for
        self._on_ready = on_ready
        self.ready_event = threading.Event()  # set when a spare is ready or preparing stopped
        self._wanted = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="wal-prealloc", daemon=True)
        self._thread.start()

    def request(self, size: int) -> None:
        """Make a spare of `size` bytes (call it again only after `install`)."""
        self._size = size
        self._wanted.set()

    def stop(self) -> None:
        """Make no further spare (the log closes or failed); one being written is left unfinished."""
        self._stopped = True

    def join(self) -> None:
        """Wait for the thread to end, after `stop`."""
        self._wanted.set()
        self._thread.join()

    def discard(self) -> None:
        """Remove the spare file, ready or unfinished (after `join`): it is disk space that only
        a running writer uses, and opening the log removes it anyway."""
        try:
            if os.path.exists(self.path):
                self.fs.unlink(self.path)
        except OSError:
            pass  # a temp file: the next open removes it

    def install(self, name: str, header: bytes) -> int:
        """Turn the ready spare into the segment `name`, starting with `header`. Returns the
        segment's fd, positioned after the header."""
        self.ready_event.clear()
        fd = self.fs.open(self.path, os.O_WRONLY)
        try:
            write_all(self.fs, fd, header)
            self.fs.fdatasync(fd)
            self.fs.rename(self.path, os.path.join(self.directory, name))
            self.fs.fsync_dir(self.directory)
        except BaseException:
            self.fs.close(fd)
            raise
        return fd

    def _run(self) -> None:
        try:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                if self._stopped:
                    return
                size = self._size
                try:
                    self._write_spare(size)
                except OSError:
                    return
                if self._stopped:
                    return
                self._on_ready(size)
                self.ready_event.set()
        finally:
            self.ready_event.set()

    def _write_spare(self, size: int) -> None:
        fd = self.fs.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        try:
            left = size
            unsynced = 0
            while left > 0 and not self._stopped:
                chunk = _ZERO_CHUNK if left >= len(_ZERO_CHUNK) else _ZERO_CHUNK[:left]
                write_all(self.fs, fd, chunk)
                left -= len(chunk)
                unsynced += len(chunk)
                if unsynced >= _SYNC_BYTES:
                    # Written back a megabyte at a time: one flush of the whole segment would
                    # queue every fdatasync of the log (and SQLite's commits) behind it for tens
                    # of milliseconds.
                    self.fs.fdatasync(fd)
                    unsynced = 0
            self.fs.fsync(fd)
        finally:
            self.fs.close(fd)
