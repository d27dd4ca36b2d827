"""The `tracedb serve` process: open the store (recovery), listen, serve until a signal, close."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import signal
import sys
import time
from typing import Optional

from ..errors import ConfigError
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


async def serve(cfg, scfg: ServerConfig, otlp: Optional[dict] = None, *, http_host: str = "127.0.0.1") -> int:
    """Open the store on `cfg.data_dir`, serve until SIGTERM/SIGINT, shut down cleanly.
    `otlp` ({"host", "port"}) also serves OTLP/HTTP traces there (tracedb.otel.receiver)."""
    from .store_backend import open_backend

    check_config(scfg)  # refuse a bad listening setup before recovery does any work
    if scfg.metrics_port is not None:  # --http-port: the web view, /metrics, /health
        from ..web.run import check_listen as check_http

        check_http(http_host, allow_remote=scfg.allow_remote, token=scfg.token, flag="--http-host")
    if otlp is not None:
        from ..otel.receiver import check_listen, require_otel

        require_otel()
        check_listen(otlp["host"], scfg.allow_remote, scfg.token)
    t0 = time.perf_counter()
    backend = await open_backend(cfg.data_dir, config=cfg)
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
    server = SidecarServer(backend, scfg, version=_version())
    http = None
    otlp_http = None
    listening = "the HTTP port"
    try:
        metrics = SidecarMetrics()
        metrics.attach(server)
        if scfg.metrics_port is not None:
            http = HttpServer(cfg, metrics, http_host, scfg.metrics_port, scfg.token)
            await http.start()
        listening = "the socket or TCP port"
        server.install_signal_handlers()
        if http is not None:
            _views_stop_first(server, http)
        await server.start()
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
            await backend.close()
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
