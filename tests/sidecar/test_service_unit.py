"""config/tracedb.service: systemd accepts it and rates it at most MEDIUM; its ExecStart starts a
recorder that stops cleanly on the unit's KillSignal, also inside the unit's system call filter,
MemoryDenyWriteExecute and empty capability set; the user its comment creates is a system user
without a login; and only that user reaches the recorder's socket."""

from __future__ import annotations

import configparser
import ctypes.util
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys

import pytest

from tests.waiting import wait_until

from tests.serving import ROOT

UNIT = os.path.join(ROOT, "config", "tracedb.service")
INSTALLED = "/opt/tracedb/.venv/bin/tracedb"
TRACEDB = os.path.join(os.path.dirname(sys.executable), "tracedb")
SANDBOX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_exec.py")


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    parser.read(UNIT)
    return parser


def _service_values(key: str) -> list[str]:
    """Every value of `key` in [Service], in order (configparser keeps only the last)."""
    section, values = None, []
    with open(UNIT, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                section = line
            elif section == "[Service]" and line.startswith(f"{key}="):
                values.append(line.split("=", 1)[1])
    return values


def _exec_start() -> list[str]:
    return _unit()["Service"]["ExecStart"].replace(INSTALLED, TRACEDB).split()


def _unit_here(tmp_path) -> str:
    """The unit with ExecStart naming this checkout's tracedb (systemd checks that it exists)."""
    unit = tmp_path / "tracedb.service"
    unit.write_text(open(UNIT, encoding="utf-8").read().replace(INSTALLED, TRACEDB))
    return str(unit)


def _needs_systemd_analyze() -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here (Debian package systemd)")


def test_systemd_accepts_the_unit(tmp_path):
    _needs_systemd_analyze()
    r = subprocess.run(["systemd-analyze", "verify", _unit_here(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "tracedb.service" not in r.stderr, r.stderr


def test_systemd_rates_the_unit_at_most_medium(tmp_path):
    _needs_systemd_analyze()
    r = subprocess.run(["systemd-analyze", "security", "--offline=true", "--threshold=50", _unit_here(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    level = re.search(r"Overall exposure level for tracedb\.service: (\d+\.\d+)", r.stdout)
    assert level, r.stdout + r.stderr
    assert r.returncode == 0 and float(level.group(1)) <= 5.0, r.stdout


def test_the_web_view_and_otlp_listen_only_where_asked_with_the_current_option_names():
    argv = _exec_start()
    assert not {"--http-port", "--metrics-port", "--otlp-port"} & set(argv), argv
    (example,) = [line.lstrip("# ").split("=", 1)[1] for line in open(UNIT, encoding="utf-8")
                  if re.match(r"#\s+ExecStart=\S", line)]
    options = [w for w in shlex.split(example) if w.startswith("--")]
    assert "--http-port" in options and "--metrics-port" not in options
    help_text = subprocess.run([TRACEDB, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    for option in options:
        assert f"  {option} " in help_text, option


def test_its_exec_start_runs_a_recorder_that_stops_on_the_kill_signal(tmp_path):
    assert _unit()["Service"]["KillSignal"] == "SIGTERM"
    data_dir = tmp_path / "state"
    env = dict(os.environ, TRACEDB_DATA_DIR=str(data_dir))
    proc = subprocess.Popen(_exec_start(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: (data_dir / "tracedb.sock").exists() or proc.poll() is not None, 60, "the recorder to listen")
        assert proc.poll() is None, proc.stderr.read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()


# -- the sandbox ------------------------------------------------------------------------------


def _expand(name: str) -> set[str]:
    """A system call or @set, as systemd expands it (sets within sets included)."""
    if not name.startswith("@"):
        return {name}
    out = subprocess.run(["systemd-analyze", "syscall-filter", name], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        word = line.strip().split(" ")[0]
        if word and not word.startswith("#"):
            calls |= _expand(word)
    return calls


def _allowed_calls() -> set[str]:
    """What the unit's SystemCallFilter= lines allow: the first names the allowed sets, each `~`
    line takes calls away from them."""
    allowed: set[str] = set()
    for value in _service_values("SystemCallFilter"):
        deny = value.startswith("~")
        names = set().union(*(_expand(n) for n in value.lstrip("~").split()))
        allowed = allowed - names if deny else allowed | names
    return allowed


@pytest.fixture
def sandbox(tmp_path):
    """argv prefix running a command inside the unit's filter, MemoryDenyWriteExecute, empty
    capability bounding set, NoNewPrivileges and UMask (tests/sidecar/sandbox_exec.py)."""
    _needs_systemd_analyze()
    if ctypes.util.find_library("seccomp") is None:
        pytest.skip("libseccomp is not installed here (Debian package libseccomp2)")
    service = _unit()["Service"]
    assert service["SystemCallErrorNumber"] == "EPERM"  # what sandbox_exec.py does with other calls
    assert service["MemoryDenyWriteExecute"] == "yes" and service["CapabilityBoundingSet"] == ""
    assert service["NoNewPrivileges"] == "yes"

    def make(allowed: set[str]) -> list[str]:
        path = tmp_path / f"allowed-{len(allowed)}"
        path.write_text("\n".join(sorted(allowed)) + "\n")
        return [sys.executable, SANDBOX, str(path), service["UMask"], "--"]

    return make


AIO_PROBE = ("import sys; from wal.aio import default_syncer; "
             "sys.exit(0 if default_syncer(sys.argv[1]) is not None else 3)")


def test_the_wal_keeps_native_aio_inside_the_units_filter(sandbox, tmp_path):
    allowed = _allowed_calls()
    assert {"io_setup", "io_submit", "io_getevents", "io_destroy", "fdatasync", "eventfd2"} <= allowed
    env = dict(os.environ, PYTHONPATH=ROOT)
    probe = [sys.executable, "-c", AIO_PROBE, str(tmp_path)]
    r = subprocess.run(sandbox(allowed) + probe, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # The probe can tell: without io_setup the WAL would fall back to its fdatasync thread.
    r = subprocess.run(sandbox(allowed - {"io_setup"}) + probe, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr


def test_the_sandbox_is_in_force(sandbox, tmp_path):
    # What the filter and MemoryDenyWriteExecute refuse, seen from inside: so the recorder's run
    # below is a run under them, not beside them.
    target = tmp_path / "file"
    target.write_text("")
    code = (
        "import mmap, os, sys\n"
        "try:\n"
        "    mmap.mmap(-1, 4096, prot=mmap.PROT_WRITE | mmap.PROT_EXEC); print('wx: mapped')\n"
        "except PermissionError: print('wx: refused')\n"
        "try:\n"
        "    os.chown(sys.argv[1], os.getuid(), os.getgid()); print('chown: done')\n"
        "except PermissionError: print('chown: refused')\n"
        "print('capabilities:', open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
    )
    r = subprocess.run(sandbox(_allowed_calls()) + [sys.executable, "-c", code, str(target)],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.splitlines() == ["wx: refused", "chown: refused", "capabilities: 0000000000000000"], r.stderr


def test_the_recorder_records_and_stops_cleanly_inside_the_units_sandbox(sandbox, tmp_path):
    from tracedb.client import connect
    from tracedb.config import load_config
    from tracedb.reads.reader import Reader

    data_dir = tmp_path / "state"
    env = dict(os.environ, TRACEDB_DATA_DIR=str(data_dir), PYTHONPATH=ROOT)
    env.pop("TRACEDB_SIDECAR", None)
    proc = subprocess.Popen(sandbox(_allowed_calls()) + _exec_start(), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: (data_dir / "tracedb.sock").exists() or proc.poll() is not None, 60, "the recorder to listen")
        assert proc.poll() is None, proc.stderr.read().decode()
        with connect(f"unix:{data_dir / 'tracedb.sock'}") as client:
            ex = client.start("Sandboxed", {"intent": "Sandboxed"})
            for i in range(50):
                ex.event("tool.requested", {"name": "lookup", "i": i})
            ex.finish({"status": "success", "payload": {"answer": 42}})
            eid = ex.execution_id
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    log = err.decode()
    assert proc.returncode == 0, log
    assert '"level": "error"' not in log and "Operation not permitted" not in log, log
    with Reader.open(load_config(overrides={"data_dir": str(data_dir)})) as reader:
        record = reader.get(eid)
    assert record.status == "completed" and len(record.events) == 51
    # UMask=0077: nothing the recorder made is open to the group or to others.
    for where, dirs, files in os.walk(data_dir):
        for name in dirs + files:
            mode = stat.S_IMODE(os.lstat(os.path.join(where, name)).st_mode)
            assert mode & 0o077 == 0, (os.path.join(where, name), oct(mode))


def test_the_commented_http_and_otlp_listeners_serve_inside_the_units_sandbox(sandbox, tmp_path):
    import json
    import urllib.request

    (example,) = [line.lstrip("# ").split("=", 1)[1] for line in open(UNIT, encoding="utf-8")
                  if re.match(r"#\s+ExecStart=\S", line)]
    argv = example.replace(INSTALLED, TRACEDB).split()
    for option in ("--http-port", "--otlp-port"):
        argv[argv.index(option) + 1] = "0"  # any free port: the example's may be taken here
    data_dir = tmp_path / "state"
    env = dict(os.environ, TRACEDB_DATA_DIR=str(data_dir), PYTHONPATH=ROOT)
    proc = subprocess.Popen(sandbox(_allowed_calls()) + argv, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    urls: dict = {}
    try:
        while not {"ui", "otlp"} <= urls.keys():
            line = proc.stderr.readline()
            assert line, f"the recorder exited {proc.wait()} before it listened"
            urls.update({k: v for k, v in json.loads(line).items() if k in ("ui", "otlp")})
        with urllib.request.urlopen(urls["ui"] + "health", timeout=30) as r:
            assert r.status == 200
        # The listeners take the token the recorder keeps in its data directory (docs/security.md).
        bearer = {"Authorization": "Bearer " + (data_dir / "token").read_text().strip()}
        ui = urls["ui"].split("?", 1)[0]
        with urllib.request.urlopen(urllib.request.Request(ui, headers=bearer), timeout=30) as r:
            assert r.status == 200 and "tracedb" in r.read().decode()
        request = urllib.request.Request(urls["otlp"], data=b'{"resourceSpans": []}', method="POST",
                                         headers={"Content-Type": "application/json", **bearer})
        with urllib.request.urlopen(request, timeout=30) as r:
            assert r.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


# -- the user and who reaches the socket -------------------------------------------------------


def test_the_useradd_line_makes_a_system_user_without_a_login(tmp_path):
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd (run on a copy of /etc, not on this machine's accounts)")
    (line,) = [l.lstrip("# ").strip() for l in open(UNIT, encoding="utf-8") if l.lstrip("# ").startswith("useradd ")]
    etc = tmp_path / "etc"
    etc.mkdir()
    for name in ("passwd", "group", "shadow", "gshadow", "login.defs"):
        if os.path.exists(f"/etc/{name}"):
            shutil.copy(f"/etc/{name}", etc / name)
    if "tracedb:" in (etc / "passwd").read_text():
        pytest.skip("this machine already has a user tracedb")
    argv = shlex.split(line)
    r = subprocess.run([argv[0], "--prefix", str(tmp_path), *argv[1:]], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (entry,) = [l.split(":") for l in (etc / "passwd").read_text().splitlines() if l.startswith("tracedb:")]
    found = re.search(r"^SYS_UID_MAX\s+(\d+)", (etc / "login.defs").read_text(), re.M)
    assert int(entry[2]) <= (int(found.group(1)) if found else 999)  # a system user's uid
    assert entry[5] == _unit()["Service"]["Environment"].split("=", 1)[1] == "/var/lib/tracedb"
    assert entry[6] == "/usr/sbin/nologin"
    assert any(l.startswith(f"tracedb:x:{entry[3]}:") for l in (etc / "group").read_text().splitlines())


def test_only_the_recorders_own_user_reaches_its_socket(serve_process, tdir):
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to act as another user")
    os.chmod(tdir, 0o755)  # the directory lets anyone through: the socket's own mode is the guard
    srv = serve_process()
    probe = ("import socket, sys; s = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1]); print('connected')\n"
             "except PermissionError: print('refused')\n")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no python3 in /usr/bin for another user to run")

    def as_nobody() -> str:
        r = subprocess.run(["runuser", "-u", "nobody", "--", python, "-c", probe, srv.socket],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert stat.S_IMODE(os.stat(srv.socket).st_mode) == 0o600
    assert as_nobody() == "refused"
    # The same socket owned by that user: it connects. So the refusal was the socket's owner
    # and mode, not the path.
    import pwd

    os.chown(srv.socket, pwd.getpwnam("nobody").pw_uid, -1)
    assert as_nobody() == "connected"
    code, err = srv.terminate()
    assert code == 0, err
