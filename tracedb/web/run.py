"""`tracedb ui`: the web view on its own uvicorn server, until SIGINT or SIGTERM.

Every request carries the bearer token (the printed address holds it once; the first visit turns
it into a cookie), unless the operator trusts the local users (`--trust-local-users`) and the
address is loopback. A loopback address answers only to loopback Host names (and those added with
`--allowed-host`). Any other address follows the rules of the recorder's TCP listener:
`--allow-remote` and a bearer token given by TRACEDB_TOKEN or --token-file (docs/security.md).
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import shlex
import signal
from typing import Callable, Optional, Sequence
from urllib.parse import quote

from tracedb.projection import db
from tracedb.sidecar.asgi import HttpEndpoint, descriptor_budget, is_loopback, raise_fd_limit
from tracedb.sidecar.asgi import allowed_hosts as allowed_host_names
from tracedb.config import DEFAULT_DATA_DIR, Config, ensure_local_token
from tracedb.errors import ConfigError
from tracedb.program import program
from tracedb.reads.reader import AsyncReader
from tracedb.sidecar.protocol import DEFAULT_HTTP_MAX_CONNECTIONS
from tracedb.web.app import create_app

_CANNOT_LISTEN = (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL)


def check_listen(host: str, *, allow_remote: bool, token: Optional[str], flag: str = "--host") -> None:
    """Refuse a non-loopback address without --allow-remote and a token (the TCP listener's rules)."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ConfigError(
            f"refusing to serve the web view on non-loopback address {host} ({flag})",
            hint="pass --allow-remote together with a token (TRACEDB_TOKEN or --token-file)",
        )
    if not token:
        raise ConfigError(
            f"serving the web view on {host} needs a bearer token",
            hint="set TRACEDB_TOKEN or pass --token-file",
        )


def address(host: str, port: int, token: Optional[str] = None) -> str:
    """The address to open in a browser (with the token, which the first visit turns into a cookie)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={quote(token, safe='')}" if token else "")


def replay_command(cfg: Config) -> str:
    """The replay command a page offers to copy, naming the store this view reads."""
    parts = shlex.split(program())
    if cfg.db_url:
        parts += ["--db", db.describe(cfg.db_url)]
    elif os.path.normpath(cfg.data_dir) != DEFAULT_DATA_DIR:
        parts += ["--data-dir", cfg.data_dir]
    return shlex.join(parts + ["replay"])


def cannot_listen(e: OSError, host: str, port: int, flag: str) -> ConfigError:
    """A busy or forbidden address as one error and one hint."""
    return ConfigError(
        f"cannot listen on {host}:{port}: {e.strerror} ({flag})",
        hint="another process holds that address: stop it, or choose another port (0 picks a free one)",
    )


def view_token(cfg: Config) -> str:
    """The token of a view given none: the data directory's (made the first time), or, with no
    data directory (a fleet's database alone), one for this run, which only the printed address
    carries."""
    if os.path.isdir(cfg.data_dir):
        return ensure_local_token(cfg.data_dir)
    return secrets.token_urlsafe(32)


async def serve_ui(
    cfg: Config,
    *,
    host: str = "127.0.0.1",
    port: int = 8470,
    token: Optional[str] = None,
    allowed_hosts: Sequence[str] = (),
    on_listening: Callable[[str], None] = print,
    stop: Optional[asyncio.Event] = None,
    max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS,
) -> None:
    """Serve the web view of `cfg`'s store until SIGINT/SIGTERM (or `stop` is set). With `token`,
    every request must carry it; the Host names answered are `tracedb.sidecar.asgi.allowed_hosts`'. At most
    `max_connections` connections (fewer if the limit of open files is too low for them)."""
    allowed = allowed_host_names(host, allowed_hosts)
    _before, limit = raise_fd_limit()
    max_connections = descriptor_budget(limit, {}, {"ui": max_connections})["ui"]
    reader = await AsyncReader.open(cfg)
    endpoint = HttpEndpoint(
        create_app(reader, token=token, allowed_hosts=allowed, replay_command=replay_command(cfg)),
        host=host, port=port, name="ui", max_connections=max_connections,
    )
    try:
        try:
            bound = await endpoint.start()
        except OSError as e:
            if e.errno in _CANNOT_LISTEN:
                raise cannot_listen(e, host, port, "--port") from None
            raise
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # not the main thread
                pass
        on_listening(address(host, bound, token))
        await stop.wait()
    finally:
        await endpoint.close()
        await reader.close()
