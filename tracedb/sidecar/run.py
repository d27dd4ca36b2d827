"""The `tracedb serve` process: listen, open the store (recovery; requests wait for it), serve until a
signal, close."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import gc
import logging
import os
import shlex
import signal
import sys
import time
from importlib.metadata import version
from typing import TYPE_CHECKING, Awaitable, Optional, Sequence

import wal

from tracedb import reads
from tracedb.imports import on_first_use
from tracedb.sidecar.asgi import RESERVED_FDS, HttpEndpoint, descriptor_budget, is_loopback, open_fds, raise_fd_limit
from tracedb.sidecar.asgi import allowed_hosts as allowed_host_names
from tracedb.config import ensure_local_token, token_path
from tracedb.errors import ConfigError, StoreInUseError, file_error
from tracedb.sidecar import protocol as P
from tracedb.sidecar.backend import BackendStats, Deferred
from tracedb.sidecar.metrics import OPEN_PATHS, SidecarMetrics, configure_logging, routes, sample_forever
from tracedb.sidecar.server import ServerConfig, SidecarServer, check_config
from tracedb.sidecar.store_backend import open_backend

if TYPE_CHECKING:
    from tracedb import web
    from tracedb.otel import receiver as otlp_receiver
    from tracedb.web import run as web_run
else:
    # Lazy seams (`tracedb.imports`): the web view (Starlette) and the OTLP receiver load only
    # when their port is given.
    web = on_first_use("tracedb.web")
    web_run = on_first_use("tracedb.web.run")
    otlp_receiver = on_first_use("tracedb.otel.receiver")

log = logging.getLogger("tracedb.sidecar")


def _version() -> str:
    try:
        return version("tracedb")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "0"


def tune_runtime() -> None:
    """Interpreter settings for a server whose hot path allocates many short-lived objects.

    - The objects alive at start (modules, SQLAlchemy metadata) are moved out of the collector's
      sight (`gc.freeze`), and the young generation is collected less often: a collection per
      700 allocations costs more than the events themselves at 100k events/s.
    - A shorter GIL switch interval: the WAL's flusher thread must get the GIL back promptly after
      each fdatasync to acknowledge the group, or every acknowledgement waits up to 5 ms while
      the event loop is busy.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 100)
    sys.setswitchinterval(0.001)


_CANNOT_LISTEN = (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL)


def _cannot_listen(e: OSError, what: str, scfg: ServerConfig) -> ConfigError:
    ports = []
    if scfg.metrics_port is not None:
        ports.append(f"--http-port {scfg.metrics_port}")
    if scfg.tcp_port is not None:
        ports.append(f"--tcp {scfg.tcp_host or '127.0.0.1'}:{scfg.tcp_port}")
    return ConfigError(
        f"cannot listen on {what}: {e.strerror}" + (f" ({', '.join(ports)})" if ports else ""),
        hint="another process holds that address (is a recorder already running?): stop it, or "
        "choose another port",
    )


def plan_descriptors(scfg: ServerConfig, otlp: Optional[dict]) -> None:
    """Raise the soft limit of open files to the hard one, and fit the listeners' connection caps
    in it: RESERVED_FDS for the recorder's own files and the Unix socket's `max_connections` in
    full, then the TCP, OTLP and HTTP caps (lowered, with a warning, when they do not fit).
    Sets the caps on `scfg`; raises ConfigError when not even the reserve fits."""
    before, limit = raise_fd_limit()
    reserved = {"unix": scfg.max_connections} if scfg.socket_path is not None else {}
    wanted = {}
    if scfg.tcp_port is not None:
        wanted["tcp"] = scfg.tcp_max_connections or scfg.max_connections
    if otlp is not None:
        wanted["otlp"] = scfg.otlp_max_connections
    if scfg.metrics_port is not None:
        wanted["http"] = scfg.http_max_connections
    caps = descriptor_budget(limit, reserved, wanted)
    log.info(
        "file descriptors",
        extra={"limit": limit, "raised_from": before if before != limit else None, "open": open_fds(),
               "reserved": RESERVED_FDS, "max_connections": caps},
    )
    lowered = {name: caps[name] for name in wanted if caps[name] < wanted[name]}
    if lowered:
        log.warning(
            "connection caps lowered to fit the limit of open files",
            extra={"limit": limit, "asked": {name: wanted[name] for name in lowered}, "max_connections": lowered},
        )
    if "tcp" in caps:
        scfg.tcp_max_connections = caps["tcp"]
    if "otlp" in caps:
        scfg.otlp_max_connections = caps["otlp"]
    if "http" in caps:
        scfg.http_max_connections = caps["http"]


