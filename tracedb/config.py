"""Configuration: defaults, then a TOML file, then TRACEDB_* environment variables, then flags.

`config/tracedb.toml` documents every key. Three older variable names are accepted as aliases:
TRACE_STORAGE_PATH (the data directory, or the SQLite file inside it when it ends in `.db`),
TRACE_RETENTION_DAYS and TRACING_ENABLED. A TRACEDB_* variable wins over its alias.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from tracedb.errors import ConfigError

DEFAULT_DATA_DIR = ".tracedb"
# With `[compaction] worker_process = "auto"`: the recording rate (WAL records/s, over a
# two-second window) from which compaction moves to a child process.
AUTO_WORKER_RATE = 5000
DB_FILE = "traces.db"
WAL_DIR = "wal"
# The bearer token of the recorder's TCP, OTLP and HTTP listeners, made by the first one that
# needs it; the owner's own tools read it from here (docs/security.md).
TOKEN_FILE = "token"


@dataclass(frozen=True)
class Config:
    """Every setting of the store. Build one with `load_config`; `replace()` for variations."""

    data_dir: str = DEFAULT_DATA_DIR
    # The SQLite file; empty means <data_dir>/traces.db.
    db_path: str = ""
    # A database URL in SQLAlchemy form (postgresql+psycopg://user@host/db) for a fleet's shared
    # database; empty means the SQLite file above. The WAL stays in data_dir either way.
    db_url: str = ""
    enabled: bool = True
    # Identifies this data directory's WAL in a shared database; empty means generated once and
    # kept in <data_dir>/RECORDER_ID.
    recorder_id: str = ""
    wal_segment_size_bytes: int = 64 << 20
    # Zero-fill the next segment ahead of need, sized by the recording rate up to
    # wal_segment_size_bytes (wal/FORMAT.md, "Preallocation"): cheaper fsyncs.
    wal_preallocate: bool = True
    # asyncio callers (AsyncStore, `tracedb serve`): the event loop writes each group and starts
    # its fdatasync through Linux native AIO, instead of handing both to the flusher thread.
    wal_aio: bool = True
    compact_interval_ms: int = 200
    # Compact in a child process (its CPU then does not come out of the recorder's interpreter):
    # True, False, or "auto": in-process until the store records at least AUTO_WORKER_RATE
    # records/s on a machine of two cores or more, then in a child process (see
    # `Config.worker_mode`). `tracedb serve` turns it on unless started with --compact-in-process.
    compact_worker: bool | str = "auto"
    compact_batch_records: int = 20000
    idle_timeout_s: float = 3600.0
    retention_days: float = 30.0
    prune_batch_traces: int = 500
    busy_timeout_ms: int = 5000
    # Rewrite secrets before they are written ([redaction] in the file: keys, patterns, per-intent
    # rules; see tracedb.records.redaction). False records every value as given.
    redact: bool = True
    # Tables of the file this module does not own (e.g. [sidecar]), kept for their owners.
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def worker_mode(self) -> str:
        """Where compaction runs: "process" (a child process from the start), "thread" (a
        thread of this process, always) or "auto" (a thread until the recording rate reaches
        AUTO_WORKER_RATE records/s and the machine has two cores or more, then a child
        process: a burst of recording no longer shares one interpreter with its compaction,
        while a script that records a few executions never starts a process)."""
        value = self.compact_worker
        if not isinstance(value, bool):  # a Config built in code: read it as the file is read
            value = _coerce("compact_worker", value, "Config(compact_worker=...)")
        if value == "auto":
            return "auto"
        return "process" if value else "thread"

    @property
    def database(self) -> str:
        """Where the projection lives: `db_url` when set, else the SQLite file.

        `tracedb.projection.db.create_engine` takes either; `tracedb.projection.db.describe` prints it without a password.
        """
        return self.db_url or self.db_path or os.path.join(self.data_dir, DB_FILE)

    @property
    def sqlite_path(self) -> str:
        """The projection's database: the SQLite file, or `db_url` when one is set.

        The same as `database`; the older name is kept because callers test it for "://" to
        tell a local SQLite file from a server.
        """
        return self.database

    @property
    def wal_dir(self) -> str:
        """The WAL directory inside the data directory."""
        return os.path.join(self.data_dir, WAL_DIR)

    def replace(self, **changes) -> "Config":
        """A copy with some settings changed."""
        return dataclasses.replace(self, **changes)

    def redactor(self):
        """The `tracedb.records.redaction.Redactor` of the `[redaction]` table, or None when redaction is
        off (`redact` false, or no rule left)."""
        # Lazy seam: the rules load with the first recorder, not with every command's configuration.
        from tracedb.records.redaction import Redactor

        if not self.redact:
            return None
        return Redactor.from_table(self.extra.get("redaction"))


# (toml table, toml key) -> Config field. The environment variable is TRACEDB_<FIELD upper>.
_FILE_KEYS = {
    ("store", "data_dir"): "data_dir",
    ("store", "db_path"): "db_path",
    ("store", "db_url"): "db_url",
    ("store", "enabled"): "enabled",
    ("store", "recorder_id"): "recorder_id",
    ("store", "busy_timeout_ms"): "busy_timeout_ms",
    ("wal", "segment_size_bytes"): "wal_segment_size_bytes",
    ("wal", "preallocate"): "wal_preallocate",
    ("wal", "aio"): "wal_aio",
    ("compaction", "interval_ms"): "compact_interval_ms",
    ("compaction", "worker_process"): "compact_worker",
    ("compaction", "batch_records"): "compact_batch_records",
    ("recovery", "idle_timeout_s"): "idle_timeout_s",
    ("retention", "days"): "retention_days",
    ("retention", "batch_traces"): "prune_batch_traces",
}
_OWN_TABLES = {t for t, _ in _FILE_KEYS}
_FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.name != "extra"}
_ALIASES = {"TRACE_RETENTION_DAYS": "retention_days", "TRACING_ENABLED": "enabled"}


def _coerce(name: str, value: Any, source: str) -> Any:
    """Turn a file or environment value into the field's type, or raise ConfigError."""
    kind = type(_FIELDS[name].default)
    try:
        if name == "compact_worker":  # true, false or "auto"
            if isinstance(value, str) and value.strip().lower() == "auto":
                return "auto"
            kind = bool
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind is int:
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        wanted = 'true, false or "auto"' if name == "compact_worker" else f"a valid {kind.__name__}"
        raise ConfigError(
            f"{source}: {value!r} is not {wanted} for {name}",
            hint="see config/tracedb.toml for every key and its type",
        ) from None


