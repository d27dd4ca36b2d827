"""`tracedb ui`: a thin command over tracedb.web."""

from __future__ import annotations

import asyncio

import click

from tracedb import reads
from tracedb.program import as_invoked
from tracedb.sidecar import protocol as P
from tracedb.sidecar.asgi import is_loopback
from tracedb.web.run import check_listen, serve_ui, view_token
from tracedb.cli.main import config_of, emit_json, json_option, read_token
from tracedb.cli.sidecar_settings import host_names, sidecar_file_settings

DEFAULT_UI_PORT = 8470


def _recovery_note(cfg) -> str | None:
    """What the view shows beyond the database while no recorder runs: WAL records not
    compacted, executions nobody will finish (read as incomplete, as the read commands do)."""
    with reads.Reader.open(cfg) as reader:  # a missing store: exit 3 here, before anything listens
        return reader.pending.note()


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --allow-remote and a token.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_UI_PORT, show_default=True,
              help="Port to listen on (0 picks a free one).")
@click.option("--allow-remote", is_flag=True,
              help="Allow a non-loopback --host; every request must then carry the bearer token.")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="File holding the bearer token (or env TRACEDB_TOKEN; default: the data "
              "directory's file token, made at the first start).")
@click.option("--trust-local-users", is_flag=True, default=None,
              help="On a loopback --host, take no token: every user of this machine may read the view.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME", callback=host_names,
              help="A Host name to answer to besides 127.0.0.1, localhost and [::1] (repeatable).")
@click.option("--max-connections", type=click.IntRange(1), default=P.DEFAULT_HTTP_MAX_CONNECTIONS, show_default=True,
              help="Concurrent connections; past it, a connection that has sent no request yet is closed "
              "to make room, or the newcomer is answered 503.")
@click.option("--data-dir", "data_dir", type=click.Path(file_okay=False), default=None,
              help="The data directory to show (the same as the global --data-dir).")
@click.option("--db", "db_url", metavar="URL", default=None,
              help="A fleet's PostgreSQL database to show (the same as the global --db).")
@json_option("Print the address as one JSON line ({\"url\": ...}); errors as JSON too.")
@click.pass_context
def ui(ctx, host, port, allow_remote, token_file, trust_local_users, allowed_hosts, max_connections, data_dir, db_url, as_json):
    """Browse executions in a web page: the list, timelines, payloads, diffs and forks.

    Failed executions show in red with their error; the list has outcome, model, tokens and cost
    columns and filters; an execution that came with nesting (OpenTelemetry, the Agents SDK)
    has its span tree; /overview draws what `tracedb stats` computes, per day and by intent and
    model.

    Read-only: it reads the store next to a running recorder (`tracedb serve`) and never
    writes to it. With no recorder running it also shows what only the WAL holds (executions left
    running read as incomplete), as the read commands do. Prints the address to open; Ctrl-C (or SIGTERM) stops it. A running execution's
    new events appear on its page as they are recorded.

    The address carries the access token once (?token=); the first visit keeps it in a
    cookie. The token is the data directory's file `token`, made at the first start.

    \b
    Example:
      tracedb ui                                   # then open the address it prints
      tracedb ui --db postgresql+psycopg://tracedb@db.internal/traces --port 0
    """
    cfg = config_of(ctx)
    if data_dir is not None:
        cfg = cfg.replace(data_dir=data_dir, db_path="")
    if db_url is not None:
        cfg = cfg.replace(db_url=db_url)
    file = sidecar_file_settings(cfg)  # the recorder's two keys that are the view's too
    if trust_local_users is None:
        trust_local_users = file.get("trust_local_users", False)
    allowed_hosts = allowed_hosts or tuple(file.get("allowed_hosts", ()))
    token = read_token(token_file)
    check_listen(host, allow_remote=allow_remote, token=token)
    note = _recovery_note(cfg)  # a missing store exits 3 here: no token is made for it
    if note:
        click.echo(as_invoked(note), err=True)
    if trust_local_users and is_loopback(host):
        token = None
    elif token is None:
        token = view_token(cfg)

    def listening(url: str) -> None:
        if as_json:
            emit_json({"url": url}, True)
        else:
            click.echo(f"tracedb ui: {url}  (read-only; Ctrl-C stops it)")
        click.get_text_stream("stdout").flush()

    asyncio.run(serve_ui(cfg, host=host, port=port, token=token, allowed_hosts=allowed_hosts,
                         on_listening=listening, max_connections=max_connections))
