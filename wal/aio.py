"""Starting an fdatasync without waiting for it, so an event loop can own the group commit.

A syncer runs one fdatasync at a time in the background and signals its end on a file
descriptor the event loop watches (`fileno()` turns readable). `Wal.attach_loop` uses one so that
the loop itself writes each group and starts its fdatasync, then goes on serving producers while
the disk flushes, and acknowledges the group when the completion arrives: no thread hand-off, no
GIL traded back and forth at every group.

* `LinuxAioSyncer`: Linux native AIO, `io_submit` of an `IOCB_CMD_FDSYNC` (Linux 4.18 and later)
  with `IOCB_FLAG_RESFD`, so the kernel bumps an eventfd when the flush is done. The kernel runs
  the same `vfs_fsync(file, datasync=1)` the fdatasync system call runs, writeback error
  reporting included. Called through `syscall(2)` with ctypes: no compiled module, and the
  `libaio` wrapper is not needed for four system calls.
* `ThreadSyncer`: the same interface over a file-system object's blocking `fdatasync`, run in a
  helper thread. The fault-injecting file layer of the tests gives its crash points and injected
  errors to the loop-driven path through it.

`reap()` returns `PENDING` while the flush runs, then `None` for success or the exception it
failed with (an `OSError`, unless a file-system object raised something else). An error is
handed to the caller once and never retried here.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
import tempfile
import threading
from typing import Optional, Union

PENDING = object()  # reap(): the fdatasync has not finished

IOCB_CMD_FDSYNC = 3
IOCB_FLAG_RESFD = 1 << 0

# (io_setup, io_destroy, io_getevents, io_submit) per machine; other machines use the thread.
_SYSCALLS = {
    "x86_64": (206, 207, 208, 209),
    "aarch64": (0, 1, 4, 2),
}


class _Iocb(ctypes.Structure):
    # struct iocb of <linux/aio_abi.h>, little-endian layout (aio_key before aio_rw_flags).
    _fields_ = [
        ("aio_data", ctypes.c_uint64),
        ("aio_key", ctypes.c_uint32),
        ("aio_rw_flags", ctypes.c_int32),
        ("aio_lio_opcode", ctypes.c_uint16),
        ("aio_reqprio", ctypes.c_int16),
        ("aio_fildes", ctypes.c_uint32),
        ("aio_buf", ctypes.c_uint64),
        ("aio_nbytes", ctypes.c_uint64),
        ("aio_offset", ctypes.c_int64),
        ("aio_reserved2", ctypes.c_uint64),
        ("aio_flags", ctypes.c_uint32),
        ("aio_resfd", ctypes.c_uint32),
    ]


class _IoEvent(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_uint64),
        ("obj", ctypes.c_uint64),
        ("res", ctypes.c_int64),
        ("res2", ctypes.c_int64),
    ]


assert ctypes.sizeof(_Iocb) == 64 and ctypes.sizeof(_IoEvent) == 32

_libc = None


def _syscall():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)  # ctypes releases the GIL around each call
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall


def _os_error(err: int, what: str) -> OSError:
    return OSError(err, f"{what}: {os.strerror(err)}")


def _clear(efd: int) -> None:
    """Reset a nonblocking eventfd's count (nothing to do when it is 0)."""
    try:
        os.eventfd_read(efd)
    except BlockingIOError:
        pass


def outcome_of(res: int) -> Optional[OSError]:
    """An io_event's `res` for an fdatasync: 0 is success, -errno the error it failed with."""
    return None if res >= 0 else _os_error(-res, "fdatasync")