class HttpServer:
    """`--http-port`: the web view, /metrics and /health on one uvicorn server on the loop."""

    def __init__(self, cfg, metrics: SidecarMetrics, host: str, port: int, token, *,
                 allowed_hosts=None, token_file: Optional[str] = None, limits: Optional[dict] = None):
        self.cfg, self.metrics, self.host, self.port, self.token = cfg, metrics, host, port, token
        self.allowed_hosts = allowed_hosts
        self.token_file = token_file
        self.limits = limits or {}
        self.reader = None
        self.endpoint = None
        self._sampler = None

    async def start(self) -> int:
        self._sampler = asyncio.get_running_loop().create_task(sample_forever(self.metrics))
        self.reader = await reads.AsyncReader.open(self.cfg)
        app = web.create_app(
            self.reader, replay_command=web_run.replay_command(self.cfg), extra_routes=routes(self.metrics),
            token=self.token, open_paths=OPEN_PATHS, allowed_hosts=self.allowed_hosts,
        )
        self.endpoint = HttpEndpoint(app, host=self.host, port=self.port, name="http", **self.limits)
        self.metrics.watch(self.endpoint.listener)
        self.port = await self.endpoint.start()
        fields = {"ui": web_run.address(self.host, self.port), "metrics": web_run.address(self.host, self.port) + "metrics"}
        if self.token:
            if sys.stderr.isatty():
                # The owner's terminal: the address to open, as `tracedb ui` prints it. A log
                # that others may read (a file, the journal) names where the token is instead.
                fields["ui"] = web_run.address(self.host, self.port, self.token)
            else:
                fields["token"] = token_where(self.token_file)
        log.info("http listening", extra=fields)
        return self.port

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self.endpoint is not None:
            await self.endpoint.close()
        reader, self.reader = self.reader, None
        if reader is not None:
            await reader.close()


def _views_stop_first(server: SidecarServer, http: HttpServer) -> None:
    """On SIGTERM or SIGINT, close the web view before the server drains and closes the store:
    its readers let go of the database first, so the store's last checkpoint, at close, finds
    none in the middle of a read, and traces.db alone holds everything once the process exits."""
    loop = asyncio.get_running_loop()
    tasks = set()

    async def stop(sig) -> None:
        try:
            await http.close()
        finally:
            server.request_stop(sig)

    def on_signal(sig) -> None:
        task = loop.create_task(stop(sig))
        tasks.add(task)  # held until done: the loop keeps only weak references to tasks
        task.add_done_callback(tasks.discard)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)


def token_where(token_file: Optional[str]) -> str:
    """Where the token is, for a log line: its file, or the variable that holds it."""
    return os.path.abspath(token_file) if token_file else "$TRACEDB_TOKEN"


def otlp_headers(token_file: Optional[str]) -> str:
    """The command that hands an exporter the token, reading it where it is (a log line must
    not hold the token itself)."""
    value = f"$(cat {shlex.quote(os.path.abspath(token_file))})" if token_file else "${TRACEDB_TOKEN}"
    return f'OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer%20{value}"'


def _needs_token(host: str, scfg: ServerConfig) -> bool:
    return not (scfg.trust_local_users and is_loopback(host))


