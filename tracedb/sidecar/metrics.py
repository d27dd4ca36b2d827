"""Observability of the sidecar: Prometheus metrics, /health, structured (JSON) logs.

Opt-in (`tracedb serve --http-port N`): `/metrics` in the Prometheus text format
(prometheus-client's own ASGI app) and `/health` as JSON, served by uvicorn on the recorder's
event loop next to the web view (`tracedb.web`), one server on 127.0.0.1. `/metrics` needs the
listener's bearer token as the web view does (Prometheus sends it); `/health` answers without it
with the status alone (docs/security.md).

The hot path only bumps plain integers (`server.Counters`); a custom collector turns them into
metric families at scrape time. Histograms are observed once per WAL group and once per response
batch, never per event.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
import time
from typing import Optional

import orjson
from prometheus_client import CollectorRegistry, Histogram, generate_latest, make_asgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from tracedb.reads.stats import totals
from tracedb.sidecar.asgi import AUTHENTICATED, fd_limit, open_fds

log = logging.getLogger("tracedb.sidecar")

_FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
TOTALS_MAX_AGE_S = 5.0  # how old the executions/tokens/cost totals a scrape shows may be
_ACK_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class RateMeter:
    """Events per second over a sliding window, from a monotonically growing count."""

    def __init__(self, window_s: float = 10.0, clock=time.monotonic):
        self.window_s = window_s
        self.clock = clock
        self._samples: collections.deque = collections.deque()

    def sample(self, count: int) -> None:
        """Record the count now (called about once a second)."""
        now = self.clock()
        self._samples.append((now, count))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()

    def rate(self) -> float:
        """Per-second rate over the samples in the window (0 until two samples exist)."""
        if len(self._samples) < 2:
            return 0.0
        (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0


class SidecarMetrics:
    """The server's metrics on their own registry (tests run several servers in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.server = None  # set by attach()
        self.backend = None
        self.listeners: list = []  # tracedb.sidecar.asgi.Listener: the socket's, TCP, OTLP, HTTP
        self.events_rate = RateMeter()
        self.totals: dict = {"executions": [], "models": []}
        self._totals_at = -TOTALS_MAX_AGE_S
        self.fsync_seconds = Histogram(
            "tracedb_wal_fsync_seconds",
            "Latency of one WAL group's write + fdatasync.",
            buckets=_FSYNC_BUCKETS,
            registry=self.registry,
        )
        self.group_records = Histogram(
            "tracedb_wal_group_records",
            "Records made durable by one fdatasync (group commit size).",
            buckets=_GROUP_BUCKETS,
            registry=self.registry,
        )
        self.group_bytes = Histogram(
            "tracedb_wal_group_bytes",
            "Bytes written by one WAL group.",
            buckets=tuple(b * 256 for b in _GROUP_BUCKETS),
            registry=self.registry,
        )
        self.ack_seconds = Histogram(
            "tracedb_ack_batch_seconds",
            "From reading a batch of requests to writing their responses (one observation per batch).",
            buckets=_ACK_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Collector(self))

    def attach(self, server) -> None:
        """Bind to a server (and its backend): observe WAL groups, read counters at scrape time."""
        self.server = server
        self.backend = server.backend
        server.metrics = self
        for listener in getattr(server, "listeners", {}).values():
            self.watch(listener)
        try:
            self.backend.set_group_observer(self.observe_group)
        except Exception:  # noqa: BLE001 - a backend without WAL hooks still serves
            log.warning("backend does not report WAL groups; fsync metrics stay empty")

    def watch(self, listener) -> None:
        """Report a listener's connections, refusals and accept errors (tracedb_listener_*)."""
        if listener not in self.listeners:
            self.listeners.append(listener)

    def observe_group(self, records: int, nbytes: int, fsync_s: float) -> None:
        """Called after each WAL group commit, by whoever flushed it: the flusher thread or the
        event loop the WAL is attached to (thread-safe)."""
        self.fsync_seconds.observe(fsync_s)
        self.group_records.observe(records)
        self.group_bytes.observe(nbytes)

    def observe_ack(self, seconds: float, n: int) -> None:
        """One response batch of `n` requests, `seconds` after it was read."""
        self.ack_seconds.observe(seconds)

    async def refresh_totals(self) -> None:
        """Read the store's executions by intent and outcome, tokens and cost by model
        (`tracedb.reads.stats.totals`), in a thread, at most once per TOTALS_MAX_AGE_S: a scrape
        costs one GROUP BY, never a wait of the recorder's event loop."""
        engine = getattr(getattr(self.backend, "store", None), "read_engine", None)
        if engine is None or time.monotonic() - self._totals_at < TOTALS_MAX_AGE_S:
            return
        try:
            self.totals = await asyncio.to_thread(totals, engine)
        except Exception as e:  # noqa: BLE001 - /metrics still answers with the rest
            log.warning("tracedb: /metrics could not read the store's totals: %s", e)
        self._totals_at = time.monotonic()

    def sample(self) -> None:
        """Once a second: feed the events/s meter."""
        if self.server is not None:
            self.events_rate.sample(self.server.counters.events_acked)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)

    def health(self) -> tuple[int, dict]:
        """(HTTP status, JSON body) of /health: 200 when the recorder can write, else 503."""
        srv = self.server
        stats = self.backend.stats() if self.backend is not None else None
        failed = getattr(stats, "failed", None)
        status = "failed" if failed else ("draining" if srv is not None and srv.draining else "ok")
        body = {
            "status": status,
            "uptime_s": round(time.time() - srv.started_at, 3) if srv else 0,
            "events_per_s": round(self.events_rate.rate(), 1),
            "events_acked": srv.counters.events_acked if srv else 0,
            "connections": len(srv.connections) if srv else 0,
        }
        if stats is not None:
            body.update(
                {
                    "open_executions": stats.open_executions,
                    "durable_lsn": stats.durable_lsn,
                    "applied_lsn": stats.applied_lsn,
                    "wal_bytes_uncompacted": stats.uncompacted_bytes,
                    "compaction_lag_records": stats.compaction_lag_records,
                    "compaction_lag_s": round(stats.compaction_lag_s, 3),
                }
            )
            if failed:
                body["error"] = failed
        return (200 if status == "ok" else 503), body


