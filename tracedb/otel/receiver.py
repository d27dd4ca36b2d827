"""OTLP/HTTP trace receiver: `POST /v1/traces`, run by `tracedb serve --otlp-port PORT`.

Bodies are protobuf (`application/x-protobuf`) or OTLP/JSON (`application/json`), optionally
gzip-compressed, decoded with the official `opentelemetry-proto` messages. The answer follows the
OTLP/HTTP specification:

- 200 with an `ExportTraceServiceResponse`, sent only once every span of the request is durable
  in the WAL; spans refused (bad ids, a trace already closed) are counted in its
  `partial_success` with a message;
- 400 for a body that cannot be decoded (garbage, truncated, broken gzip), 413 for one above the
  size limit (compressed or not), 415 for another content type, 401 for a missing or wrong bearer
  token, 403 for a Host header that names another host: an exporter does not retry these;
- 429 when too many requests are in flight and 503 while the recorder shuts down, both with
  `Retry-After`, which exporters honour.

Error bodies are a `google.rpc.Status` (code, message) in the request's encoding.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import zlib
from typing import Callable, Iterable, Optional

import orjson
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from tracedb.sidecar.asgi import HostCheck, HttpEndpoint, bearer_token, is_loopback
from tracedb.sidecar.protocol import DEFAULT_OTLP_MAX_CONNECTIONS
from tracedb.errors import ConfigError, RecordingFailedError, StoreClosedError, TraceDBError
from tracedb.program import extra_hint
from tracedb.otel import mapping as M
from tracedb.otel.ingest import SpanIngest

log = logging.getLogger("tracedb.otel")

TRACES_PATH = "/v1/traces"
DEFAULT_MAX_BODY_BYTES = 16 << 20  # after decompression
DEFAULT_MAX_INFLIGHT_REQUESTS = 64
RETRY_AFTER_S = 1
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
INSTALL_HINT = extra_hint("otel")

# google.rpc.Code numbers for the Status body.
_INVALID_ARGUMENT = 3
_RESOURCE_EXHAUSTED = 8
_UNAVAILABLE = 14
_UNAUTHENTICATED = 16


# The `otel` extra's protocol package: checked by `require_otel`, before anything listens.
try:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
except ImportError as e:
    trace_service_pb2 = None
    _MISSING = e.name or str(e)


def require_otel() -> None:
    """Raise ConfigError (with the install hint) unless the `otel` extra is installed."""
    if trace_service_pb2 is None:
        raise ConfigError(
            f"the OTLP receiver needs the OpenTelemetry protocol package ({_MISSING})",
            hint=INSTALL_HINT,
        )


def check_listen(host: str, allow_remote: bool, token: Optional[str]) -> None:
    """The TCP listener's rule: loopback, or `--allow-remote` with a bearer token."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ConfigError(
            f"refusing to serve OTLP on non-loopback address {host}",
            hint="pass --allow-remote together with a token (TRACEDB_TOKEN or --token-file)",
        )
    if not token:
        raise ConfigError(
            f"serving OTLP on {host} needs a bearer token",
            hint="set TRACEDB_TOKEN or pass --token-file; exporters send it with "
            "OTEL_EXPORTER_OTLP_HEADERS='Authorization=Bearer <token>'",
        )


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _status_body(code: int, message: str, as_json: bool) -> bytes:
    if as_json:
        return orjson.dumps({"code": code, "message": message})
    msg = message.encode("utf-8")
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(msg)) + msg