class OpeningBackend:
    """The server's backend while `tracedb serve` opens its store (recovery runs first, in a
    thread): the socket listens from the start, and a request that comes meanwhile waits for the
    store instead of finding no recorder there. A client that connects while the recorder starts
    is answered once the store is open, within its own timeouts; a fail-open client's probe (a
    `get`) is answered then, not before. Once the store is open, this object's methods are the
    store backend's own."""

    _DELEGATED = ("stage_start", "stage_event", "stage_finish", "stage_invalidate", "stage_recording_failure",
                  "stage_abandon", "commit", "barrier", "get", "stats", "set_group_observer")

    def __init__(self, opening: Awaitable):
        self._observer = None
        self.opening = asyncio.get_running_loop().create_task(self._open(opening))

    async def _open(self, opening: Awaitable):
        backend = await opening
        for name in self._DELEGATED:  # requests read from now on go straight to the store
            setattr(self, name, getattr(backend, name))
        if self._observer is not None:
            backend.set_group_observer(self._observer)
        return backend

    async def _when_open(self):
        try:
            return await asyncio.shield(self.opening)
        except Exception as e:  # noqa: BLE001 - the server stops; the client may try another
            raise P.ProtocolError(P.UNAVAILABLE, f"the recorder could not open its store: {e}") from None

    async def _staged(self, name: str, args: tuple):
        out = getattr(await self._when_open(), name)(*args)
        return await out.awaitable if type(out) is Deferred else out

    def _held(self, name: str, *args) -> Deferred:
        return Deferred(self._staged(name, args))

    def stage_start(self, *args):
        return self._held("stage_start", *args)

    def stage_event(self, *args):
        return self._held("stage_event", *args)

    def stage_finish(self, *args):
        return self._held("stage_finish", *args)

    def stage_invalidate(self, *args):
        return self._held("stage_invalidate", *args)

    def stage_recording_failure(self, *args):
        return self._held("stage_recording_failure", *args)

    def stage_abandon(self, *args):
        return self._held("stage_abandon", *args)

    def commit(self):
        return None  # nothing is staged before the store is open

    def barrier(self):
        return None

    async def get(self, execution_id: str) -> dict:
        return await (await self._when_open()).get(execution_id)

    def stats(self) -> BackendStats:
        return BackendStats()

    def set_group_observer(self, observer) -> None:
        self._observer = observer

    async def close(self) -> None:
        try:
            backend = await self.opening
        except Exception:  # noqa: BLE001 - it never opened: nothing to close
            return
        await backend.close()


def _refuse_in_use(cfg) -> None:
    """Refuse a data directory another recorder (or an embedded store) holds before listening:
    a client must not find this server's socket, nor lose it, for a store it cannot open."""
    if os.path.isdir(cfg.wal_dir) and wal.is_locked(cfg.wal_dir):
        raise StoreInUseError(
            f"data directory {cfg.data_dir} is in use by a running recorder",
            hint="one recorder per data directory: stop the other one, or record through it "
            "(`tracedb.client.connect` finds its socket)",
        )