class _Collector:
    """Turns the server's plain counters and the backend's stats into metric families."""

    def __init__(self, metrics: SidecarMetrics):
        self.metrics = metrics

    def describe(self):
        """Nothing up front: the families depend on the server (prometheus_client allows it)."""
        return []

    def collect(self):
        """Metric families from the server's counters and the backend's stats, at scrape time."""
        m = self.metrics
        srv = m.server
        if srv is None:
            return
        c = srv.counters
        yield CounterMetricFamily(
            "tracedb_events_acked", "Events acknowledged (durable) since start.", value=c.events_acked
        )
        g = GaugeMetricFamily("tracedb_events_per_second", "Acknowledged events/s over the last 10 s.")
        g.add_metric([], m.events_rate.rate())
        yield g
        req = CounterMetricFamily("tracedb_requests", "Requests received, by op.", labels=["op"])
        for op, n in c.requests.items():
            req.add_metric([op], n)
        yield req
        err = CounterMetricFamily("tracedb_errors", "Error responses, by code.", labels=["code"])
        for code, n in c.errors.items():
            err.add_metric([code], n)
        yield err
        yield GaugeMetricFamily("tracedb_connections", "Open client connections.", value=len(srv.connections))
        yield CounterMetricFamily(
            "tracedb_connections_opened", "Client connections accepted since start.", value=c.connections_total
        )
        inflight = sum(conn.inflight for conn in srv.connections)
        yield GaugeMetricFamily("tracedb_inflight_requests", "Requests staged, not yet answered.", value=inflight)
        yield CounterMetricFamily("tracedb_received_bytes", "Bytes read from clients.", value=c.bytes_in)
        yield CounterMetricFamily("tracedb_sent_bytes", "Bytes written to clients.", value=c.bytes_out)
        yield from _listener_families(m.listeners)
        yield from _totals_families(m.totals)
        yield GaugeMetricFamily("tracedb_open_fds", "File descriptors the recorder holds.", value=open_fds())
        yield GaugeMetricFamily("tracedb_fd_limit", "The recorder's limit of open files (soft RLIMIT_NOFILE).",
                                value=fd_limit())
        if m.backend is None:
            return
        s = m.backend.stats()
        yield GaugeMetricFamily("tracedb_open_executions", "Executions recording (status running).", value=s.open_executions)
        yield GaugeMetricFamily("tracedb_wal_durable_lsn", "Last LSN covered by fdatasync.", value=s.durable_lsn)
        yield GaugeMetricFamily("tracedb_wal_applied_lsn", "LSN below which the WAL is compacted.", value=s.applied_lsn)
        yield GaugeMetricFamily("tracedb_wal_bytes", "Bytes of WAL segment files on disk.", value=s.wal_bytes)
        yield GaugeMetricFamily(
            "tracedb_wal_uncompacted_bytes", "WAL bytes not yet compacted into the database.", value=s.uncompacted_bytes
        )
        yield GaugeMetricFamily(
            "tracedb_compaction_lag_records", "Durable WAL records not yet compacted.", value=s.compaction_lag_records
        )
        yield GaugeMetricFamily(
            "tracedb_compaction_lag_seconds",
            "Age of the oldest durable record not yet compacted (0 when caught up).",
            value=s.compaction_lag_s,
        )
        yield GaugeMetricFamily("tracedb_recorder_failed", "1 when the WAL refuses writes.", value=1 if s.failed else 0)


