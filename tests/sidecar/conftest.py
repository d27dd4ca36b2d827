"""Fixtures: sidecar servers on temporary sockets, in-process (a thread) or as a real process."""

from __future__ import annotations

import functools
import os

import pytest

from tests.children import killed_after
from tests.serving import Serve
from tracedb.sidecar.server import ServerConfig

from .fake_backend import MemoryBackend
from .helpers import ServerThread, rmtree, short_tempdir, sock_path


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


@pytest.fixture
def serve_process(tdir):
    """A factory of `tracedb serve` subprocesses on the temp data directory; all stopped after."""
    with killed_after(functools.partial(Serve, tdir)) as start:
        yield start
