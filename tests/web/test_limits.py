"""The HTTP listeners (tracedb.sidecar.asgi.HttpEndpoint: `serve --http-port` and `--otlp-port`,
`tracedb ui`) under abuse, on real sockets: the header deadline, a body that stops coming, room
made at the connection cap, and uvicorn's warnings at most once a second."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.waiting import wait_until_async
from tracedb.sidecar.asgi import HttpEndpoint

pytestmark = pytest.mark.timeout(120)


def _app(gate: asyncio.Event) -> Starlette:
    async def health(_request):
        return PlainTextResponse("ok")

    async def slow(_request):
        await gate.wait()
        return PlainTextResponse("done")

    async def echo(request):
        return PlainTextResponse(str(len(await request.body())))

    return Starlette(routes=[Route("/health", health), Route("/slow", slow),
                             Route("/echo", echo, methods=["POST"])])


async def _closed_at(reader: asyncio.StreamReader, timeout_s: float = 10) -> float:
    """When the server closed the connection (what it sent before is read and dropped)."""
    async def eof():
        while await reader.read(65536):
            pass

    try:
        await asyncio.wait_for(eof(), timeout_s)
    except asyncio.TimeoutError:
        raise AssertionError(f"the server did not close the connection within {timeout_s} s") from None
    except ConnectionResetError:
        pass
    return time.monotonic()


async def _get(port: int, path: str = "/health") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


async def _trickle(writer: asyncio.StreamWriter, data: bytes, every_s: float = 0.02) -> None:
    try:
        for i in range(len(data)):
            writer.write(data[i:i + 1])
            await asyncio.sleep(every_s)  # the pace of a slow peer, not a wait for a condition
    except (ConnectionError, RuntimeError):
        pass


def test_request_headers_that_do_not_arrive_in_time_close_the_connection():
    async def main():
        ep = HttpEndpoint(_app(asyncio.Event()), port=0, header_timeout_s=0.5, idle_timeout_s=30)
        port = await ep.start()
        try:
            t0 = time.monotonic()
            silent_r, _silent_w = await asyncio.open_connection("127.0.0.1", port)
            slow_r, slow_w = await asyncio.open_connection("127.0.0.1", port)
            trickler = asyncio.create_task(_trickle(slow_w, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 1000))
            # Kept alive after one answer, then the next request's headers come too slowly.
            kept_r, kept_w = await asyncio.open_connection("127.0.0.1", port)
            kept_w.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await kept_r.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
            t_next = time.monotonic()
            kept_trickler = asyncio.create_task(_trickle(kept_w, b"GET /health HTTP/1.1\r\nX-Pad: " + b"a" * 1000))
            assert await _closed_at(silent_r) - t0 >= 0.5
            assert await _closed_at(slow_r) - t0 >= 0.5
            assert await _closed_at(kept_r) - t_next >= 0.5
            trickler.cancel()
            kept_trickler.cancel()
            assert ep.listener.closed["deadline"] == 3
            assert (await _get(port)).startswith(b"HTTP/1.1 200")  # others are served as before
            # Headers still without their end after 16 KiB are refused (h11's limit).
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (17 << 10))
            assert (await asyncio.wait_for(r.read(), 10)).startswith(b"HTTP/1.1 400")
        finally:
            await ep.close()

    asyncio.run(main())


def test_a_request_body_that_stops_coming_closes_the_connection():
    async def main():
        ep = HttpEndpoint(_app(asyncio.Event()), port=0, header_timeout_s=0.5, idle_timeout_s=0.6)
        port = await ep.start()
        try:
            # The application waits for a body that stopped after 10 of its 100 bytes.
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"b" * 10)
            t0 = time.monotonic()
            assert await _closed_at(r) - t0 >= 0.6
            assert ep.listener.closed["idle"] == 1
            # Answered before its body came (this route reads none), the body keeps trickling in:
            # h11 cannot start the next request until it ends, and it must end within the deadline.
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
            assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 405")
            t0 = time.monotonic()
            trickler = asyncio.create_task(_trickle(w, b"b" * 100000))
            assert await _closed_at(r) - t0 >= 0.5
            trickler.cancel()
            assert ep.listener.closed["deadline"] == 1
            # A whole body, sent at once, is read and answered.
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nConnection: close\r\n\r\n" + b"b" * 100)
            assert (await asyncio.wait_for(r.read(), 10)).endswith(b"\r\n\r\n100")
        finally:
            await ep.close()

    asyncio.run(main())


def test_at_the_cap_a_request_closes_a_silent_connection_and_is_refused_when_all_are_busy():
    async def main():
        gate = asyncio.Event()
        ep = HttpEndpoint(_app(gate), port=0, max_connections=2, header_timeout_s=30)
        port = await ep.start()
        try:
            silent_r, _w1 = await asyncio.open_connection("127.0.0.1", port)
            kept_r, kept_w = await asyncio.open_connection("127.0.0.1", port)
            kept_w.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await kept_r.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
            await wait_until_async(lambda: len(ep.listener.waiting) == 2, 10, "a silent and a kept-alive connection")
            # A newcomer makes room: the connection that waited longest for a request goes (the
            # silent one)...
            assert (await _get(port)).startswith(b"HTTP/1.1 200")
            await _closed_at(silent_r)
            # ... and with the listener full again, the one kept alive after its answer, which
            # has now waited longest.
            await wait_until_async(lambda: ep.listener.open == 1, 10, "the answered connection to close")
            silent_again = await asyncio.open_connection("127.0.0.1", port)
            await wait_until_async(lambda: len(ep.listener.waiting) == 2, 10, "the listener full again")
            assert (await _get(port)).startswith(b"HTTP/1.1 200")
            await _closed_at(kept_r)
            assert ep.listener.closed["evicted"] == 2
            # Both slots busy with requests in progress: a newcomer is answered 503.
            silent_again[1].close()
            await wait_until_async(lambda: ep.listener.open == 0, 10, "every connection closed")
            busy = [asyncio.create_task(_get(port, "/slow")) for _ in range(2)]
            await wait_until_async(lambda: ep.listener.open == 2 and not ep.listener.waiting, 10,
                                   "two requests in progress")
            refused = await _get(port)
            assert refused.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in refused
            assert ep.listener.refused["limit"] == 1
            gate.set()
            assert all(a.startswith(b"HTTP/1.1 200") for a in await asyncio.gather(*busy))
        finally:
            await ep.close()

    asyncio.run(main())


def test_uvicorn_warns_of_bad_requests_at_most_once_a_second():
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep()
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(handler)

    async def main():
        ep = HttpEndpoint(_app(asyncio.Event()), port=0)
        port = await ep.start()
        try:
            t0 = time.monotonic()
            for _ in range(30):
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(b"NOT HTTP AT ALL\r\n\r\n")
                assert (await asyncio.wait_for(r.read(), 10)).startswith(b"HTTP/1.1 400")
                w.close()
            return time.monotonic() - t0
        finally:
            await ep.close()

    try:
        elapsed = asyncio.run(main())
    finally:
        uvicorn_log.removeHandler(handler)
    invalid = [r for r in records if "Invalid HTTP request" in r.getMessage()]
    assert 1 <= len(invalid) <= int(elapsed) + 1
    assert len(invalid) < 30


def test_tracedb_ui_takes_its_connection_cap_from_max_connections(web_store):
    import os
    import signal
    import socket
    import subprocess
    import sys

    import orjson

    from urllib.parse import urlsplit

    from .conftest import REPO

    data_dir, _ids = web_store
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracedb", "--data-dir", data_dir, "ui", "--port", "0", "--json", "--max-connections", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=REPO), cwd=REPO,
    )
    held = []
    try:
        port = urlsplit(orjson.loads(proc.stdout.readline())["url"]).port
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        # A fourth that says nothing finds the view at its cap: 503 once its probation is over
        # (below the cap it would wait for its headers, 10 s, with no answer).
        fourth = socket.create_connection(("127.0.0.1", port), timeout=10)
        held.append(fourth)
        assert fourth.recv(65536).startswith(b"HTTP/1.1 503")
    finally:
        for s in held:
            s.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        proc.stdout.close()
        proc.stderr.close()
