"""scripts/setup in a copy of the checkout, from nothing, as a new user runs it: a plain install
(what scripts/run makes), then the extras its hints name, added one call at a time. The hints
tracedb prints for a missing extra are run exactly as printed: `scripts/setup EXTRA`, and the
`python -m pip install 'tracedb[EXTRA]'` form. Installs come from the package index pip is
configured with."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib

import pytest

from .conftest import BASE_PYTHON, SYSTEM_PATH, copy_checkout, plain_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def hinted(stderr: str, starting: str) -> str:
    (cmd,) = [c for c in re.findall(r"`([^`]+)`", stderr) if c.startswith(starting)]
    return cmd


def test_extras_are_added_by_the_commands_the_hints_print_and_all_stay_installed(tmp_path):
    if shutil.which("tracedb", path=SYSTEM_PATH):
        pytest.skip(f"a tracedb is installed on {SYSTEM_PATH}")
    checkout = copy_checkout(str(tmp_path / "tracedb"))
    env = plain_env(PYTHON=BASE_PYTHON)
    venv_python = os.path.join(checkout, ".venv", "bin", "python")
    tracedb_bin = os.path.join(checkout, ".venv", "bin", "tracedb")
    stamp = os.path.join(checkout, ".venv", ".tracedb-installed")
    install_log = os.path.join(checkout, ".venv", "install.log")

    def sh(argv, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, timeout=900, **kw)

    def importable(*modules: str) -> bool:
        return sh([venv_python, "-c", "import " + ", ".join(modules)]).returncode == 0

    # What scripts/run does first; it says how to put tracedb on PATH.
    r = sh(["scripts/setup"])
    assert r.returncode == 0, r.stderr
    assert f'export PATH="{checkout}/.venv/bin:$PATH"' in r.stderr
    assert importable("tracedb", "wal") and not importable("opentelemetry.proto") and not importable("psycopg")

    # serve --otlp-port without the extra: the hint's first command, run as printed.
    r = sh([tracedb_bin, "--data-dir", str(tmp_path / "d"), "serve", "--otlp-port", "0"])
    assert r.returncode == 1 and "error: the OTLP receiver needs" in r.stderr, r.stderr
    r = sh(shlex.split(hinted(r.stderr, "scripts/setup")))
    assert r.returncode == 0, r.stderr
    assert importable("opentelemetry.proto", "opentelemetry.sdk")

    # --db postgresql without the driver: the hint's pip form, run as printed, installs into the
    # interpreter running tracedb, and leaves this checkout's tracedb in place.
    url = "postgresql+psycopg://postgres@127.0.0.1:1/none"
    r = sh([tracedb_bin, "--db", url, "inspect", "--list"])
    assert r.returncode == 1 and "is not installed" in r.stderr, r.stderr
    pip_form = shlex.split(hinted(r.stderr, venv_python))
    assert pip_form == [venv_python, "-m", "pip", "install", "tracedb[postgres]"]
    r = sh(pip_form)
    assert r.returncode == 0, r.stdout + r.stderr
    assert importable("psycopg", "opentelemetry.proto")
    where = sh([venv_python, "-c", "import tracedb; print(tracedb.__file__)"]).stdout.strip()
    assert where == os.path.join(checkout, "tracedb", "__init__.py")

    # Two extras in two calls: both recorded, both installed.
    r = sh(["scripts/setup", "postgres"])
    assert r.returncode == 0, r.stderr
    assert open(stamp).read().split() == ["otel", "postgres"]
    assert importable("psycopg", "opentelemetry.proto")

    # Asked again: nothing to install, quick.
    before = os.stat(install_log).st_mtime_ns
    assert sh(["scripts/setup", "otel"]).returncode == 0 and sh(["scripts/setup"]).returncode == 0
    assert os.stat(install_log).st_mtime_ns == before

    # pyproject.toml changed (an update of the checkout gave the otel extra a new package): a
    # plain scripts/setup, as scripts/run runs it, installs every extra installed so far again.
    pyproject = os.path.join(checkout, "pyproject.toml")
    text = open(pyproject).read()
    assert not importable("iniconfig")
    changed = text.replace('    "opentelemetry-sdk>=1.27",\n', '    "opentelemetry-sdk>=1.27",\n    "iniconfig",\n', 1)
    assert changed != text
    with open(pyproject, "w") as f:
        f.write(changed)
    r = sh(["scripts/setup"])
    assert r.returncode == 0, r.stderr
    assert importable("iniconfig", "psycopg", "opentelemetry.proto")
    assert open(stamp).read().split() == ["otel", "postgres"]

    # A misspelt extra is refused, not installed as nothing.
    r = sh(["scripts/setup", "otle"])
    assert r.returncode == 2
    extras = " ".join(tomllib.loads(text)["project"]["optional-dependencies"])
    assert f"tracedb has no extra 'otle' (its extras: {extras})" in r.stderr
    assert open(stamp).read().split() == ["otel", "postgres"]