class LinuxAioSyncer:
    """One fdatasync at a time through Linux native AIO; completion on an eventfd."""

    def __init__(self) -> None:
        nums = _SYSCALLS.get(platform.machine())
        if (
            not sys.platform.startswith("linux") or nums is None or sys.byteorder != "little"
            or ctypes.sizeof(ctypes.c_void_p) != 8  # a 32-bit userland on a 64-bit kernel
        ):
            raise OSError(errno.ENOSYS, "Linux native AIO is not available on this machine")
        self._setup, self._destroy, self._getevents, self._submit = nums
        self._call = _syscall()
        self._ctx = ctypes.c_ulong(0)
        if self._call(self._setup, 1, ctypes.byref(self._ctx)) < 0:
            raise _os_error(ctypes.get_errno(), "io_setup")
        self._efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._iocb = _Iocb()
        self._iocbs = (ctypes.POINTER(_Iocb) * 1)(ctypes.pointer(self._iocb))
        self._event = _IoEvent()
        self._zero = (ctypes.c_long * 2)(0, 0)  # a timespec of 0: io_getevents does not wait
        self._inflight = False
        self._closed = False

    def fileno(self) -> int:
        return self._efd

    def submit(self, fd: int) -> None:
        """Start an fdatasync of `fd`; it covers every write to `fd` that returned before."""
        if self._inflight:
            raise RuntimeError("an fdatasync is already in flight")
        ctypes.memset(ctypes.byref(self._iocb), 0, ctypes.sizeof(_Iocb))
        self._iocb.aio_lio_opcode = IOCB_CMD_FDSYNC
        self._iocb.aio_fildes = fd
        self._iocb.aio_flags = IOCB_FLAG_RESFD
        self._iocb.aio_resfd = self._efd
        n = self._call(self._submit, self._ctx, 1, self._iocbs)
        if n != 1:
            err = ctypes.get_errno() if n < 0 else errno.EAGAIN
            raise _os_error(err, "io_submit of fdatasync")
        self._inflight = True

    def reap(self, block: bool = False) -> Union[None, OSError, object]:
        """The finished fdatasync's outcome (None: success), or PENDING.

        Without `block`, the eventfd is cleared before the completion is looked for: a
        completion that lands after the look signals the eventfd again, so none is missed
        and a count left by an earlier completion never keeps the fd readable."""
        if not block:
            _clear(self._efd)
        if not self._inflight:
            return PENDING
        while True:
            n = self._call(
                self._getevents, self._ctx, 1 if block else 0, 1, ctypes.byref(self._event),
                None if block else self._zero,
            )
            if n >= 0 or ctypes.get_errno() != errno.EINTR:
                break
        if n < 0:
            return _os_error(ctypes.get_errno(), "io_getevents")
        if n == 0:
            return PENDING
        self._inflight = False
        return outcome_of(self._event.res)

    def close(self) -> None:
        """Wait for a flush in flight (io_destroy does), then free the context."""
        if self._closed:
            return
        self._closed = True
        self._call(self._destroy, self._ctx)
        os.close(self._efd)


class ThreadSyncer:
    """The syncer interface over `fs.fdatasync`, run in a helper thread."""

    def __init__(self, fs) -> None:
        self._fs = fs
        self._efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._lock = threading.Lock()
        self._job: Optional[int] = None  # the fd of the flush submitted and not yet reaped
        self._todo: Optional[int] = None  # ... and not yet started
        self._outcome: Union[None, OSError, object] = PENDING
        self._done = threading.Event()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="wal-syncer", daemon=True)
        self._thread.start()

    def fileno(self) -> int:
        return self._efd

    def submit(self, fd: int) -> None:
        with self._lock:
            if self._job is not None:
                raise RuntimeError("an fdatasync is already in flight")
            self._job = self._todo = fd
            self._outcome = PENDING
            self._done.clear()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                fd, self._todo = self._todo, None
            if fd is None:
                if self._closed:
                    return
                continue
            try:
                self._fs.fdatasync(fd)
                outcome = None
            except BaseException as e:  # noqa: BLE001 - handed to the caller, which fails closed
                outcome = e
            with self._lock:
                self._outcome = outcome
            # `_done` before the fd: a reaper woken by the fd always finds the outcome.
            self._done.set()
            os.eventfd_write(self._efd, 1)

    def reap(self, block: bool = False) -> Union[None, OSError, object]:
        if not block:
            _clear(self._efd)  # before looking: see LinuxAioSyncer.reap
        with self._lock:
            if self._job is None:
                return PENDING
        if block:
            self._done.wait()
        elif not self._done.is_set():
            return PENDING
        with self._lock:
            outcome, self._outcome, self._job = self._outcome, PENDING, None
        return outcome

    def close(self) -> None:
        if self._closed:
            return
        with self._lock:
            busy = self._job is not None
        if busy:
            self._done.wait()
        self._closed = True
        self._wake.set()
        self._thread.join()
        os.close(self._efd)


def default_syncer(directory: str) -> Optional[LinuxAioSyncer]:
    """A `LinuxAioSyncer` that has fdatasynced a scratch file in `directory`, or None where
    that cannot be had: another system or machine; io_setup refused (aio-max-nr reached, a
    seccomp profile); or a kernel before 4.18 or a file system that does not take
    IOCB_CMD_FDSYNC (io_submit answers EINVAL). The scratch file is another inode than the
    log's segments, so an error here never consumes a write-back error they may carry."""
    try:
        syncer = LinuxAioSyncer()
    except OSError:
        return None
    try:
        fd, path = tempfile.mkstemp(prefix="aio-probe.", suffix=".tmp", dir=directory)
        try:
            os.write(fd, b"probe")
            syncer.submit(fd)
            err = syncer.reap(block=True)
        finally:
            os.close(fd)
            os.unlink(path)
        syncer.reap()  # clears the eventfd (a signal landing later only wakes the loop once)
        if err is not None:
            raise err
    except OSError:
        syncer.close()
        return None
    return syncer
