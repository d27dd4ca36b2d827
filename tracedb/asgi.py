"""Run an ASGI application (Starlette) on uvicorn inside an event loop that is already running.

`tracedb serve` hosts its HTTP endpoints (metrics and health, the web UI, the OTLP receiver) on the
sidecar's own event loop, next to the socket listener: one process, one loop, no threads. uvicorn's
`Server.serve()` is a coroutine, so each endpoint is a task on that loop; `HttpEndpoint` starts it,
reports the bound port (0 picks a free one) and shuts it down with the recorder.

`HostCheck` is the Host rule every one of these listeners applies (docs/security.md): a loopback
listener answers only to loopback names, so that a web page whose name was rebound to 127.0.0.1
reads nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import re
from typing import Iterable, Optional

# The names a loopback listener answers to without being told more (with or without the port).
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")
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


def host_name(header: str) -> Optional[str]:
    """The name a Host header gives, lowercased and without its port ("[::1]" for "[::1]:8470",
    "localhost" for "LocalHost:80"); None for one that is not a Host value."""
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        if end < 0:
            return None
        name, rest = h[: end + 1], h[end + 1 :]
    else:
        name, sep, port = h.partition(":")
        rest = sep + port
    if rest and not (rest[0] == ":" and rest[1:].isdigit()):
        return None
    return name or None


def normalize_host(name: str) -> str:
    """An operator's --allowed-host as a Host header names it: lowercased, no port, an IPv6
    address in brackets."""
    text = name.strip().lower()
    try:
        if ipaddress.ip_address(text.strip("[]")).version == 6:
            return f"[{text.strip('[]')}]"
    except ValueError:
        pass
    got = host_name(text)
    if got is None or not _HOST_NAME.fullmatch(got):
        raise ValueError(f"{name!r} is not a host name")
    return got


def allowed_hosts(listen_host: str, extra: Iterable[str] = ()) -> Optional[frozenset]:
    """The Host names a listener on `listen_host` answers to; None for any.

    Loopback: the loopback names and `extra`. Anything else (--allow-remote, where every request
    carries the token): any name, unless `extra` names some, then those, the address itself and
    the loopback names. A rebinding page cannot send the token, and the token's cookie belongs
    to the name the owner opened, so there the token is the guard."""
    added = {normalize_host(h) for h in extra}
    if is_loopback(listen_host):
        return frozenset(LOOPBACK_NAMES) | added
    if not added:
        return None
    return frozenset(LOOPBACK_NAMES) | added | {normalize_host(listen_host)}


class HostCheck:
    """ASGI middleware: a request whose Host header names no allowed host gets 403 and a body
    that says why, before any route sees it."""

    def __init__(self, app, allowed: Iterable[str], *, flag: str = "--allowed-host"):
        self.app = app
        self.allowed = frozenset(allowed)
        self.flag = flag

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":  # no listener here serves websockets: routing refuses them
            return await self.app(scope, receive, send)
        given = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"]
        if len(given) == 1 and host_name(given[0]) in self.allowed:
            return await self.app(scope, receive, send)
        shown = repr(given[0][:100]) if len(given) == 1 else ("missing" if not given else "given twice")
        names = ", ".join(sorted(self.allowed))
        body = (
            f"403 Forbidden: the Host header ({shown}) is not a name this server answers to "
            f"({names}); a page that rebinds its own name to this address reads nothing here. "
            f"Open it by one of those names, or add the name with {self.flag} NAME.\n"
        ).encode()
        await send({
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store")],
        })
        await send({"type": "http.response.body", "body": body})


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
