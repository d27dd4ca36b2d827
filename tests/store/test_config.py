"""Configuration: precedence, seed 003 aliases, the documented file."""

from __future__ import annotations

import os

import pytest

from tests.conftest import REPO
from tracedb.config import Config, load_config, parse_duration_s
from tracedb.errors import ConfigError

DOC = os.path.join(REPO, "config", "tracedb.toml")


def test_the_documented_file_holds_every_key_with_its_default():
    assert load_config(DOC, env={}) == Config()
    text = open(DOC).read()
    from tracedb.config import _FILE_KEYS

    for (table, key), name in _FILE_KEYS.items():
        assert f"{key} =" in text, key
        assert f"({name.upper()})" in text, name  # the environment name is documented


def test_flags_win_over_env_over_file_over_defaults(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text('[retention]\ndays = 10\n[compaction]\ninterval_ms = 50\n[sidecar]\nport = 1\n')
    cfg = load_config(str(f), env={})
    assert (cfg.retention_days, cfg.compact_interval_ms) == (10, 50)
    assert cfg.extra == {"sidecar": {"port": 1}}  # other owners' tables pass through
    cfg = load_config(str(f), env={"TRACEDB_RETENTION_DAYS": "20"})
    assert cfg.retention_days == 20 and cfg.compact_interval_ms == 50
    cfg = load_config(str(f), env={"TRACEDB_RETENTION_DAYS": "20"}, overrides={"retention_days": 5, "data_dir": None})
    assert cfg.retention_days == 5 and cfg.data_dir == ".tracedb"


def test_seed_003_variables_are_aliases():
    cfg = load_config(env={
        "TRACE_STORAGE_PATH": "/var/lib/aos/traces.db",
        "TRACE_RETENTION_DAYS": "7",
        "TRACING_ENABLED": "false",
    })
    assert cfg.sqlite_path == "/var/lib/aos/traces.db"
    assert cfg.data_dir == "/var/lib/aos"
    assert cfg.retention_days == 7 and cfg.enabled is False
    # The TRACEDB_ name wins over its alias.
    assert load_config(env={"TRACE_RETENTION_DAYS": "7", "TRACEDB_RETENTION_DAYS": "9"}).retention_days == 9
    assert load_config(env={"TRACE_STORAGE_PATH": "/srv/traces"}).wal_dir == "/srv/traces/wal"


@pytest.mark.parametrize(
    "text, env",
    [
        ("[retention]\ndayz = 3\n", {}),
        ("[retention]\ndays = 'many'\n", {}),
        ("not toml [", {}),
        ("", {"TRACEDB_COMPACT_BATCH_RECORDS": "0"}),
        ("", {"TRACING_ENABLED": "maybe"}),
    ],
)
def test_bad_configuration_is_a_clear_error(tmp_path, text, env):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(str(f), env=env)
    assert err.value.message


def test_durations():
    assert parse_duration_s("30d") == 30 * 86400
    assert parse_duration_s("12h") == 12 * 3600
    assert parse_duration_s("90m") == 5400
    assert parse_duration_s("45s") == 45
    assert parse_duration_s("2") == 2 * 86400  # bare number: days, as seed 003 counts them
    with pytest.raises(ConfigError):
        parse_duration_s("soon")


def test_a_variable_set_to_nothing_means_unset():
    """`TRACEDB_DATA_DIR=` (a shell that exports an empty value) is the default data directory,
    not the working directory; the same for any setting whose empty value means nothing."""
    cfg = load_config(env={"TRACEDB_DATA_DIR": "", "TRACEDB_RETENTION_DAYS": " "})
    default = load_config(env={})
    assert cfg.data_dir == default.data_dir and cfg.retention_days == default.retention_days


@pytest.mark.parametrize(
    "text, env, expected",
    [
        ("", {}, "auto"),
        ('[compaction]\nworker_process = "auto"\n', {}, "auto"),
        ("[compaction]\nworker_process = true\n", {}, "process"),
        ("[compaction]\nworker_process = false\n", {}, "thread"),
        ("[compaction]\nworker_process = false\n", {"TRACEDB_COMPACT_WORKER": "Auto"}, "auto"),
        ("", {"TRACEDB_COMPACT_WORKER": "1"}, "process"),
        ("", {"TRACEDB_COMPACT_WORKER": "off"}, "thread"),
    ],
)
def test_where_compaction_runs_is_true_false_or_auto(tmp_path, text, env, expected):
    f = tmp_path / "t.toml"
    f.write_text(text)
    assert load_config(str(f), env=env).worker_mode == expected


def test_a_worker_process_setting_that_is_none_of_the_three_is_refused_naming_them(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text('[compaction]\nworker_process = "sometimes"\n')
    with pytest.raises(ConfigError) as err:
        load_config(str(f), env={})
    assert 'true, false or "auto"' in err.value.message and "compact_worker" in err.value.message


def test_a_config_built_in_code_reads_worker_process_as_the_file_does():
    assert [Config(compact_worker=v).worker_mode for v in ("AUTO", " auto ", "false", "off", "1", True, False)] == [
        "auto", "auto", "thread", "thread", "process", "process", "thread"]
    with pytest.raises(ConfigError) as err:
        Config(compact_worker="sometimes").worker_mode
    assert 'true, false or "auto"' in err.value.message
