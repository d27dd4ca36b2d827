"""tracedb installed into an environment of one's own, as docs/install.md says: a wheel built from
the checkout (`python -m pip wheel --no-deps . -w dist/`), or the checkout itself, installed with
pip into a fresh virtual environment. The dependencies come from this checkout's .venv (a .pth
file, as --system-site-packages would give them), so that the test needs the package index only
for the build backend; the installed tracedb is the one under test, and every dependency it
declares is checked installed at a version it accepts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from .conftest import BASE_PYTHON, SYSTEM_PATH, copy_checkout, plain_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DEPENDENCIES_MET = """
import importlib.metadata as md
from packaging.requirements import Requirement
for text in md.requires("tracedb"):
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an extra's
    version = md.version(req.name)
    assert req.specifier.contains(version, prereleases=True), (text, version)
    print(req.name, version)
"""


def fresh_venv(where: str) -> str:
    """A new virtual environment whose Python also sees this checkout's .venv packages (after its
    own); returns its bin directory."""
    subprocess.run([BASE_PYTHON, "-m", "venv", where], check=True, timeout=300)
    bindir = os.path.join(where, "bin")
    own = subprocess.run([os.path.join(bindir, "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(own, "checkout-venv-deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return bindir


def check_installed(bindir: str, tmp_path) -> None:
    env = plain_env()
    python = os.path.join(bindir, "python")
    where = subprocess.run([python, "-c", "import tracedb, wal; print(tracedb.__file__); print(wal.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    venv = os.path.dirname(bindir)
    assert all(p.startswith(venv + os.sep) for p in where.stdout.split()), where.stdout
    deps = subprocess.run([python, "-c", DEPENDENCIES_MET], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert deps.returncode == 0 and "SQLAlchemy" in deps.stdout, deps.stderr
    tracedb_bin = os.path.join(bindir, "tracedb")
    r = subprocess.run([tracedb_bin, "--help"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Usage: tracedb" in r.stdout, r.stderr
    # The recorder, its compactor process, the migrations and the client, all from the install.
    data_dir = str(tmp_path / "data")
    r = subprocess.run([tracedb_bin, "--data-dir", data_dir, "demo", "--start-server", "--executions", "1"],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"{tracedb_bin} --data-dir {data_dir} inspect --list" in r.stdout  # not on PATH: its path
    r = subprocess.run([tracedb_bin, "--data-dir", data_dir, "verify"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_wheel_built_from_the_checkout_installs_into_a_fresh_environment(tmp_path):
    if shutil.which("tracedb", path=SYSTEM_PATH):
        pytest.skip(f"a tracedb is installed on {SYSTEM_PATH}")
    checkout = copy_checkout(str(tmp_path / "checkout"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", ".", "-w", "dist/"], cwd=checkout,
                           env=plain_env(), capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = [os.path.join(checkout, "dist", n) for n in os.listdir(os.path.join(checkout, "dist"))]
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert {"wal/FORMAT.md", "tracedb/migrations/env.py", "tracedb/migrations/script.py.mako",
            "tracedb/web/static/app.js"} <= names, sorted(names)
    assert any(n.startswith("tracedb/migrations/versions/") and n.endswith(".py") for n in names)
    bindir = fresh_venv(str(tmp_path / "venv"))
    r = subprocess.run([os.path.join(bindir, "python"), "-m", "pip", "install", "--no-deps", "--no-index", wheel],
                       env=plain_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    check_installed(bindir, tmp_path)


def test_the_checkout_itself_installs_into_a_fresh_environment(tmp_path):
    if shutil.which("tracedb", path=SYSTEM_PATH):
        pytest.skip(f"a tracedb is installed on {SYSTEM_PATH}")
    checkout = copy_checkout(str(tmp_path / "checkout"))
    bindir = fresh_venv(str(tmp_path / "venv"))
    r = subprocess.run([os.path.join(bindir, "python"), "-m", "pip", "install", "--no-deps", checkout],
                       env=plain_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    check_installed(bindir, tmp_path)
