"""Fixtures of the power-loss tests: FUSE available (or a skip that says why), a data directory
recorded before the run, a backup to restore, and each scenario's seed."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import zlib
from dataclasses import dataclass

import pytest

from . import harness


@pytest.fixture(scope="session")
def fuse_mount_works():
    """Skip where FUSE cannot be mounted: no /dev/fuse, no fusermount3, or mounting refused."""
    why = harness.unavailable()
    if why:
        pytest.skip(why)
    root = tempfile.mkdtemp(prefix="plprobe")
    try:
        try:
            harness.LazyMount(root).close()
        except harness.MountFailed as e:
            pytest.skip(f"mounting a FUSE file system is not permitted here: {e}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def lazy_root(fuse_mount_works):
    """A short private directory for one scenario (Unix socket paths stay under ~100 bytes)."""
    root = tempfile.mkdtemp(prefix="pl")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def seed_for(request, name: str) -> int:
    """TRACEDB_POWERLOSS_SEED when set (to rerun a failure), else a fixed seed per scenario."""
    env = os.environ.get("TRACEDB_POWERLOSS_SEED", "").strip()
    seed = int(env) if env else zlib.crc32(name.encode())
    print(f"\npower-loss scenario {name}: seed {seed} (rerun: TRACEDB_POWERLOSS_SEED={seed} "
          f".venv/bin/python -m pytest -p no:cacheprovider '{request.node.nodeid}')")
    return seed


@dataclass(frozen=True)
class Prepared:
    """A data directory recorded before the run (on an ordinary disk, copied into the backing
    directory before the mount, so durable): `old` executions prune may delete, each with
    OLD_EVENTS events, and `recent` ones it may not, with their status and seqs once recovered."""

    path: str
    config: str
    old: dict
    recent: dict


def _record(data_dir: str, config: str) -> tuple[dict, dict]:
    import tracedb

    now = time.time_ns()
    clock = [now]
    old, recent = {}, {}
    with tracedb.open(data_dir, config=config, clock=lambda: clock[0]) as store:
        for i in range(harness.OLD_EXECUTIONS):
            # Created 100 days ago down to 40: each prune run's cutoff takes another slice.
            clock[0] = now - int((100 - 60 * i / harness.OLD_EXECUTIONS) * 86400 * 10**9)
            ex = store.start("Old", {"intent": "Old", "i": i})
            for k in range(harness.OLD_EVENTS):
                ex.event("tool.responded", {"i": i, "k": k})
            ex.finish({"status": "success", "payload": {"i": i}})
            old[ex.execution_id] = harness.OLD_EVENTS
        clock[0] = now
        for i in range(20):
            ex = store.start("Recent", {"intent": "Recent", "i": i})
            for k in range(1 + i % 4):
                ex.event("tool.responded", {"i": i, "k": k, "text": "r" * 100})
            if i % 3:
                ex.finish({"status": "success", "payload": {"i": i}})
            recent[ex.execution_id] = None
    # Left running ones are marked incomplete by the first open after: the reference is the
    # store as recovery makes it, read once here.
    with tracedb.open(data_dir, config=config) as store:
        for eid in recent:
            rec = store.get(eid)
            recent[eid] = (rec.status, [e.seq for e in rec.events])
    return old, recent


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, fuse_mount_works) -> Prepared:
    base = tmp_path_factory.mktemp("prepared")
    config = str(base / "tracedb.toml")
    with open(config, "w") as f:
        f.write(harness.CONFIG_TOML)
    path = str(base / "data")
    old, recent = _record(path, config)
    return Prepared(path, config, old, recent)


@pytest.fixture(scope="session")
def backup_dir(tmp_path_factory, prepared) -> str:
    """A backup of the prepared data directory (`tracedb backup`), on an ordinary disk."""
    dest = str(tmp_path_factory.mktemp("backup") / "b")
    r = harness.run_tracedb(prepared.config, prepared.path, "backup", dest)
    assert r.returncode == 0, r.stderr
    return dest