async def serve(cfg, scfg: ServerConfig, otlp: Optional[dict] = None, *, http_host: str = "127.0.0.1",
                allowed_hosts: Sequence[str] = ()) -> int:
    """Listen on the socket at once, open the store on `cfg.data_dir` (requests wait for it),
    serve until SIGTERM/SIGINT, shut down cleanly. `otlp` ({"host", "port"}) also serves
    OTLP/HTTP traces there (tracedb.otel.receiver). `allowed_hosts`: Host names the HTTP
    listeners answer to besides the loopback ones."""
    hosts = [h for h, on in ((scfg.tcp_host or "127.0.0.1", scfg.tcp_port is not None),
                             (http_host, scfg.metrics_port is not None),
                             (otlp["host"] if otlp else "", otlp is not None)) if on]
    # A loopback listener that needs a token and was given none gets the data directory's.
    local_token = not scfg.token and any(is_loopback(h) and _needs_token(h, scfg) for h in hosts)
    # Refuse a bad listening setup before anything is made, or recovery does any work.
    check_config(scfg, local_token=local_token)
    try:
        http_allowed = allowed_host_names(http_host, allowed_hosts)
        otlp_allowed = allowed_host_names(otlp["host"], allowed_hosts) if otlp else None
    except ValueError as e:
        raise ConfigError(str(e), hint="give a host name or an address, without a port (--allowed-host)") from None
    if scfg.metrics_port is not None:  # --http-port: the web view, /metrics, /health
        web_run.check_listen(http_host, allow_remote=scfg.allow_remote, token=scfg.token, flag="--http-host")
    if otlp is not None:
        otlp_receiver.require_otel()
        otlp_receiver.check_listen(otlp["host"], scfg.allow_remote, scfg.token)
    _refuse_in_use(cfg)
    if local_token:
        scfg = dataclasses.replace(scfg, token=ensure_local_token(cfg.data_dir), token_file=token_path(cfg.data_dir))
    plan_descriptors(scfg, otlp)
    t0 = time.perf_counter()
    opening = OpeningBackend(open_backend(cfg.data_dir, config=cfg))
    server = SidecarServer(opening, scfg, version=_version())
    server.install_signal_handlers()
    http = None
    otlp_http = None
    listening = "the socket or TCP port"
    try:
        await server.start()
        backend = await opening.opening
        server.backend = backend
        rec = getattr(backend.store, "last_recovery", None)
        log.info(
            "store open",
            extra={
                "data_dir": cfg.data_dir,
                "open_s": round(time.perf_counter() - t0, 3),
                "recovered_incomplete": getattr(rec, "marked_incomplete", 0),
                "wal_truncated_bytes": getattr(rec, "wal_truncated_bytes", 0),
                "durable_lsn": backend.store.durable_lsn,
            },
        )
        metrics = SidecarMetrics()
        metrics.attach(server)
        if scfg.metrics_port is not None:
            listening = "the HTTP port"
            http = HttpServer(cfg, metrics, http_host, scfg.metrics_port,
                              scfg.token if _needs_token(http_host, scfg) else None,
                              allowed_hosts=http_allowed, token_file=scfg.token_file,
                              limits=_http_limits(scfg, scfg.http_max_connections))
            await http.start()
        if http is not None:
            _views_stop_first(server, http)
        if otlp is not None:
            listening = f"the OTLP port {otlp['host']}:{otlp['port']} (--otlp-port)"
            otlp_token = scfg.token if _needs_token(otlp["host"], scfg) else None
            otlp_http, _receiver = await otlp_receiver.start_receiver(
                backend.store, host=otlp["host"], port=otlp["port"], token=otlp_token,
                draining=lambda: server.draining, allowed_hosts=otlp_allowed,
                connection_limits=_http_limits(scfg, scfg.otlp_max_connections),
            )
            metrics.watch(otlp_http.http.listener)
            fields = {"otlp": web_run.address(otlp["host"], otlp_http.port) + "v1/traces"}
            if otlp_token:
                fields["token"] = token_where(scfg.token_file)
            log.info("otlp listening", extra=fields)
            if otlp_token:
                log.info("exporters send the token with: export %s", otlp_headers(scfg.token_file))
    except BaseException as e:
        if otlp_http is not None:
            await otlp_http.close()
        if http is not None:
            await http.close()
        if server.listening:
            await server.shutdown()  # it listened: its socket goes too, then the backend closes
        else:
            await opening.close()
        if isinstance(e, OSError) and e.errno in _CANNOT_LISTEN:
            socket_dir = os.path.dirname(os.path.abspath(scfg.socket_path)) if scfg.socket_path else None
            if e.errno in (errno.EACCES, errno.EPERM) and socket_dir and not os.access(socket_dir, os.W_OK):
                # Not a busy or privileged port: the socket's directory (the data directory, by
                # default) is not this user's to write, which one error naming it and the chown says.
                raise file_error(e, cfg.data_dir, path=socket_dir) from None
            raise _cannot_listen(e, listening, scfg) from None
        raise
    tune_runtime()
    try:
        await server.serve_until_stopped()
    finally:
        if otlp_http is not None:
            await otlp_http.close()
        if http is not None:
            await http.close()
    return 0


def _http_limits(scfg: ServerConfig, max_connections: int) -> dict:
    return {"max_connections": max_connections, "header_timeout_s": scfg.http_header_timeout_s,
            "idle_timeout_s": scfg.http_idle_timeout_s}


def serve_forever(cfg, scfg: ServerConfig, *, log_level: str = "info", log_json: Optional[bool] = None,
                  otlp: Optional[dict] = None, http_host: str = "127.0.0.1",
                  allowed_hosts: Sequence[str] = ()) -> None:
    """Run `serve` in a fresh event loop (the CLI entry point)."""
    configure_logging(log_level, json_format=log_json)
    asyncio.run(serve(cfg, scfg, otlp, http_host=http_host, allowed_hosts=allowed_hosts))
