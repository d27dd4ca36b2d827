"""A recorder outage never holds an agent up by surprise: a recorder that was never reachable,
one that is gone, and one that accepts but never answers fail the first connection within the
connect timeout, not the (much longer) reconnect timeout."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest

from tracedb.sidecar.client import (
    DEFAULT_CONNECT_TIMEOUT_S,
    Client,
    RecorderUnavailableError,
    connect_async,
)

from .helpers import SilentRecorder, sock_path


@pytest.fixture
def hung_recorder(tdir):
    """A socket that accepts connections and never answers a word: a recorder stuck on its disk."""
    recorder = SilentRecorder(os.path.join(tdir, "hung.sock"))
    yield recorder.address
    recorder.close()


def _absent(tdir):
    return "unix:" + sock_path(tdir)  # nothing listens there


def _stopped(tdir):
    # A socket file a stopped recorder left behind: connecting is refused.
    path = os.path.join(tdir, "stopped.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()
    return "unix:" + path


@pytest.mark.parametrize("where", ["absent", "stopped", "hung"])
def test_the_first_connection_fails_within_the_connect_timeout(tdir, hung_recorder, where):
    address = {"absent": _absent(tdir), "stopped": _stopped(tdir), "hung": hung_recorder}[where]
    t0 = time.monotonic()
    with pytest.raises(RecorderUnavailableError) as e:
        Client(address, connect_timeout_s=0.5, reconnect_timeout_s=60)
    waited = time.monotonic() - t0
    assert e.value.code == "unavailable" and "tracedb serve" in e.value.hint
    assert waited < 30  # bounded by the connect timeout, nowhere near the 60 s reconnect timeout

    async def async_connect():
        t0 = time.monotonic()
        with pytest.raises(RecorderUnavailableError):
            await connect_async(address, connect_timeout_s=0.5, reconnect_timeout_s=60)
        return time.monotonic() - t0

    assert asyncio.run(async_connect()) < 30


def test_with_the_defaults_a_missing_recorder_is_reported_in_seconds_not_half_a_minute(tdir):
    # The README's client snippet with no recorder running used to hang 30 s, then raise.
    t0 = time.monotonic()
    with pytest.raises(RecorderUnavailableError):
        Client(_absent(tdir))
    assert time.monotonic() - t0 < 10 * DEFAULT_CONNECT_TIMEOUT_S