class BodyError(Exception):
    """A request body refused before decoding: (HTTP status, message)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def gunzip(body: bytes, limit: int) -> bytes:
    """Decompress a gzip body, refusing one that inflates beyond `limit` (413) or is broken (400)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as e:
        raise BodyError(400, f"the gzip body is broken: {e}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise BodyError(413, f"the body inflates beyond the limit of {limit} bytes")
    if not d.eof:
        raise BodyError(400, "the gzip body is truncated")
    return out


class Receiver:
    """The Starlette app (`.app`) behind `POST /v1/traces`, recording into a SpanIngest."""

    def __init__(
        self,
        ingest: SpanIngest,
        *,
        token: Optional[str] = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_inflight_requests: int = DEFAULT_MAX_INFLIGHT_REQUESTS,
        draining: Callable[[], bool] = lambda: False,
    ):
        require_otel()
        self._pb = trace_service_pb2
        self.ingest = ingest
        self.token = token
        self.max_body_bytes = max_body_bytes
        self.max_inflight = max_inflight_requests
        self.draining = draining
        self.inflight = 0
        self.app = Starlette(routes=[Route(TRACES_PATH, self.traces, methods=["POST"])])

    async def traces(self, request):
        """POST /v1/traces."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        as_json = ctype == JSON
        media = JSON if as_json else PROTOBUF

        def refuse(status: int, code: int, message: str, retry: bool = False) -> Response:
            headers = {"Retry-After": str(RETRY_AFTER_S)} if retry else None
            return Response(_status_body(code, message, as_json), status_code=status, media_type=media, headers=headers)

        if self.token is not None:
            given = bearer_token(request.headers) or ""
            if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.token.encode()):
                return refuse(401, _UNAUTHENTICATED, "missing or wrong bearer token: send it with "
                              "OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20<token> (the token "
                              "is in the recorder's data directory, file token)")
        if ctype not in (JSON, PROTOBUF):
            return refuse(415, _INVALID_ARGUMENT, f"content type must be {PROTOBUF} or {JSON}, not {ctype or 'none'!r}")
        if self.draining():
            return refuse(503, _UNAVAILABLE, "the recorder is shutting down; retry later", retry=True)
        if self.inflight >= self.max_inflight:
            return refuse(429, _RESOURCE_EXHAUSTED, f"too many requests in flight (limit {self.max_inflight})", retry=True)
        self.inflight += 1
        try:
            try:
                body = await self._body(request)
                # Off the loop: parsing hundreds of spans would hold up the recorder's other clients.
                spans, rejected = await asyncio.get_running_loop().run_in_executor(None, self._decode, body, as_json)
            except BodyError as e:
                return refuse(e.status, _INVALID_ARGUMENT, e.message)
            try:
                result = await self.ingest.record(spans)
            except (RecordingFailedError, StoreClosedError) as e:
                return refuse(503, _UNAVAILABLE, f"the recorder cannot record now: {e}", retry=True)
            except TraceDBError as e:  # the database behind a lookup: nothing was staged
                log.warning("otlp request failed: %s", e)
                return refuse(503, _UNAVAILABLE, f"the recorder cannot record now: {e}", retry=True)
            result.rejected[:0] = rejected
        finally:
            self.inflight -= 1
        return Response(self._answer(result, as_json), status_code=200, media_type=media)

    async def _body(self, request) -> bytes:
        limit = self.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise BodyError(413, f"the body of {length} bytes exceeds the limit of {limit} bytes")
        chunks = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyError(413, f"the body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        body = b"".join(chunks)
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding == "gzip":
            return gunzip(body, limit)
        if encoding not in ("identity", ""):
            raise BodyError(415, f"content encoding {encoding!r} is not supported (use gzip or none)")
        return body

    def _decode(self, body: bytes, as_json: bool) -> tuple[list, list[str]]:
        if as_json:
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError as e:
                raise BodyError(400, f"the body is not JSON: {e}") from None
            try:
                return M.spans_from_json(doc)
            except ValueError as e:
                raise BodyError(400, f"the body is not an OTLP/JSON trace export: {e}") from None
        req = self._pb.ExportTraceServiceRequest()
        try:
            req.ParseFromString(body)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, or a RuntimeWarning-as-error
            raise BodyError(400, f"the body is not an OTLP protobuf trace export: {e}") from None
        return M.spans_from_proto(req)

    def _answer(self, result, as_json: bool) -> bytes:
        n = result.rejected_count
        if as_json:
            if not n:
                return b"{}"
            return orjson.dumps({"partialSuccess": {"rejectedSpans": str(n), "errorMessage": result.message()}})
        resp = self._pb.ExportTraceServiceResponse()
        if n:
            resp.partial_success.rejected_spans = n
            resp.partial_success.error_message = result.message()
        return resp.SerializeToString()


class OtlpEndpoint:
    """The receiver's HTTP server on the loop; `close()` stops it and releases its lookups."""

    def __init__(self, http, receiver: Receiver):
        self.http = http
        self.receiver = receiver

    @property
    def port(self) -> int:
        return self.http.port

    async def close(self) -> None:
        await self.http.close()
        self.receiver.ingest.close()


async def start_receiver(store, *, host: str = "127.0.0.1", port: int = 0, token: Optional[str] = None,
                         draining: Callable[[], bool] = lambda: False,
                         allowed_hosts: Optional[Iterable[str]] = None, connection_limits: Optional[dict] = None,
                         **limits):
    """Serve OTLP/HTTP for `store` on the running loop; returns (OtlpEndpoint, Receiver).
    With `token`, every request must carry it; with `allowed_hosts`, one naming another Host gets
    403. `await endpoint.close()` stops it. A busy port raises OSError. `connection_limits` are
    HttpEndpoint's (max_connections, header_timeout_s, idle_timeout_s); the OTLP port's cap is
    DEFAULT_OTLP_MAX_CONNECTIONS unless given."""
    receiver = Receiver(SpanIngest(store), token=token, draining=draining, **limits)
    app = receiver.app if allowed_hosts is None else HostCheck(receiver.app, allowed_hosts)
    http = HttpEndpoint(app, host=host, port=port, name="otlp",
                        **{"max_connections": DEFAULT_OTLP_MAX_CONNECTIONS, **(connection_limits or {})})
    try:
        await http.start()
    except BaseException:
        receiver.ingest.close()
        raise
    return OtlpEndpoint(http, receiver), receiver