def _from_file(path: str) -> tuple[dict, dict]:
    import tomllib  # lazy seam: only a file needs it, and every command reads the configuration

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist", hint="check --config / TRACEDB_CONFIG") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    values: dict = {}
    extra: dict = {}
    for table, body in data.items():
        if table == "redaction" and isinstance(body, dict) and "enabled" in body:
            # Its `enabled` is a setting (TRACEDB_REDACT); the rules stay with the table.
            body = dict(body)
            values["redact"] = _coerce("redact", body.pop("enabled"), f"{path} [redaction] enabled")
        if table not in _OWN_TABLES:
            extra[table] = body
            continue
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: [{table}] must be a table")
        for key, value in body.items():
            name = _FILE_KEYS.get((table, key))
            if name is None:
                raise ConfigError(
                    f"{path}: unknown key {key!r} in [{table}]",
                    hint="see config/tracedb.toml for every key",
                )
            values[name] = _coerce(name, value, f"{path} [{table}] {key}")
    return values, extra


# Settings whose empty value means something (no URL: the SQLite file); for every other one a
# variable set to nothing (`TRACEDB_DATA_DIR=`) means unset, not "the current directory".
_EMPTY_MEANS_EMPTY = frozenset({"db_url", "db_path"})


def _from_env(env: Mapping[str, str]) -> dict:
    values: dict = {}
    storage = env.get("TRACE_STORAGE_PATH")
    if storage:
        if storage.endswith(".db"):
            values["db_path"] = storage
            values["data_dir"] = os.path.dirname(storage) or "."
        else:
            values["data_dir"] = storage
    for alias, name in _ALIASES.items():
        if alias in env:
            values[name] = _coerce(name, env[alias], alias)
    for name in _FIELDS:
        var = "TRACEDB_" + name.upper()
        if var in env and (env[var].strip() or name in _EMPTY_MEANS_EMPTY):
            values[name] = _coerce(name, env[var], var)
    return values


def load_config(
    path: Optional[str] = None,
    *,
    env: Optional[Mapping[str, str]] = None,
    overrides: Optional[Mapping[str, Any]] = None,
) -> Config:
    """Defaults < file (`path`, else $TRACEDB_CONFIG) < environment < `overrides` (flags).

    `overrides` entries whose value is None are ignored, so unset flags fall through.
    """
    env = os.environ if env is None else env
    values: dict = {}
    extra: dict = {}
    path = path or env.get("TRACEDB_CONFIG") or None
    if path:
        values, extra = _from_file(path)
    values.update(_from_env(env))
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        if name not in _FIELDS:
            raise ConfigError(f"unknown setting {name!r}")
        values[name] = _coerce(name, value, f"setting {name}")
    cfg = Config(**values, extra=extra)
    _validate(cfg)
    return cfg


