"""The `tracedb` group: global options, error handling, and what every command module shares.

Exit codes: 0 ok, 1 other error, 2 usage (an ambiguous execution id prefix too), 3 not found,
4 integrity failure, 5 data directory in use, 6 not replayable (`tracedb replay`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
from datetime import datetime, timezone
from typing import Optional

import click
import orjson

from tracedb.config import DEFAULT_DATA_DIR, Config, find_data_dir, load_config, parse_duration_s
from tracedb.errors import ConfigError, TraceDBError
from tracedb.reads.paging import decode_cursor
from tracedb.program import as_invoked

# The command line's lazy seam: the group knows each command by name, the module that defines it
# and its short help (the first paragraph of its help; a test holds the two equal). A command's
# module, and the library it imports at its top (SQLAlchemy, the models, the WAL, the server), is
# imported when that command is resolved: `tracedb --help` lists the commands from this table.
COMMANDS: dict[str, tuple[str, str]] = {
    "backup": ("tracedb.cli.maintenance:backup_command",
               "Copy the data directory into DEST (new or empty), online, next to a running recorder."),
    "compact": ("tracedb.cli.maintenance:compact",
                "Apply every WAL record to the database now (a running recorder does this itself)."),
    "demo": ("tracedb.cli.demo:demo", "Record demo agent executions through the sidecar; one crashes midway."),
    "export": ("tracedb.cli.interop:export_command",
               "Write executions as JSON, in tracedb's record shape, IntentusNet's, or OTLP/JSON."),
    "fork": ("tracedb.cli.maintenance:fork_command",
             "Start a new execution sharing the parent's events up to --at, with its lineage."),
    "import": ("tracedb.cli.maintenance:import_group", "Bring execution records recorded by other runtimes into tracedb."),
    "inspect": ("tracedb.cli.read:inspect", "List executions (--list), or show one execution's state."),
    "invalidate": ("tracedb.cli.maintenance:invalidate",
                   "Mark an execution invalidated: not replayable, manually_invalidated."),
    "migrate": ("tracedb.cli.maintenance:migrate",
                "Create or upgrade the database schema (opening a store does this too)."),
    "pin": ("tracedb.cli.maintenance:pin", "Keep a trace forever: prune never deletes a pinned trace."),
    "prune": ("tracedb.cli.maintenance:prune",
              "Delete terminal traces older than N (not pinned, not the parent of a fork), reclaim space."),
    "recover": ("tracedb.cli.maintenance:recover",
                "Repair a torn WAL tail, compact, mark unfinished executions incomplete."),
    "replay": ("tracedb.cli.replay:replay_command",
               "Return an execution's recorded final response exactly; no agent or model is called."),
    "restore": ("tracedb.cli.maintenance:restore_command",
                "Make the data directory (--data-dir, which must be new or empty) from a backup."),
    "serve": ("tracedb.cli.serve:serve", "Run the sidecar recorder: agents record through it over a Unix socket."),
    "stats": ("tracedb.cli.read:stats",
              "Counts, failure rate, p50/p95/p99 duration, tokens and cost of executions, computed in SQL."),
    "ui": ("tracedb.cli.ui:ui", "Browse executions in a web page: the list, timelines, payloads, diffs and forks."),
    "unpin": ("tracedb.cli.maintenance:unpin", "Let prune delete a trace again once it is old enough."),
    "verify": ("tracedb.cli.maintenance:verify", "Check everything; exit 4 on any damage."),
    "wal": ("tracedb.cli.maintenance:wal_group", "The write-ahead log itself."),
}
TRACE_COMMANDS: dict[str, tuple[str, str]] = {
    "diff": ("tracedb.cli.replay:diff_command", "Show two traces side by side, up to and at their first divergent step."),
    "get": ("tracedb.cli.read:trace_get", "Print an execution's whole record, in IntentusNet's ExecutionRecord shape."),
    "lineage": ("tracedb.cli.read:trace_lineage",
                "Show what an execution was forked from, up to the first one, and the forks made from it."),
}


class LazyGroup(click.Group):
    """A group whose commands are imported when one is resolved (click's lazy group pattern):
    `lazy` maps a command's name to ("module:attribute", its short help)."""

    def __init__(self, *args, lazy: Optional[dict[str, tuple[str, str]]] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> Optional[click.Command]:
        if name not in self.commands and name in self.lazy:
            module, _, attr = self.lazy[name][0].partition(":")
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return self.commands.get(name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click's own resolves every command for its short help: this lists the table's instead.
        listed = [(name, self.commands.get(name) or click.Command(name, help=self.lazy[name][1]))
                  for name in self.list_commands(ctx)]
        listed = [(name, cmd) for name, cmd in listed if not cmd.hidden]
        if listed:
            limit = formatter.width - 6 - max(len(name) for name, _ in listed)
            with formatter.section("Commands"):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in listed])


class CommandError(click.ClickException):
    """An error as the user sees it: `error: <message>`, `hint: <hint>`, a stable exit code; with
    --json, one JSON object {"error": {message, hint, exit_code}} on stderr instead. The commands
    they quote name this program as it was started (`tracedb.program`)."""

    def __init__(self, message: str, hint: Optional[str], code: int, *, as_json: bool = False):
        super().__init__(message)
        self.hint = hint
        self.exit_code = code
        self.as_json = as_json

    def show(self, file=None) -> None:
        if self.as_json:
            doc = {"error": {"message": as_invoked(self.message), "hint": as_invoked(self.hint), "exit_code": self.exit_code}}
            click.echo(orjson.dumps(doc).decode(), err=True)
            return
        click.echo(f"error: {as_invoked(self.message)}", err=True)
        if self.hint:
            click.echo(f"hint: {as_invoked(self.hint)}", err=True)


class TraceDBGroup(LazyGroup):
    """Turns tracedb's and the WAL's known errors into a message, a hint and a stable exit code."""


    def make_context(self, info_name, args, parent=None, **extra):
        # The global options are parsed here, before `invoke`: their errors too are one error
        # line and one hint, not click's usage block. (No arguments at all shows the help.)
        given = tuple(args)
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as e:
            raise CommandError(e.format_message(), f"see `{info_name} --help`", e.exit_code,
                               as_json="--json" in given) from None

    def parse_args(self, ctx, args):
        ctx.meta["tracedb.args"] = tuple(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            # A bad argument or option value: one error line and one hint, like every failure.
            where = e.ctx.command_path if e.ctx is not None else ctx.command_path
            raise CommandError(e.format_message(), f"see `{where} --help`", e.exit_code,
                               as_json=_json_errors(ctx)) from None
        except click.ClickException:
            raise
        except BrokenPipeError:
            # The reader went away (`tracedb inspect --list | head -1`): stop quietly with
            # success, as other Unix tools do, and keep Python from failing to flush at exit.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            ctx.exit(0)
        except Exception as e:
            # Lazy seam: the report of a failure loads SQLAlchemy, which a read of a SQLite file does without.
            from tracedb.maintenance import admin

            failure = admin.failure_of(e, (ctx.obj or {}).get("config"))
            if failure is None:
                raise
            raise CommandError(failure.message, failure.hint, failure.exit_code, as_json=_json_errors(ctx)) from None


def _json_errors(ctx: click.Context) -> bool:
    # A usage error can come before --json is parsed: look at the command line as well.
    return bool(ctx.meta.get("tracedb.json_errors")) or "--json" in ctx.meta.get("tracedb.args", ())


def config_of(ctx: click.Context) -> Config:
    """The resolved configuration (flags > env > file > defaults)."""
    return ctx.find_root().obj["config"]


def emit_json(value, compact: bool) -> None:
    """Indented JSON, or with `compact` one line with sorted keys (what --json prints)."""
    opts = orjson.OPT_SORT_KEYS if compact else orjson.OPT_INDENT_2
    click.echo(orjson.dumps(value, option=opts).decode())


def json_option(help_text: str = "Machine-readable JSON (errors too, on stderr)."):
    """The `--json` flag, passed as `as_json`. Given, an error is reported as JSON as well."""

    def remember(ctx: click.Context, _param, value: bool) -> bool:
        if value:
            ctx.find_root().meta["tracedb.json_errors"] = True
        return value

    return click.option("--json", "as_json", is_flag=True, help=help_text, callback=remember)


def execution_id_argument(name: str = "execution_id", metavar: str = "ID", **kw):
    """An execution id argument: a whole id or a unique prefix of one, as git takes short hashes."""
    if kw.get("required") is False:
        metavar = f"[{metavar}]"
    return click.argument(name, metavar=metavar, callback=non_empty_ids, **kw)


def non_empty_ids(_ctx, _param, value):
    """An argument callback: refuses an empty execution id (exit 2)."""
    # An empty id (a shell variable that was never set) is a mistake in the command, not an
    # execution that is missing.
    if isinstance(value, str) and not value.strip():
        raise click.BadParameter("is empty: give an execution id, or a unique prefix of one")
    if isinstance(value, tuple) and any(not v.strip() for v in value):
        raise click.BadParameter("an id is empty: give execution ids, or unique prefixes of them")
    return value


@contextlib.contextmanager
def progress_bar(label: str):
    """A progress bar on a terminal, nothing otherwise; yields a progress(done, total) callback."""
    if not sys.stderr.isatty():
        yield None
        return
    state: dict = {}

    def update(done: int, total: int) -> None:
        bar = state.get("bar")
        if bar is None:
            bar = state["bar"] = click.progressbar(length=max(total, 1), label=label, file=sys.stderr)
            bar.__enter__()
        bar.length = max(total, done, 1)
        bar.update(done - bar.pos)

    try:
        yield update
    finally:
        if "bar" in state:
            state["bar"].__exit__(None, None, None)


class TimeParam(click.ParamType):
    """An ISO time (2024-01-15T10:30:00Z; no zone means UTC) or an age back from now (2h, 7d)."""

    name = "TIME"

    def convert(self, value, param, ctx) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            try:
                return datetime.fromtimestamp(time.time() - parse_duration_s(value), tz=timezone.utc)
            except TraceDBError:
                self.fail(f"{value!r}: give an ISO time (2024-01-15T10:30:00Z) or an age (2h, 7d)", param, ctx)
        return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def read_token(token_file: Optional[str]) -> Optional[str]:
    """The bearer token from `token_file`, else TRACEDB_TOKEN, else None (serve, ui)."""
    if not token_file:
        return os.environ.get("TRACEDB_TOKEN") or None
    try:
        with open(token_file, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise ConfigError(f"cannot read the token file {token_file}: {e.strerror}") from None
    if not token:
        raise ConfigError(f"the token file {token_file} is empty")
    return token


class DurationParam(click.ParamType):
    """An age: 30d, 12h, 90m, 45s, 2w, or a bare number of days."""

    name = "AGE"

    def convert(self, value, param, ctx) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration_s(value)
        except TraceDBError as e:
            self.fail(f"{e.message} ({e.hint})" if e.hint else e.message, param, ctx)


class CursorParam(click.ParamType):
    """A page cursor printed with the previous page of a listing."""

    name = "CURSOR"

    def convert(self, value, param, ctx) -> str:
        try:
            decode_cursor(value)
        except TraceDBError as e:
            self.fail(e.message, param, ctx)
        return value


def format_bytes(n: int) -> str:
    """A byte count as a person reads it: 512 B, 40.0 KiB, 39.1 MiB, 2.3 GiB."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


@click.group(cls=TraceDBGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tracedb", prog_name="tracedb", message="%(prog)s %(version)s")
@click.option(
    "--data-dir",
    envvar="TRACEDB_DATA_DIR",
    # Not checked for readability here: the command that cannot read it says which file, and
    # what to run.
    type=click.Path(file_okay=False, readable=False),
    default=None,
    help="Data directory holding traces.db and wal/ (env TRACEDB_DATA_DIR; default: the nearest "
    ".tracedb in the working directory or its parents, else ./.tracedb).",
)
@click.option(
    "--config",
    "config_path",
    envvar="TRACEDB_CONFIG",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML configuration file (env TRACEDB_CONFIG); see config/tracedb.toml.",
)
@click.option(
    "--db",
    "db_url",
    envvar="TRACEDB_DB_URL",
    default=None,
    metavar="URL",
    help="Database URL, SQLAlchemy form (postgresql+psycopg://user@host/db) for a fleet's shared "
    "database (env TRACEDB_DB_URL; default: the SQLite file in the data directory).",
)
@click.pass_context
def main(ctx: click.Context, data_dir: Optional[str], config_path: Optional[str], db_url: Optional[str]) -> None:
    """Record, inspect and maintain AI agent execution traces.

    Commands that take an execution id take a unique prefix of one too.

    \b
    Example:
      tracedb --data-dir /var/lib/tracedb inspect --list
      tracedb --db postgresql+psycopg://tracedb@db.internal/traces inspect --list
    """
    if data_dir is not None and not data_dir.strip():
        if ctx.get_parameter_source("data_dir") is not click.core.ParameterSource.ENVIRONMENT:
            raise click.BadParameter("is empty: give a directory", param_hint="--data-dir")
        data_dir = None  # TRACEDB_DATA_DIR set to nothing means unset, as the other variables do
    try:
        cfg = load_config(config_path, overrides={"data_dir": data_dir, "db_url": db_url})
    except TraceDBError as e:
        raise CommandError(e.message, e.hint, e.exit_code) from None
    if data_dir is not None and cfg.db_path and os.path.dirname(cfg.db_path) != data_dir:
        cfg = cfg.replace(db_path="")
    if data_dir is None and cfg.data_dir == DEFAULT_DATA_DIR:
        # No data directory named anywhere: the nearest .tracedb up from here, as git finds .git.
        found = find_data_dir(os.getcwd())
        if found is not None and os.path.abspath(found) != os.path.abspath(DEFAULT_DATA_DIR):
            cfg = cfg.replace(data_dir=found)
    ctx.ensure_object(dict)
    ctx.obj["config"] = cfg


@main.group(cls=LazyGroup, lazy=TRACE_COMMANDS)
def trace():
    """Whole execution records.

    \b
    Example:
      tracedb trace get exec-a1b2c3d4
    """
