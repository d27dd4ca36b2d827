"""`tracedb serve`: a thin command over tracedb.sidecar."""

from __future__ import annotations

import os

import click

from tracedb.sidecar import protocol as P
from tracedb.sidecar.run import serve_forever
from tracedb.sidecar.server import ServerConfig
from tracedb.cli.main import config_of, read_token
from tracedb.cli.sidecar_settings import host_names, sidecar_file_settings

def parse_tcp(text: str) -> tuple[str, int]:
    """"HOST:PORT", ":PORT" or "PORT" (host 127.0.0.1); IPv6 as "[::1]:PORT"."""
    text = text.strip()
    if text.isdigit():
        return parse_tcp(f"127.0.0.1:{text}")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"{text!r}: write HOST:PORT, e.g. 127.0.0.1:{P.DEFAULT_TCP_PORT}")
    host = host.strip("[]") or "127.0.0.1"
    if int(port) > 65535:
        raise click.BadParameter(f"{text!r}: a port is 0 to 65535")
    return host, int(port)


@click.command()
@click.option("--socket", "socket_path", envvar="TRACEDB_SOCKET", type=click.Path(dir_okay=False),
              help="Unix socket to listen on (env TRACEDB_SOCKET; default <data dir>/tracedb.sock).")
@click.option("--tcp", help="Also listen on TCP, HOST:PORT (loopback unless --allow-remote).")
@click.option("--allow-remote", is_flag=True, default=None,
              help="Allow a non-loopback --tcp address; a bearer token is then required.")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="File holding the bearer token of the TCP, OTLP and HTTP listeners (or env "
              "TRACEDB_TOKEN; default: the data directory's file token, made at the first start).")
@click.option("--trust-local-users", is_flag=True, default=None,
              help="Loopback TCP, OTLP and HTTP take no token: every user of this machine may record "
              "and read (the Unix socket is the owner's alone either way).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME", callback=host_names,
              help="A Host name the HTTP listeners answer to besides 127.0.0.1, localhost and [::1] "
              "(repeatable).")
@click.option("--http-port", type=click.IntRange(0, 65535),
              help="Serve the web view (as `tracedb ui`), /metrics and /health on http://127.0.0.1:PORT "
              "(off by default; the token guards all but /health).")
@click.option("--http-host", help="Address for --http-port (default 127.0.0.1; another needs --allow-remote "
              "and a token, which every request must then carry).")
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="The older name of --http-port: the same server, the web view included.")
@click.option("--otlp-port", type=click.IntRange(0, 65535),
              help="Also receive OpenTelemetry traces (OTLP/HTTP, POST /v1/traces) on this port; "
              "point an agent at it with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:PORT/v1/traces "
              "and the token in OTEL_EXPORTER_OTLP_HEADERS, as the log says (needs the otel extra; docs/otel.md).")
@click.option("--otlp-host", help="Address for --otlp-port (default 127.0.0.1; another needs --allow-remote and a token).")
@click.option("--max-frame-bytes", type=click.IntRange(1, P.MAX_FRAME_BYTES_LIMIT),
              help=f"Largest request line (default {P.DEFAULT_MAX_FRAME_BYTES}).")
@click.option("--max-connections", type=click.IntRange(1),
              help=f"Concurrent client connections on the socket, and on the TCP port, each (default "
              f"{P.DEFAULT_MAX_CONNECTIONS}).")
@click.option("--connection-idle-timeout", type=click.FloatRange(0, min_open=True), metavar="SECONDS",
              help="Close a client connection with nothing in flight that sent nothing for this long "
              f"(default {P.DEFAULT_CONNECTION_IDLE_TIMEOUT_S:g}); clients reconnect.")
@click.option("--otlp-max-connections", type=click.IntRange(1),
              help=f"Concurrent connections on the OTLP port (default {P.DEFAULT_OTLP_MAX_CONNECTIONS}).")
@click.option("--http-max-connections", type=click.IntRange(1),
              help=f"Concurrent connections on the HTTP port (default {P.DEFAULT_HTTP_MAX_CONNECTIONS}).")