def _validate(cfg: Config) -> None:
    for name in ("compact_batch_records", "prune_batch_traces", "wal_segment_size_bytes"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{name} must be positive, got {getattr(cfg, name)}")
    for name in ("compact_interval_ms", "idle_timeout_s", "retention_days", "busy_timeout_ms"):
        value = getattr(cfg, name)
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a finite number, not negative, got {value}")
    cfg.redactor()  # a bad rule is a ConfigError now, not at the first record
    if cfg.db_url and "://" not in cfg.db_url:
        raise ConfigError(
            f"db_url {cfg.db_url!r} is not a database URL",
            hint="write it in SQLAlchemy form, e.g. postgresql+psycopg://user@host:5432/dbname; "
            "for a SQLite file set db_path (or leave both empty for <data_dir>/traces.db)",
        )


def find_data_dir(start: str) -> Optional[str]:
    """The nearest `.tracedb` directory in `start` or one of its parents, as git finds `.git`;
    None if there is none up to the file system's root."""
    here = os.path.abspath(start)
    while True:
        candidate = os.path.join(here, DEFAULT_DATA_DIR)
        if os.path.isdir(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def token_path(data_dir: str) -> str:
    """Where the data directory keeps its listeners' bearer token."""
    return os.path.join(data_dir, TOKEN_FILE)


def read_local_token(data_dir: str) -> Optional[str]:
    """The data directory's token, or None when it has none or this user cannot read it (the
    listener then answers unauthorized, whose hint says where the token lives)."""
    try:
        with open(token_path(data_dir), encoding="ascii") as f:
            return f.read().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def ensure_local_token(data_dir: str) -> str:
    """The data directory's token, made the first time a listener needs it: random
    (`secrets.token_urlsafe`), 0600 whatever the umask, and durable before it is used. A token
    file that other users can read is refused, not used."""
    # Lazy seam: only a listener makes a token, and every command imports this module.
    import secrets
    import tempfile

    path = token_path(data_dir)
    try:
        _make_private_dirs(data_dir)
        existing = _read_private_token(path)
        if existing is not None:
            return existing
        fd, tmp = tempfile.mkstemp(prefix=".token.", dir=data_dir)
        try:
            try:
                os.fchmod(fd, 0o600)  # mkstemp's 0600 goes through the umask; this does not
                os.write(fd, (secrets.token_urlsafe(32) + "\n").encode("ascii"))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                # A link, not a rename: it never replaces a token that another listener made
                # meanwhile (and that its clients may hold); that one is read below instead.
                os.link(tmp, path)
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
        _fsync_dir(data_dir)
    except OSError as e:
        # An fsync that failed is not tried again: the listener does not start.
        raise ConfigError(
            f"cannot make the token file {path}: {e.strerror or e}",
            hint="check the data directory's permissions and disk, or give a token with "
            "--token-file / TRACEDB_TOKEN",
        ) from None
    token = _read_private_token(path)
    if token is None:  # pragma: no cover - linked above, and a token file is never removed
        raise ConfigError(f"the token file {path} disappeared while it was made")
    return token


def _read_private_token(path: str) -> Optional[str]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(
            f"cannot read the token file {path}: {e.strerror}",
            hint="it belongs to another user, or is not a file: remove it (a new one is made), "
            "or give a token with --token-file / TRACEDB_TOKEN",
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise ConfigError(
                f"the token file {path} can be read by other users (mode {stat.S_IMODE(st.st_mode):04o})",
                hint=f"chmod 600 {path}, or remove it and a new one is made",
            )
        text = os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if not text:
        raise ConfigError(f"the token file {path} is empty", hint="remove it and a new one is made")
    return text


def _make_private_dirs(path: str) -> None:
    """Create `path` and its missing parents 0700, each new one fsynced into its parent."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    _make_private_dirs(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    os.chmod(path, 0o700)  # mkdir's mode went through the umask
    _fsync_dir(parent)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def as_config(config: Any, data_dir: Optional[str]) -> Config:
    """Accept what `tracedb.open(config=...)` accepts: None, a Config, a mapping of settings, or
    the path of a TOML file; `data_dir`, when given, wins."""
    if config is None:
        cfg = load_config()
    elif isinstance(config, Config):
        cfg = config
    elif isinstance(config, Mapping):
        cfg = load_config(overrides=config)
    elif isinstance(config, (str, os.PathLike)):
        cfg = load_config(os.fspath(config))
    else:
        raise ConfigError(f"config must be a Config, a mapping or a file path, not {type(config).__name__}")
    if data_dir is not None:
        data_dir = os.fspath(data_dir)
        if cfg.db_path and os.path.dirname(cfg.db_path) == cfg.data_dir:
            cfg = cfg.replace(db_path="")
        cfg = cfg.replace(data_dir=data_dir)
    return cfg


# Ten thousand years: past that an age cannot be turned into a date.
_MAX_DURATION_S = 10_000 * 366 * 86400.0


def parse_duration_s(text: str) -> float:
    """'30d', '12h', '90m', '45s', '2w' or a bare number of days (retention is counted in days);
    ConfigError for anything else, a negative age, or one too large to be a time."""
    raw = str(text).strip().lower()
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "w": 7 * 86400.0}
    try:
        value = float(raw[:-1]) * units[raw[-1]] if raw and raw[-1] in units else float(raw) * 86400.0
    except ValueError:
        value = math.nan
    if math.isfinite(value) and abs(value) > _MAX_DURATION_S:
        raise ConfigError(f"{text!r} is longer than 10,000 years", hint="give an age such as 30d, 12h, 90m or 45s")
    if not math.isfinite(value):
        raise ConfigError(f"{text!r} is not a duration", hint="write it like 30d, 12h, 90m or 45s")
    if value < 0:
        raise ConfigError(f"{text!r} is a negative duration", hint="give an age back from now, such as 30d")
    return value