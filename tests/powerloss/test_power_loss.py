"""Power cuts under a recorder: every acknowledged event survives.

Each scenario runs `tracedb serve` on a data directory inside the lazy file system (64 KiB WAL
segments, the compactor running), three client processes recording through it, and `tracedb
prune` / `tracedb backup` started every second next to it; then cuts the power, either right
after a chosen call or after a random number of acknowledged events, and checks what the cut
left (harness.check_store): `tracedb recover` succeeds, the store opens, every acknowledged event
is there with its payload, no execution is completed whose finish was not sent, every one whose
finish was acknowledged is, what was recorded before the run is whole or wholly pruned, and
`tracedb verify` passes.

The seed of each scenario (printed; TRACEDB_POWERLOSS_SEED reruns one) chooses the clients'
executions, the moment of a random cut and what the cut keeps of what was not synced. Thread
and process scheduling is not seeded: a rerun cuts at the same call, not at the same byte.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from typing import Optional

import pytest

from . import harness
from .conftest import seed_for

PRUNE_AGES = [f"{d}d" for d in range(95, 30, -10)]
CLIENTS = 3
TRIGGER_DEADLINE_S = 90

# Right after these calls, under load on a data directory recorded before the run. The names are
# the recorder's: segments `<number>-<first LSN>.wal` (created as .tmp and renamed), the spare
# `preallocated.tmp`, `APPLIED` (written as APPLIED.tmp and renamed) in `wal/`; SQLite's
# `traces.db-wal`, synced at each commit and truncated by prune's checkpoint.
TRIGGERS = {
    "after-a-group-commit": {"op": "fdatasync", "glob": "/data/wal/*.wal", "nth": 60},
    "after-the-first-segment-rename": {"op": "rename", "glob": "/data/wal/*.wal", "nth": 1},
    "after-a-segment-rename": {"op": "rename", "glob": "/data/wal/*.wal", "nth": 3},
    "after-the-first-segment-unlink": {"op": "unlink", "glob": "/data/wal/*.wal", "nth": 1},
    "after-the-first-applied-rename": {"op": "rename", "glob": "/data/wal/APPLIED", "nth": 1},
    "after-an-applied-rename": {"op": "rename", "glob": "/data/wal/APPLIED", "nth": 4},
    "after-a-spare-sync": {"op": "sync", "glob": "/data/wal/preallocated.tmp", "nth": 1},
    "after-a-database-commit": {"op": "sync", "glob": "/data/traces.db-wal", "nth": 12},
    "after-a-checkpoint-truncate": {"op": "truncate", "glob": "/data/traces.db-wal", "nth": 1},
    "after-a-directory-sync": {"op": "fsyncdir", "glob": "/data/wal", "nth": 8},
}


class Scenario:
    """One mount, one recorder under load, one cut, the checks."""

    def __init__(self, root: str, name: str, seed: int, config_text: str = harness.CONFIG_TOML):
        self.root, self.name, self.seed = root, name, seed
        self.rng = random.Random(seed)
        self.config = os.path.join(root, "tracedb.toml")
        with open(self.config, "w") as f:
            f.write(config_text)
        self.procs = harness.Processes(os.path.join(root, "logs"))
        self.mount: Optional[harness.LazyMount] = None
        self.maintenance: Optional[harness.Maintenance] = None
        self.ledgers: list[str] = []
        self.recorder = None
        self.load_started = self.cut_at = 0.0

    def put_before_mount(self, src: str, name: str) -> None:
        """A directory that was on the disk before the run: durable by definition."""
        shutil.copytree(src, os.path.join(self.root, "backing", name), symlinks=True)

    def mount_fs(self) -> harness.LazyMount:
        self.mount = harness.LazyMount(self.root)
        return self.mount

    def inside(self, name: str) -> str:
        return os.path.join(self.mount.mnt, name)

    def backing(self, name: str) -> str:
        return os.path.join(self.mount.backing, name)

    def start_load(self, data_dir: str) -> None:
        self.recorder = harness.start_recorder(self.procs, self.config, data_dir)
        # The clients start with the recorder and connect once it listens: the load begins then.
        self.ledgers = harness.start_clients(self.procs, data_dir, os.path.join(self.root, "ledgers"), CLIENTS, self.seed)
        harness.wait_listening(self.procs, self.recorder, data_dir)
        self.load_started = time.monotonic()
        self.maintenance = harness.Maintenance(self.procs, self.config, data_dir, os.path.join(self.root, "backups"),
                                               PRUNE_AGES).start()

    def _recorder_alive(self) -> None:
        if self.recorder is not None and self.recorder.poll() is not None and not self.mount.status()["cut"]:
            raise AssertionError(f"tracedb serve exited {self.recorder.returncode} before the cut:\n"
                                 f"{self.procs.log('serve')[-3000:]}")

    def wait_for_trigger(self, trigger: dict) -> None:
        def fired() -> bool:
            self._recorder_alive()
            return self.mount.status()["cut"]

        try:
            harness.wait_until(fired, TRIGGER_DEADLINE_S, f"the cut right after {trigger}", interval_s=0.05)
        except AssertionError as e:
            raise AssertionError(f"{e}; calls seen: {self.mount.status()['counts']}") from None
        self.cut_at = time.monotonic()

    def cut_after_acks(self, lo: int, hi: int) -> int:
        target = self.rng.randint(lo, hi)

        def enough() -> bool:
            self._recorder_alive()
            return harness.count_acks(self.ledgers) >= target

        harness.wait_until(enough, 120, f"{target} acknowledged events", interval_s=0.02)
        self.mount.cut(f"after {target} acknowledgments")
        self.cut_at = time.monotonic()
        return target

    def power_off(self, policy: str) -> dict:
        """Every process killed, the model applied, the file system unmounted."""
        self.procs.kill_all()
        if self.maintenance is not None:
            self.maintenance.stop()
        counts = self.mount.status()["counts"]
        report = self.mount.apply(policy, self.seed)
        self.mount.unmount()
        report["counts"] = counts
        return report

    def describe(self, report: dict) -> str:
        acks = harness.count_acks(self.ledgers)
        took = self.cut_at - self.load_started if self.load_started else 0.0
        runs = self.maintenance.runs if self.maintenance else []
        return (f"scenario {self.name}, seed {self.seed}: {acks} acknowledgments in {took:.2f} s of load "
                f"({acks / took if took else 0:.0f}/s) before the cut; {len(runs)} prune/backup runs started "
                f"({sum(r.rc == 0 for r in runs)} seen ending with 0)\n{harness.summary(report)}\n"
                f"calls: {report['counts']}")

    def judge(self, report: dict, checked: harness.Checked) -> None:
        text = f"{self.describe(report)}\n{checked}"
        print(text)
        assert not checked.failures, (f"{len(checked.failures)} failure(s) after the cut:\n"
                                      + "\n".join(checked.failures[:30]) + "\n" + text)

    def close(self) -> None:
        self.procs.kill_all()
        if self.maintenance is not None:
            self.maintenance.stop()
        if self.mount is not None:
            self.mount.close()


@pytest.fixture
def scenario(lazy_root):
    made: list[Scenario] = []

    def make(name: str, seed: int) -> Scenario:
        s = Scenario(lazy_root, name, seed)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _run_on_prepared(scenario, prepared, name: str, seed: int, trigger: Optional[dict], policy: str,
                     acks: tuple[int, int] = (200, 2000)) -> None:
    s = scenario(name, seed)
    s.put_before_mount(prepared.path, "data")
    s.mount_fs()
    if trigger is not None:
        s.mount.arm(trigger)
    s.start_load(s.inside("data"))
    if trigger is not None:
        s.wait_for_trigger(trigger)
    else:
        s.cut_after_acks(*acks)
    report = s.power_off(policy)
    expected = harness.read_ledgers(s.ledgers)
    assert expected, "nothing was acknowledged before the cut: " + s.describe(report)
    checked = harness.check_store(s.config, s.backing("data"), expected, old=prepared.old,
                                  backup_records=prepared.recent)
    s.judge(report, checked)


@pytest.mark.parametrize("name", sorted(TRIGGERS))
def test_a_cut_right_after_a_chosen_call_loses_nothing_acknowledged(request, scenario, prepared, name):
    _run_on_prepared(scenario, prepared, name, seed_for(request, name), TRIGGERS[name], "random")


@pytest.mark.parametrize("policy", ["worst", "random"])
def test_a_cut_at_a_random_moment_loses_nothing_acknowledged(request, scenario, prepared, policy):
    name = f"random-moment-{policy}"
    _run_on_prepared(scenario, prepared, name, seed_for(request, name), None, policy)


SLOW_SEEDS = range(1, 9)


@pytest.mark.slow
@pytest.mark.parametrize("n", SLOW_SEEDS)
def test_many_cuts_at_random_moments_lose_nothing_acknowledged(request, scenario, prepared, n):
    name = f"random-moment-{n}"
    _run_on_prepared(scenario, prepared, name, seed_for(request, name), None, "random" if n % 3 else "worst")


def test_a_cut_in_the_first_second_of_a_new_data_directory_loses_nothing_acknowledged(request, scenario):
    """The first run ever: the recorder makes the data directory and its wal/ inside the mount."""
    name = "new-data-directory"
    s = scenario(name, seed_for(request, name))
    s.mount_fs()
    trigger = {"op": "fdatasync", "glob": "/data/wal/*.wal", "nth": 10}
    s.mount.arm(trigger)
    s.start_load(s.inside("data"))
    s.wait_for_trigger(trigger)
    report = s.power_off("worst")
    # The cut comes at the WAL's 10th fdatasync; the clock only checks that it came early. It
    # counts from the load's start: the interpreter's start and imports, and the store's creation
    # (its migrations, each an fsync on this filesystem) come before the first record.
    first_run = s.cut_at - s.load_started
    assert first_run < 2, f"the cut came {first_run:.2f} s into the run, not in its first moments"
    expected = harness.read_ledgers(s.ledgers)
    assert expected, "nothing was acknowledged before the cut: " + s.describe(report)
    s.judge(report, harness.check_store(s.config, s.backing("data"), expected))


def _restored(request, scenario, backup_dir: str, name: str, into: str):
    """Scenario `name` on a fresh mount, the backup restored into its directory `into` by
    `tracedb restore` (exit code 0)."""
    s = scenario(name, seed_for(request, name))
    s.mount_fs()
    r = harness.run_tracedb(s.config, s.inside(into), "restore", backup_dir)
    assert r.returncode == 0, r.stderr
    return s


def test_a_cut_right_after_restore_keeps_the_restored_directory(request, scenario, prepared, backup_dir):
    """`tracedb restore` returned 0: the directory it made must open after a power cut."""
    s = _restored(request, scenario, backup_dir, "restore-then-cut", "restored")
    s.mount.cut("right after tracedb restore exited 0")
    s.cut_at = time.monotonic()
    report = s.power_off("worst")
    # Everything the backup held, whole: nothing prunes here.
    s.judge(report, harness.check_store(s.config, s.backing("restored"), {}, old=prepared.old,
                                        backup_records=prepared.recent, pruned=False))


def test_a_cut_while_recording_into_a_restored_directory_loses_nothing(request, scenario, prepared, backup_dir):
    s = _restored(request, scenario, backup_dir, "restore-then-record", "data")
    s.start_load(s.inside("data"))
    s.cut_after_acks(200, 2000)
    report = s.power_off("random")
    expected = harness.read_ledgers(s.ledgers)
    assert expected, "nothing was acknowledged before the cut: " + s.describe(report)
    s.judge(report, harness.check_store(s.config, s.backing("data"), expected, old=prepared.old,
                                        backup_records=prepared.recent))
