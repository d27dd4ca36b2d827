"""Fixtures: sidecar servers on temporary sockets, in-process (a thread) or as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from tracedb.sidecar.server import ServerConfig

from .fake_backend import MemoryBackend
from .helpers import ServerThread, rmtree, short_tempdir, sock_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def tdir():
    """A short private temporary directory (Unix socket paths must stay under ~100 bytes)."""
    d = short_tempdir()
    yield d
    rmtree(d)


def _store_backend(data_dir: str, **settings):
    async def make():
        from tracedb.sidecar.store_backend import open_backend

        return await open_backend(data_dir, config={"idle_timeout_s": 0, **settings})

    return make


@pytest.fixture
def store_server(tdir):
    """An in-process server on the real store, its data directory the temp dir."""
    srv = ServerThread(_store_backend(tdir), ServerConfig(socket_path=sock_path(tdir), data_dir=tdir)).start()
    yield srv
    srv.stop()


@pytest.fixture
def mem_server(tdir):
    """An in-process server on the in-memory test backend (a real WAL underneath)."""
    srv = ServerThread(lambda: MemoryBackend(os.path.join(tdir, "wal")), ServerConfig(socket_path=sock_path(tdir))).start()
    yield srv
    srv.stop()


def make_server(tdir, config: ServerConfig, backend: str = "memory", metrics=None, **settings) -> ServerThread:
    """A server thread with a custom configuration (the caller stops it)."""
    if backend == "memory":
        make = lambda: MemoryBackend(os.path.join(tdir, "wal"))  # noqa: E731
    else:
        make = _store_backend(tdir, **settings)
    return ServerThread(make, config, metrics=metrics).start()


class ServeProcess:
    """`tracedb serve` as a subprocess on a data directory, once its store is open (it listens
    before, holding requests until then)."""

    def __init__(self, data_dir: str, *args: str, env: dict | None = None):
        self.data_dir = data_dir
        self.socket = sock_path(data_dir)
        full_env = dict(os.environ, PYTHONPATH=ROOT, TRACEDB_IDLE_TIMEOUT_S="0", **(env or {}))
        full_env.pop("TRACEDB_SIDECAR", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "serve", "--log-level", "info", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=full_env,
        )
        self._err: list[bytes] = []
        self._opened = threading.Event()  # its "store open" line, or the end of its log
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        if not self._opened.wait(60):
            self.kill()
            raise TimeoutError("tracedb serve did not open its store within 60 s")
        if not any(b"store open" in line for line in self._err):
            self._reader.join(60)
            raise RuntimeError(f"tracedb serve exited {self.proc.wait(60)}: {self.stderr()[-2000:]}")

    def _read_log(self) -> None:
        for line in self.proc.stderr:
            self._err.append(line)
            if b"store open" in line:
                self._opened.set()
        self._opened.set()

    def stderr(self) -> str:
        """What it logged so far."""
        return b"".join(self._err).decode()

    def terminate(self, timeout: float = 60) -> tuple[int, str]:
        """SIGTERM; returns (exit code, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout)
        return self.proc.returncode, self.stderr()

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)
        self._reader.join(60)


@pytest.fixture
def serve_process(tdir):
    """A factory of `tracedb serve` subprocesses on the temp data directory; all stopped after."""
    procs: list[ServeProcess] = []

    def start(*args: str, env: dict | None = None) -> ServeProcess:
        p = ServeProcess(tdir, *args, env=env)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.proc.poll() is None:
            p.kill()
