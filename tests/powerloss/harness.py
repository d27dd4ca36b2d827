"""The power-loss harness: a lazy file system mounted for one scenario, the processes that run on
it, the cut, and the checks on what the cut left.

A scenario mounts `lazyfs` (a FUSE daemon of its own) over a backing directory, runs `tracedb
serve` on a data directory inside the mount with client processes recording through it and
`tracedb prune` / `tracedb backup` next to it every second, cuts the power (at a chosen call, or
after a random number of acknowledged events), SIGKILLs every process, lets the file system
forget what was never synced, unmounts, and checks the backing directory with `tracedb recover`,
the store and `tracedb verify`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import orjson

from benchmarks.sidecar import accepts
from tests.waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUSERMOUNT = shutil.which("fusermount3") or shutil.which("fusermount")

# Small segments, so that they roll, are compacted and deleted within a few seconds of load.
CONFIG_TOML = """\
[wal]
segment_size_bytes = 65536
[compaction]
interval_ms = 100
batch_records = 400
[recovery]
idle_timeout_s = 0
"""

OLD_EXECUTIONS = 120  # in a prepared data directory: what the prune runs delete, slice by slice
OLD_EVENTS = 3


def unavailable() -> Optional[str]:
    """Why FUSE cannot be used here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing: the power-loss tests mount a FUSE file system"
    if FUSERMOUNT is None:
        return "fusermount3 is missing (Debian package fuse3; scripts/test installs it when run as root)"
    try:
        import mfusepy  # noqa: F401 - loads libfuse
    except (ImportError, OSError) as e:
        return f"mfusepy cannot load libfuse ({e}); install the Debian package fuse3"
    return None


def env() -> dict:
    e = dict(os.environ, PYTHONPATH=ROOT, TRACEDB_IDLE_TIMEOUT_S="0")
    for name in ("TRACEDB_SIDECAR", "TRACEDB_DATA_DIR", "TRACEDB_CONFIG", "TRACEDB_SOCKET"):
        e.pop(name, None)
    return e


class MountFailed(RuntimeError):
    pass


