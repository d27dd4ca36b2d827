"""What `tracedb serve` and `tracedb ui` both take: the [sidecar] table of the configuration file
(config/tracedb.toml) and --allowed-host names."""

from __future__ import annotations

import click

from tracedb.errors import ConfigError
from tracedb.sidecar.asgi import normalize_host

# [sidecar] keys of the configuration file (config/tracedb.toml), with their types.
_FILE_KEYS = {
    "socket": str,
    "tcp": str,
    "allow_remote": bool,
    "token_file": str,
    "trust_local_users": bool,
    "allowed_hosts": list,
    "metrics_port": int,
    "http_port": int,
    "http_host": str,
    "otlp_port": int,
    "otlp_host": str,
    "max_frame_bytes": int,
    "max_connections": int,
    "max_inflight_requests": int,
    "max_inflight_bytes": int,
    "first_frame_timeout_s": float,
    "connection_idle_timeout_s": float,
    "otlp_max_connections": int,
    "http_max_connections": int,
    "http_header_timeout_s": float,
    "http_idle_timeout_s": float,
    "drain_timeout_s": float,
    "log_level": str,
}


def sidecar_file_settings(cfg) -> dict:
    table = dict((getattr(cfg, "extra", None) or {}).get("sidecar") or {})
    out = {}
    for key, value in table.items():
        kind = _FILE_KEYS.get(key)
        if kind is None:
            raise ConfigError(f"unknown key {key!r} in [sidecar]", hint="see config/tracedb.toml")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"[sidecar] {key} must be a {kind.__name__}, got {value!r}")
        if key == "allowed_hosts":
            if not all(isinstance(v, str) for v in value):
                raise ConfigError(f"[sidecar] {key} must be a list of strings, got {value!r}")
            try:
                value = [normalize_host(v) for v in value]
            except ValueError as e:
                raise ConfigError(f"[sidecar] {key}: {e}", hint="give host names or addresses, without a port") from None
        out[key] = value
    return out


def host_names(_ctx, _param, names: tuple) -> tuple:
    """The --allowed-host names as a Host header gives them; a usage error for one that is not."""
    try:
        return tuple(normalize_host(n) for n in names)
    except ValueError as e:
        raise click.BadParameter(f"{e}: give a name or an address, without a port") from None
