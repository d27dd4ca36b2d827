"""Spare segments: zero-filled, fsynced segment files made ahead of rotation by a thread."""

from __future__ import annotations

import os
import threading
from typing import Callable

from .fs import write_all

SPARE_FILE = "preallocated.tmp"
_ZERO_CHUNK = bytes(1 << 20)
_SYNC_BYTES = 1 << 20


class SpareSegments:
    """Keeps one zero-filled, fsynced spare segment file ready for the writer's next rotation.

    fdatasync over preallocated blocks skips the file-size journal commit that an append costs.
    The spare is only an optimisation: if making it fails (a full disk), rotation creates plain
    segments and the flusher reports the disk's state on its own writes.

    A thread of its own makes a spare each time one is asked for (`request`, and `install` once
    it used the last one), then calls `on_ready`. `stop` ends it, `join` waits for it.
    """

    def __init__(self, fs, directory: str, segment_size_bytes: int, on_ready: Callable[[], None]):
        self.fs = fs
        self.directory = directory
        self.path = os.path.join(directory, SPARE_FILE)
        # The configured size: the group that crosses the writer's bound extends the file by
        # appending, and the file is cut after its SEAL anyway.
        self.size = segment_size_bytes
        self._on_ready = on_ready
        self.ready_event = threading.Event()  # set when a spare is ready or preparing stopped
        self._wanted = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="wal-prealloc", daemon=True)
        self._thread.start()

    def request(self) -> None:
        """Make a spare (unless one is being made)."""
        self._wanted.set()

    def stop(self) -> None:
        """Make no further spare (the log closes or failed); one being written is left unfinished."""
        self._stopped = True

    def join(self) -> None:
        """Wait for the thread to end, after `stop`."""
        self._wanted.set()
        self._thread.join()

    def install(self, name: str, header: bytes) -> int:
        """Turn the ready spare into the segment `name`, starting with `header`, and ask for the
        next spare. Returns the segment's fd, positioned after the header."""
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
        self._wanted.set()
        return fd

    def _run(self) -> None:
        try:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                if self._stopped:
                    return
                try:
                    self._write_spare()
                except OSError:
                    return
                if self._stopped:
                    return
                self._on_ready()
                self.ready_event.set()
        finally:
            self.ready_event.set()

    def _write_spare(self) -> None:
        fd = self.fs.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = self.size
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
