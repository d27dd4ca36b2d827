"""What tracedb says when a feature needs an extra (or a package) that is not installed: the
command for a checkout's .venv (`scripts/setup EXTRA`) and pip run by the very interpreter running
tracedb, since the `pip` on PATH may belong to another Python. Each case runs in a fresh
interpreter in which the package cannot be imported."""

from __future__ import annotations

import subprocess
import sys

import pytest


def absent(packages: tuple[str, ...], code: str) -> subprocess.CompletedProcess:
    """`code` in a new interpreter where importing any of `packages` fails as if not installed."""
    block = "".join(f"sys.modules[{p!r}] = None; " for p in packages)
    return subprocess.run([sys.executable, "-c", f"import sys; {block}\n{code}"],
                          capture_output=True, text=True, timeout=60)


def extra_hint(extra: str) -> str:
    return (f"install the {extra} extra: `scripts/setup {extra}` in a tracedb checkout, or "
            f"`{sys.executable} -m pip install 'tracedb[{extra}]'` where tracedb was installed with pip")


def test_a_postgresql_url_without_the_driver_names_the_postgres_extra(tmp_path):
    code = ("from tracedb.cli import main; sys.argv = ['tracedb', '--db', "
            "'postgresql+psycopg://postgres@127.0.0.1:5432/test', 'inspect', '--list']; main()")
    r = absent(("psycopg",), code)
    assert r.returncode == 1, r.stderr
    assert "error: the PostgreSQL driver for postgresql+psycopg://postgres@127.0.0.1:5432/test is not installed" in r.stderr
    assert f"hint: {extra_hint('postgres')}\n" in r.stderr


@pytest.mark.parametrize("module, packages, extra", [
    ("tracedb.integrations.openai", ("httpx",), "openai"),
    ("tracedb.integrations.agents", ("agents",), "openai"),
    ("tracedb.otel.exporter", ("opentelemetry.sdk",), "otel"),
])
def test_importing_an_integration_without_its_extra_says_what_to_install(module, packages, extra):
    code = (
        "from tracedb.errors import ExtraNotInstalledError\n"
        "try:\n"
        f"    import {module}\n"
        "except ModuleNotFoundError as e:\n"
        "    assert isinstance(e, ExtraNotInstalledError), type(e)\n"
        "    print(e.name); print(e.message); print(e.hint)\n"
    )
    r = absent(packages, code)
    assert r.returncode == 0, r.stderr
    name, message, hint = r.stdout.splitlines()
    assert name.split(".")[0] == packages[0].split(".")[0]  # the module that could not be imported
    assert message == f"{module} needs the {extra} extra ({name} is not installed)"
    assert hint == extra_hint(extra)


def test_the_missing_extra_error_is_both_tracedbs_and_pythons():
    from tracedb.errors import ConfigError, ExtraNotInstalledError

    e = ExtraNotInstalledError("tracedb.otel.exporter", "otel", "opentelemetry")
    assert isinstance(e, ConfigError) and isinstance(e, ModuleNotFoundError) and e.name == "opentelemetry"
    assert e.exit_code == 1 and "scripts/setup otel" in str(e)


def test_intentusnet_absent_names_pip_for_this_interpreter():
    code = (
        "from tracedb.errors import UsageError\n"
        "from tracedb.interop.intentusnet import to_intentusnet_record\n"
        "try:\n"
        "    to_intentusnet_record(None)\n"
        "except UsageError as e:\n"
        "    print(e.hint)\n"
    )
    r = absent(("intentusnet", "intentusnet.recording", "intentusnet.recording.models"), code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f"`{sys.executable} -m pip install intentusnet`, or use to_intentusnet_dict() "
                                "for its JSON form")