def _totals_families(totals: dict):
    """The store's executions by intent and outcome, tokens and cost by model (tracedb.reads.stats)."""
    ex = GaugeMetricFamily("tracedb_executions", "Executions in the store, by intent and outcome.",
                           labels=["intent", "outcome"])
    for intent, outcome, n in totals["executions"]:
        ex.add_metric([intent or "", outcome or ""], n)
    tokens = GaugeMetricFamily("tracedb_tokens", "Model tokens of the stored executions, by model and direction.",
                               labels=["model", "direction"])
    cost = GaugeMetricFamily("tracedb_cost_usd", "Known cost in USD of the stored executions, by model.",
                             labels=["model"])
    for model, tokens_in, tokens_out, usd in totals["models"]:
        tokens.add_metric([model, "input"], tokens_in or 0)
        tokens.add_metric([model, "output"], tokens_out or 0)
        cost.add_metric([model], usd or 0.0)
    yield from (ex, tokens, cost)


def _listener_families(listeners: list):
    """Each listener's connections, cap, refusals, closes and accept errors, labelled by its name
    (unix, tcp, otlp, http)."""
    conns = GaugeMetricFamily("tracedb_listener_connections", "Open connections, by listener.", labels=["listener"])
    caps = GaugeMetricFamily("tracedb_listener_max_connections", "Connection cap, by listener.", labels=["listener"])
    accepted = CounterMetricFamily("tracedb_listener_accepted", "Connections accepted, by listener.",
                                   labels=["listener"])
    refused = CounterMetricFamily(
        "tracedb_listener_refused",
        "Connections refused when accepted: at the cap (limit), or shed for want of file descriptors "
        "(descriptors).", labels=["listener", "reason"])
    closed = CounterMetricFamily(
        "tracedb_listener_closed",
        "Connections the server closed: to make room at the cap (evicted), no first frame or request "
        "headers in time (deadline), idle.", labels=["listener", "reason"])
    errors = CounterMetricFamily(
        "tracedb_listener_accept_errors", "accept() failures for want of resources, by errno.",
        labels=["listener", "errno"])
    for lst in listeners:
        conns.add_metric([lst.name], lst.open)
        caps.add_metric([lst.name], lst.max_connections)
        accepted.add_metric([lst.name], lst.accepted)
        for why, n in lst.refused.items():
            refused.add_metric([lst.name, why], n)
        for why, n in lst.closed.items():
            closed.add_metric([lst.name, why], n)
        for name, n in lst.accept_errors.items():
            errors.add_metric([lst.name, name], n)
    yield from (conns, caps, accepted, refused, closed, errors)


class _AsgiApp:
    """An ASGI callable as an object, so that Starlette's Route hands it the raw scope."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        await self.app(scope, receive, send)


# Served without the token where one guards the rest (a load balancer's probe has none): it then
# says whether the recorder can write, and nothing about what it records.
OPEN_PATHS = ("/health",)


def routes(metrics: SidecarMetrics) -> list:
    """Starlette routes: GET /metrics (prometheus-client's ASGI app on the metrics' registry) and
    GET /health (JSON; 200 when the recorder can write, else 503; only the status to a request
    without the token, where a token is needed)."""
    async def health(request):
        status, body = metrics.health()
        if not request.scope.get(AUTHENTICATED, True):
            body = {"status": body["status"]}
        return Response(orjson.dumps(body) + b"\n", status_code=status, media_type="application/json",
                        headers={"cache-control": "no-store"})

    prometheus = make_asgi_app(registry=metrics.registry)

    async def scrape(scope, receive, send):
        await metrics.refresh_totals()
        await prometheus(scope, receive, send)

    return [
        Route("/metrics", _AsgiApp(scrape), methods=["GET", "HEAD"]),
        Route("/health", health, methods=["GET", "HEAD"]),
    ]


def metrics_app(metrics: SidecarMetrics):
    """/metrics and /health alone, as a Starlette app (a recorder without the web view)."""
    return Starlette(routes=routes(metrics))


async def sample_forever(metrics: SidecarMetrics, interval_s: float = 1.0) -> None:
    """Feed the events/s meter once a second until cancelled."""
    while True:
        metrics.sample()
        await asyncio.sleep(interval_s)


# -- structured logs -----------------------------------------------------------------------------

_STD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and every `extra=` field."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        out = {"ts": _utc(record), "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class TextFormatter(logging.Formatter):
    """One line a person reads: time, level, message, then every `extra=` field as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of text."""
        fields = " ".join(f"{k}={_text(v)}" for k, v in _fields(record).items() if v is not None)
        line = f"{_utc(record)} {record.levelname.lower():<7} {record.getMessage()}" + (f"  {fields}" if fields else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _utc(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> dict:
    return {k: v for k, v in record.__dict__.items() if k not in _STD_ATTRS and not k.startswith("_")}


def _text(value) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return text if text and " " not in text and '"' not in text else orjson.dumps(text).decode()


def configure_logging(level: str = "info", *, json_format: Optional[bool] = None, stream=None) -> None:
    """Send tracedb's logs to stderr: one JSON object per line for machines, or one line of text
    with the same fields for people. `json_format` None chooses by the stream: text on a
    terminal, JSON otherwise."""
    stream = stream or sys.stderr
    if json_format is None:
        json_format = not (hasattr(stream, "isatty") and stream.isatty())
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if json_format else TextFormatter())
    root = logging.getLogger("tracedb")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
