"""The `tracedb serve` process: listen, open the store (recovery; requests wait for it), serve until a
signal, close."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import sys
import time
from typing import Awaitable, Optional

from ..errors import ConfigError, StoreInUseError
from . import protocol as P
from .backend import BackendStats, Deferred
from .metrics import SidecarMetrics, configure_logging, routes, sample_forever
from .server import ServerConfig, SidecarServer, check_config

log = logging.getLogger("tracedb.sidecar")


def _version() -> str:
    try:
        from importlib.metadata import version

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


class HttpServer:
    """`--http-port`: the web view, /metrics and /health on one uvicorn server on the loop."""

    def __init__(self, cfg, metrics: SidecarMetrics, host: str, port: int, token):
        self.cfg, self.metrics, self.host, self.port, self.token = cfg, metrics, host, port, token
        self.reader = None
        self.endpoint = None
        self._sampler = None

    async def start(self) -> int:
        from ..asgi import HttpEndpoint
        from ..reads import AsyncReader
        from ..web import create_app
        from ..web.run import is_loopback, replay_command

        self._sampler = asyncio.get_running_loop().create_task(sample_forever(self.metrics))
        self.reader = await AsyncReader.open(self.cfg)
        app = create_app(
            self.reader, replay_command=replay_command(self.cfg), extra_routes=routes(self.metrics),
            token=None if is_loopback(self.host) else self.token,
        )
        self.endpoint = HttpEndpoint(app, host=self.host, port=self.port, name="http")
        self.port = await self.endpoint.start()
        log.info("http listening", extra={"ui": f"http://{self.host}:{self.port}/",
                                          "metrics": f"http://{self.host}:{self.port}/metrics"})
        return self.port

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        if self.endpoint is not None:
            await self.endpoint.close()
        if self.reader is not None:
            await self.reader.close()


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
    import wal

    if os.path.isdir(cfg.wal_dir) and wal.is_locked(cfg.wal_dir):
        raise StoreInUseError(
            f"data directory {cfg.data_dir} is in use by a running recorder",
            hint="one recorder per data directory: stop the other one, or record through it "
            "(`tracedb.client.connect` finds its socket)",
        )


async def serve(cfg, scfg: ServerConfig, otlp: Optional[dict] = None, *, http_host: str = "127.0.0.1") -> int:
    """Listen on the socket at once, open the store on `cfg.data_dir` (requests wait for it),
    serve until SIGTERM/SIGINT, shut down cleanly. `otlp` ({"host", "port"}) also serves
    OTLP/HTTP traces there (tracedb.otel.receiver)."""
    # Imported before listening: what a request waits for once the socket is there is the
    # store's opening (recovery), not the interpreter loading SQLAlchemy.
    from .store_backend import open_backend

    check_config(scfg)  # refuse a bad listening setup before recovery does any work
    if scfg.metrics_port is not None:  # --http-port: the web view, /metrics, /health
        from ..web.run import check_listen as check_http

        check_http(http_host, allow_remote=scfg.allow_remote, token=scfg.token, flag="--http-host")
    if otlp is not None:
        from ..otel.receiver import check_listen, require_otel

        require_otel()
        check_listen(otlp["host"], scfg.allow_remote, scfg.token)
    _refuse_in_use(cfg)
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
            http = HttpServer(cfg, metrics, http_host, scfg.metrics_port, scfg.token)
            await http.start()
        if otlp is not None:
            from ..otel.receiver import start_receiver

            listening = f"the OTLP port {otlp['host']}:{otlp['port']} (--otlp-port)"
            otlp_http, _receiver = await start_receiver(
                backend.store, host=otlp["host"], port=otlp["port"], token=scfg.token,
                draining=lambda: server.draining,
            )
            log.info("otlp listening", extra={"otlp": f"http://{otlp['host']}:{otlp_http.port}/v1/traces"})
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


def serve_forever(cfg, scfg: ServerConfig, *, log_level: str = "info", log_json: Optional[bool] = None,
                  otlp: Optional[dict] = None, http_host: str = "127.0.0.1") -> None:
    """Run `serve` in a fresh event loop (the CLI entry point)."""
    configure_logging(log_level, json_format=log_json)
    asyncio.run(serve(cfg, scfg, otlp, http_host=http_host))
