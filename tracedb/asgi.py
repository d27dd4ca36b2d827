"""Run an ASGI application (Starlette) on uvicorn inside an event loop that is already running.

`tracedb serve` hosts its HTTP endpoints (metrics and health, the web UI, the OTLP receiver) on the
sidecar's own event loop, next to the socket listener: one process, one loop, no threads. uvicorn's
`Server.serve()` is a coroutine, so each endpoint is a task on that loop; `HttpEndpoint` starts it,
reports the bound port (0 picks a free one) and shuts it down with the recorder.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
from typing import Optional

# Set in the ASGI scope by a token check that let the request through with the token; a route
# open without it (/health) reads it to decide how much to say.
AUTHENTICATED = "tracedb.authenticated"


def is_loopback(host: str) -> bool:
    """Whether a listening address stays on this machine (localhost, 127.0.0.0/8, ::1): the one
    rule the socket's TCP listener, the web view and the OTLP receiver apply before listening."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bearer_token(headers) -> Optional[str]:
    """The token of an `Authorization: Bearer TOKEN` header (the scheme in any case), or None."""
    auth = headers.get("authorization", "")
    scheme, _, token = auth.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class HttpEndpoint:
    """One uvicorn server for `app` on `host:port`, run as a task on the current event loop."""

    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 0, name: str = "http"):
        self.app = app
        self.host = host
        self.port = port
        self.name = name
        self._server = None
        self._task: Optional[asyncio.Task] = None

    async def start(self) -> int:
        """Listen, and return the bound port. A busy address raises OSError(EADDRINUSE)."""
        import socket

        import uvicorn

        # Bind here, not inside uvicorn: a busy port is then an OSError the caller turns into
        # one error line, instead of uvicorn's log line and SystemExit.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
        # without it a response written in two parts waits out the peer's delayed ACK (40 ms).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_config=None,  # the recorder's logging configuration stays in charge
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        # The recorder owns SIGTERM and SIGINT (a graceful stop of everything, in order): uvicorn
        # must not take them over while it serves, nor raise them again when it stops.
        self._server.capture_signals = contextlib.nullcontext
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                exc = self._task.exception() if not self._task.cancelled() else None
                raise exc or OSError(errno.EADDRINUSE, f"{self.name} endpoint did not start")
            await asyncio.sleep(0.005)
        return self.port

    async def close(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=5)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - shutting down regardless
            self._task.cancel()
        self._server = None
        self._task = None