class LazyMount:
    """lazyfs mounted at `root/mnt` over `root/backing`, driven through its control socket."""

    def __init__(self, root: str):
        self.root = root
        self.backing = os.path.join(root, "backing")
        self.grave = os.path.join(root, "grave")
        self.mnt = os.path.join(root, "mnt")
        self.control = os.path.join(root, "control.sock")
        for d in (self.backing, self.grave, self.mnt):
            os.makedirs(d, exist_ok=True)
        self.log_path = os.path.join(root, "lazyfs.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.powerloss.lazyfs", self.backing, self.grave, self.mnt, self.control],
            cwd=ROOT, env=env(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._sock: Optional[socket.socket] = None
        try:
            wait_until(self._mounted, 30, "the lazy file system to mount")
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.connect(self.control)
            self._file = self._sock.makefile("rwb")
        except BaseException:
            self.close()
            raise

    def _mounted(self) -> bool:
        if self.proc.poll() is not None:
            raise MountFailed(self.log().strip() or f"the FUSE daemon exited {self.proc.returncode}")
        return self.is_mounted() and os.path.exists(self.control)

    def is_mounted(self) -> bool:
        with open("/proc/self/mounts") as f:
            return any(line.split()[1] == self.mnt for line in f)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def call(self, **req) -> dict:
        self._file.write(json.dumps(req).encode() + b"\n")
        self._file.flush()
        line = self._file.readline()
        if not line:
            raise RuntimeError(f"the FUSE daemon closed its control socket; its log:\n{self.log()[-3000:]}")
        answer = json.loads(line)
        if not answer.pop("ok"):
            raise RuntimeError(f"lazyfs {req['cmd']}: {answer['error']}")
        return answer

    def arm(self, trigger: dict) -> None:
        self.call(cmd="arm", trigger=trigger)

    def cut(self, reason: str) -> dict:
        return self.call(cmd="cut", reason=reason)

    def status(self) -> dict:
        return self.call(cmd="status")

    def sync(self) -> None:
        self.call(cmd="sync")

    def apply(self, policy: str, seed: int) -> dict:
        return self.call(cmd="apply", policy=policy, seed=seed)["report"]

    def unmount(self) -> None:
        if self.is_mounted():
            r = subprocess.run([FUSERMOUNT, "-u", self.mnt], capture_output=True, text=True)
            if r.returncode != 0 and self.is_mounted():
                subprocess.run([FUSERMOUNT, "-u", "-z", self.mnt], capture_output=True, text=True)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.unmount()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self._log.close()


class Processes:
    """Every process a scenario starts, each in a session of its own, so that a cut SIGKILLs it
    with its children (the recorder's compactor process)."""

    def __init__(self, logs: str):
        self.logs = logs
        os.makedirs(logs, exist_ok=True)
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self.killed = False

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        with self._lock:
            if self.killed:
                raise RuntimeError("the power is off")
            log = open(os.path.join(self.logs, name + ".log"), "ab")
            try:
                p = subprocess.Popen(argv, cwd=ROOT, env=env(), stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            finally:
                log.close()
            self._procs.append(p)
            return p

    def kill_all(self) -> None:
        with self._lock:
            self.killed = True
            procs = list(self._procs)
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait(60)

    def log(self, name: str) -> str:
        try:
            with open(os.path.join(self.logs, name + ".log"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""


def tracedb_argv(config: str, data_dir: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "tracedb", "--config", config, "--data-dir", data_dir, *args]


def run_tracedb(config: str, data_dir: str, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(tracedb_argv(config, data_dir, *args), cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=timeout_s)


def start_recorder(procs: Processes, config: str, data_dir: str) -> subprocess.Popen:
    """`tracedb serve` on `data_dir`, started; `wait_listening` waits for its socket."""
    return procs.start("serve", tracedb_argv(config, data_dir, "serve", "--log-level", "warning"))


def wait_listening(procs: Processes, recorder: subprocess.Popen, data_dir: str) -> None:
    sock = os.path.join(data_dir, "tracedb.sock")

    def listening() -> bool:
        if recorder.poll() is not None:
            raise AssertionError(f"tracedb serve exited {recorder.returncode}:\n{procs.log('serve')[-3000:]}")
        return accepts(sock)

    wait_until(listening, 120, "tracedb serve to listen")


def start_clients(procs: Processes, data_dir: str, ledgers: str, n: int, seed: int) -> list[str]:
    os.makedirs(ledgers, exist_ok=True)
    paths = []
    for w in range(n):
        path = os.path.join(ledgers, f"client-{w}.ledger")
        paths.append(path)
        procs.start(f"client-{w}", [sys.executable, "-m", "tests.powerloss.load_client",
                                    os.path.join(data_dir, "tracedb.sock"), path, str(w), str(seed)])
    return paths


@dataclass
class Run:
    what: str
    started: float
    rc: Optional[int] = None


class Maintenance:
    """`tracedb prune` and `tracedb backup` next to the recorder, each started every second (or
    as soon as its previous run ended, when that took longer)."""

    def __init__(self, procs: Processes, config: str, data_dir: str, backups: str, prune_ages: list[str]):
        self.procs, self.config, self.data_dir, self.backups = procs, config, data_dir, backups
        self.prune_ages = prune_ages
        self.runs: list[Run] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "Maintenance":
        os.makedirs(self.backups, exist_ok=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        running: dict[str, tuple[Run, subprocess.Popen]] = {}
        n = 0
        while not self._stop.is_set():
            for kind in ("prune", "backup"):
                if kind in running:
                    run, p = running[kind]
                    if p.poll() is None:
                        continue
                    run.rc = p.returncode
                    del running[kind]
                n += 1
                if kind == "prune":
                    age = self.prune_ages[min(n // 2, len(self.prune_ages) - 1)]
                    args = ("prune", "--older-than", age)
                else:
                    args = ("backup", os.path.join(self.backups, f"b{n}"))
                try:
                    p = self.procs.start(f"{kind}-{n}", tracedb_argv(self.config, self.data_dir, *args))
                except RuntimeError:
                    return
                run = Run(f"{kind} {' '.join(args[1:])}", time.monotonic())
                self.runs.append(run)
                running[kind] = (run, p)
            self._stop.wait(1.0)  # the schedule of the load, not a wait for a condition

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


# -- the ledgers and the checks ------------------------------------------------------------------


def digest(value) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass
class Expected:
    envelope_hash: Optional[str] = None
    events: dict = field(default_factory=dict)  # seq -> payload sha256, acknowledged
    finish_sent: Optional[str] = None  # response sha256
    finish_acked: Optional[int] = None  # seq


def count_acks(paths: list[str]) -> int:
    n = 0
    for p in paths:
        try:
            with open(p, "rb") as f:
                n += sum(1 for line in f if line[:1] in (b"S", b"E", b"F"))
        except FileNotFoundError:
            pass
    return n


def read_ledgers(paths: list[str]) -> dict[str, Expected]:
    out: dict[str, Expected] = {}
    for p in paths:
        if not os.path.exists(p):
            continue
        with open(p) as f:
            for line in f:
                if not line.endswith("\n"):
                    continue  # a line cut by the SIGKILL: its answer is not counted as acknowledged
                kind, eid, *rest = line.split()
                e = out.setdefault(eid, Expected())
                if kind == "S":
                    e.envelope_hash = rest[0]
                elif kind == "E":
                    e.events[int(rest[0])] = rest[1]
                elif kind == "f":
                    e.finish_sent = rest[0]
                elif kind == "F":
                    e.finish_acked = int(rest[0])
    return out


@dataclass
class Checked:
    failures: list = field(default_factory=list)
    executions: int = 0  # acknowledged executions found
    events: int = 0  # acknowledged events found with their payload
    old_left: int = 0  # executions recorded before the run that prune left

    def __str__(self) -> str:
        return (f"found {self.executions} acknowledged execution(s) and {self.events} acknowledged event(s); "
                f"{self.old_left} execution(s) recorded before the run left by prune")


def check_store(config: str, data_dir: str, expected: dict[str, Expected], old: Optional[dict[str, int]] = None,
                backup_records: Optional[dict] = None, pruned: bool = True) -> Checked:
    """Everything the cut must have kept; `failures` empty when all of it was.

    `expected`: what the ledgers say was acknowledged. `old`: executions durable before the run
    (id -> events before the finish), which prune may have deleted wholly when `pruned`.
    `backup_records`: executions durable before the run that nothing deletes, id -> (status,
    seqs) as recovery leaves them."""
    import tracedb
    from tracedb.errors import TraceDBError

    acked_events = sum(len(e.events) for e in expected.values())
    out = Checked()
    failures = out.failures
    if not os.path.isdir(data_dir):
        failures.append(f"the data directory {os.path.basename(data_dir)} is gone: {len(expected)} acknowledged "
                        f"execution(s), {acked_events} acknowledged event(s) lost")
        return out
    r = run_tracedb(config, data_dir, "recover")
    if r.returncode != 0:
        failures.append(f"tracedb recover exited {r.returncode}: {r.stderr.strip()[-2000:]}")
        return out
    try:
        store_cm = tracedb.open(data_dir, config={"compact_interval_ms": 0, "idle_timeout_s": 0})
    except TraceDBError as e:
        failures.append(f"the store does not open after recover: {e}")
        return out
    with store_cm as store:
        for eid, e in sorted(expected.items()):
            try:
                rec = store.get(eid)
            except TraceDBError as err:
                lost = len(e.events) + (e.finish_acked is not None)
                failures.append(f"{eid}: missing ({type(err).__name__}); start acknowledged, {lost} event(s) acknowledged")
                continue
            out.executions += 1
            if e.envelope_hash and rec.header.envelopeHash != e.envelope_hash:
                failures.append(f"{eid}: envelope hash {rec.header.envelopeHash} != acknowledged {e.envelope_hash}")
            got = {ev.seq: ev for ev in rec.events}
            for seq, h in sorted(e.events.items()):
                if seq not in got:
                    failures.append(f"{eid}: acknowledged event seq {seq} is missing")
                elif digest(got[seq].payload) != h:
                    failures.append(f"{eid}: event seq {seq} does not hold the acknowledged payload")
                else:
                    out.events += 1
            if rec.status not in ("completed", "incomplete"):
                failures.append(f"{eid}: status {rec.status} after recover")
            if e.finish_acked is not None:
                if rec.status != "completed":
                    failures.append(f"{eid}: finish acknowledged at seq {e.finish_acked}, status {rec.status}")
                elif digest(rec.finalResponse) != e.finish_sent:
                    failures.append(f"{eid}: completed with another final response than the one acknowledged")
            elif rec.status == "completed":
                # A finish sent but not answered may have been durable before the cut; one never
                # sent cannot be.
                if e.finish_sent is None:
                    failures.append(f"{eid}: completed, but no finish was ever sent")
                elif digest(rec.finalResponse) != e.finish_sent:
                    failures.append(f"{eid}: completed with a final response that was never sent")
        for eid, n_events in sorted((old or {}).items()):
            # Durable before the run; prune may delete one, wholly, and nothing else may.
            try:
                rec = store.get(eid)
            except TraceDBError as err:
                if not pruned:
                    failures.append(f"{eid} (recorded before the run): missing ({type(err).__name__})")
                continue
            out.old_left += 1
            if rec.status != "completed" or len(rec.events) != n_events + 1:
                failures.append(f"{eid} (recorded before the run): {rec.status}, {len(rec.events)} event(s)")
        for eid, want in sorted((backup_records or {}).items()):
            try:
                rec = store.get(eid)
            except TraceDBError as err:
                failures.append(f"{eid} (in the backup restored): missing ({type(err).__name__})")
                continue
            if (rec.status, [ev.seq for ev in rec.events]) != want:
                failures.append(f"{eid} (in the backup restored): {rec.status} {len(rec.events)} event(s), "
                                f"the backup held {want[0]} {len(want[1])}")
    v = run_tracedb(config, data_dir, "verify")
    if v.returncode != 0:
        failures.append(f"tracedb verify exited {v.returncode}: {(v.stdout + v.stderr).strip()[-2000:]}")
    return out


def summary(report: dict) -> str:
    """The loss the model applied, short: for a failure message."""
    files = [f"{f['path']}: {f['size_before']} -> {f['size_after']} bytes" for f in report["files"]]
    return (f"cut: {report['reason']}; policy {report['policy']}, seed {report['seed']}\n"
            f"files taken back to their last sync: {files}\n"
            f"directory changes undone: {report['undone']}\nkept: {report['kept']}")