@click.option("--max-inflight", "max_inflight_requests", type=click.IntRange(1),
              help=f"Requests in flight per connection before it is not read (default {P.DEFAULT_MAX_INFLIGHT_REQUESTS}).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), help="Default info.")
@click.option(
    "--log-format", type=click.Choice(["auto", "json", "text"]), default="auto", show_default=True,
    help="Logs on stderr: text with key=value fields for people, JSON lines for machines; auto picks text on a terminal.",
)
@click.option("--compact-in-process", is_flag=True,
              help="Compact in a thread of the recorder instead of a child process (slower ingest).")
@click.pass_context
def serve(ctx, socket_path, tcp, allow_remote, token_file, trust_local_users, allowed_hosts, http_port, http_host, metrics_port,
          otlp_port, otlp_host, max_frame_bytes, max_connections, connection_idle_timeout, otlp_max_connections,
          http_max_connections, max_inflight_requests, log_level, log_format, compact_in_process):
    """Run the sidecar recorder: agents record through it over a Unix socket.

    Recovers the data directory first (executions interrupted by a crash become incomplete),
    then serves the wire protocol of docs/protocol.md, compacting into SQLite in the background
    (in a child process, so that compaction never delays an acknowledgment).
    SIGTERM or Ctrl-C: stops accepting, answers every pending request, exits 0.

    The Unix socket is the owner's alone (0600). TCP, OTLP and HTTP listeners need a bearer
    token, kept in the data directory's file `token` (made at the first start, 0600), where
    the owner's client and commands find it (docs/security.md).

    \b
    Example:
      tracedb --data-dir ./.tracedb serve --http-port 9464   # web view, /metrics, /health
      tracedb serve --otlp-port 4318    # agents: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces
    """
    if http_port is not None and metrics_port is not None and http_port != metrics_port:
        raise click.UsageError("--metrics-port is the older name of --http-port: give one of them")
    cfg = config_of(ctx)
    # The compactor's CPU would otherwise come out of the interpreter that acknowledges events.
    cfg = cfg.replace(compact_worker=not compact_in_process)
    file = sidecar_file_settings(cfg)
    tcp = tcp or file.get("tcp")
    host, port = parse_tcp(tcp) if tcp else (None, None)
    scfg = ServerConfig(
        socket_path=socket_path or file.get("socket") or os.path.join(cfg.data_dir, P.DEFAULT_SOCKET_NAME),
        tcp_host=host,
        tcp_port=port,
        allow_remote=bool(allow_remote if allow_remote is not None else file.get("allow_remote", False)),
        token=read_token(token_file or file.get("token_file")),
        token_file=token_file or file.get("token_file"),
        trust_local_users=bool(trust_local_users if trust_local_users is not None
                               else file.get("trust_local_users", False)),
        metrics_port=next((p for p in (http_port, metrics_port, file.get("http_port"), file.get("metrics_port"))
                           if p is not None), None),
        max_frame_bytes=max_frame_bytes or file.get("max_frame_bytes", P.DEFAULT_MAX_FRAME_BYTES),
        max_connections=max_connections or file.get("max_connections", P.DEFAULT_MAX_CONNECTIONS),
        max_inflight_requests=max_inflight_requests
        or file.get("max_inflight_requests", P.DEFAULT_MAX_INFLIGHT_REQUESTS),
        max_inflight_bytes=file.get("max_inflight_bytes", P.DEFAULT_MAX_INFLIGHT_BYTES),
        first_frame_timeout_s=file.get("first_frame_timeout_s", P.DEFAULT_FIRST_FRAME_TIMEOUT_S),
        connection_idle_timeout_s=connection_idle_timeout
        or file.get("connection_idle_timeout_s", P.DEFAULT_CONNECTION_IDLE_TIMEOUT_S),
        otlp_max_connections=otlp_max_connections or file.get("otlp_max_connections", P.DEFAULT_OTLP_MAX_CONNECTIONS),
        http_max_connections=http_max_connections or file.get("http_max_connections", P.DEFAULT_HTTP_MAX_CONNECTIONS),
        http_header_timeout_s=file.get("http_header_timeout_s", P.DEFAULT_HTTP_HEADER_TIMEOUT_S),
        http_idle_timeout_s=file.get("http_idle_timeout_s", P.DEFAULT_HTTP_IDLE_TIMEOUT_S),
        drain_timeout_s=file.get("drain_timeout_s", 10.0),
        data_dir=cfg.data_dir,
    )
    if otlp_port is None:
        otlp_port = file.get("otlp_port")
    otlp = None
    if otlp_port is not None:
        otlp = {"host": otlp_host or file.get("otlp_host") or "127.0.0.1", "port": otlp_port}
    elif otlp_host:
        raise click.UsageError("--otlp-host needs --otlp-port")
    serve_forever(cfg, scfg, log_level=log_level or file.get("log_level", "info"), log_json={"json": True, "text": False}.get(log_format),
                  otlp=otlp, http_host=http_host or file.get("http_host") or "127.0.0.1",
                  allowed_hosts=allowed_hosts or tuple(file.get("allowed_hosts", ())))
