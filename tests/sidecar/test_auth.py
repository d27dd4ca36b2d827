"""Who may use a recorder: the owner of its data directory, not the other users of the machine.

Loopback TCP, OTLP and HTTP take the bearer token, kept in the data directory's file `token`,
where the owner's client and commands find it; the Unix socket is guarded by its mode. A
loopback HTTP listener answers only to loopback Host names. Real `tracedb serve` processes; the
other local user is `nobody`, through runuser (skipped, saying why, where that cannot be had).
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

import tracedb
from tests.waiting import wait_until
from tracedb.sidecar.client import Client, SidecarError, connect, connect_async

from tests.serving import Serve, serve_env

pytest.importorskip("opentelemetry.proto", reason="the OTLP listener needs the otel extra")
pytestmark = pytest.mark.timeout(180)

ENV = {"intent": "ProcessIntent", "payload": {"prompt": "the secret prompt"}}
# The other user runs the system's interpreter (standard library only): the test's own may live
# in a directory that nobody may enter.
SYSTEM_PYTHON = "/usr/bin/python3"


class Recorder(Serve):
    """`tracedb serve` with loopback TCP, --http-port and --otlp-port (ports the system picks),
    its JSON log read as it comes."""

    def __init__(self, data_dir: str, *args: str, env: dict | None = None, umask: int | None = None,
                 stderr=None):
        super().__init__(data_dir, "--tcp", "127.0.0.1:0", "--http-port", "0", "--otlp-port", "0", *args,
                         env=env, umask=umask, stderr=stderr, ready=("tcp", "http", "otlp"))


@pytest.fixture
def shared_dir():
    """A data directory that every user may enter (0755, as an umask of 022 makes one), in a
    parent they may enter too: only the token file's own mode keeps its token from them."""
    base = tempfile.mkdtemp(prefix="tdb")
    os.chmod(base, 0o755)
    data = os.path.join(base, "d")
    os.mkdir(data)
    os.chmod(data, 0o755)
    yield data
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def recorders():
    started: list[Recorder] = []

    def start(*args, **kw) -> Recorder:
        rec = Recorder(*args, **kw)
        started.append(rec)
        return rec

    yield start
    for rec in started:
        if rec.proc.poll() is None:
            rec.proc.kill()
            rec.proc.wait(60)


# What the other user tries: record over TCP (straight away, and after a guessed hello), read the
# web view, its API, /metrics and /health, post OTLP spans, and read the token file.
PROBE = r"""
import http.client, json, os, socket, sys
tcp, web, otlp, token_file = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
out = {"uid": os.getuid()}

def line(payload):
    s = socket.create_connection(("127.0.0.1", tcp), timeout=20)
    s.sendall(payload)
    return json.loads(s.makefile("rb").readline())

out["tcp_start"] = line(b'{"id": 1, "op": "start", "intent": "NotMine", "envelope": {}, "execution_id": "exec-nobody"}\n')
out["tcp_hello"] = line(b'{"id": 1, "op": "hello", "token": "a-guess"}\n')

def http_req(port, method, path, body=None, headers={}):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    return [r.status, r.read().decode("utf-8", "replace")]

out["web"] = {p: http_req(web, "GET", p) for p in
              ["/", "/counts", "/e/exec-secret", "/api/event?id=exec-secret&seq=1", "/api/rows?id=exec-secret",
               "/diff?a=exec-secret&b=exec-secret", "/metrics", "/health"]}
out["otlp"] = http_req(otlp, "POST", "/v1/traces", b"{}", {"Content-Type": "application/json"})
try:
    open(token_file).read()
    out["token_file"] = "read"
except OSError as e:
    out["token_file"] = type(e).__name__
print(json.dumps(out))
"""


def as_nobody(*args: str) -> dict:
    """Run PROBE as the local user nobody; what it saw."""
    if os.geteuid() != 0:
        pytest.skip("acting as another local user (runuser -u nobody) needs root")
    if shutil.which("runuser") is None or not os.path.exists(SYSTEM_PYTHON):
        pytest.skip(f"runuser or {SYSTEM_PYTHON} is missing: cannot run a client as another local user")
    r = subprocess.run(["runuser", "-u", "nobody", "--", SYSTEM_PYTHON, "-c", PROBE, *args],
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["uid"] != 0
    return out


def _record_a_secret(rec: Recorder) -> str:
    """Record an execution through the socket; return once the web view lists it (compacted)."""
    with Client("unix:" + rec.socket) as client:
        ex = client.start("ProcessIntent", ENV, execution_id="exec-secret")
        ex.event("llm.requested", {"prompt": "the secret prompt"})
    has_token = os.path.exists(os.path.join(rec.data_dir, "token"))
    auth = {"Authorization": f"Bearer {rec.token}"} if has_token else {}
    wait_until(lambda: "exec-secret" in httpx.get(f"http://127.0.0.1:{rec.http}/", headers=auth, timeout=30).text,
               30, "the recorder to compact the execution")
    return ex.execution_id


def test_another_local_user_is_refused_on_loopback_tcp_otlp_and_the_web_view(recorders, shared_dir):
    rec = recorders(shared_dir)
    _record_a_secret(rec)
    out = as_nobody(str(rec.tcp), str(rec.http), str(rec.otlp), os.path.join(shared_dir, "token"))
    assert out["tcp_start"]["ok"] is False and out["tcp_start"]["error"]["code"] == "unauthorized", out
    assert out["tcp_hello"]["error"]["code"] == "unauthorized", out
    for path, (status, body) in out["web"].items():
        if path == "/health":
            # Open to a probe, and it says whether the recorder can write: nothing of what it records.
            assert status == 200 and json.loads(body) == {"status": "ok"}, body
        else:
            assert status == 401, (path, status, body)
            assert "secret" not in body and "exec-secret" not in body
    assert out["otlp"][0] == 401, out["otlp"]
    assert out["token_file"] == "PermissionError"
    with Client("unix:" + rec.socket) as client:
        with pytest.raises(tracedb.ExecutionNotFoundError):
            client.get("exec-nobody")
    assert rec.stop() == 0


def test_the_owners_client_and_commands_find_the_token_themselves(recorders, tdir, monkeypatch):
    rec = recorders(tdir)
    path = os.path.join(tdir, "token")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    token = rec.token
    assert len(token) >= 40 and token.replace("-", "").replace("_", "").isalnum()
    address = f"tcp://127.0.0.1:{rec.tcp}"
    monkeypatch.delenv("TRACEDB_TOKEN", raising=False)
    with connect(address, data_dir=tdir) as client:
        ex = client.start("ProcessIntent", ENV)
        ex.event("tool.requested", {"name": "search"})
        ex.finish({"status": "success", "payload": {"answer": 42}})
        done = ex.execution_id

    async def record_async() -> str:
        client = await connect_async(address)  # the data directory from the environment
        try:
            ex = await client.start("ProcessIntent", ENV)
            await ex.event("tool.requested", {"name": "search"})
            return ex.execution_id
        finally:
            await client.close()

    monkeypatch.setenv("TRACEDB_DATA_DIR", tdir)
    running = asyncio.run(record_async())
    monkeypatch.delenv("TRACEDB_DATA_DIR")
    # The token is what lets them in: a wrong one is refused, and says where the right one is.
    with pytest.raises(SidecarError) as refused:
        connect(address, token="not-the-token", data_dir=tdir)
    assert refused.value.code == "unauthorized" and "token" in refused.value.hint
    # The commands that talk to the recorder, pointed at its TCP listener, no token typed.
    cli_env = serve_env({"TRACEDB_SIDECAR": address})

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", tdir, *args], capture_output=True,
                              text=True, timeout=120, env=cli_env, cwd="/")

    r = cli("invalidate", running, "--reason", "checked over TCP")
    assert r.returncode == 0 and f"invalidated {running}" in r.stdout, r.stderr
    r = cli("fork", done, "--at", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["live"] is True
    r = cli("demo", "--executions", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["executions"][0]["status"] == "completed"
    with Client("unix:" + rec.socket) as client:
        assert client.get(running).status == "invalidated"
    # The logs name where the token is, never the token.
    assert rec.stop() == 0
    text = json.dumps(rec.log)
    assert token not in text
    http_line = next(d for d in rec.log if d.get("msg") == "http listening")
    assert http_line["token"] == os.path.abspath(path) and "token=" not in http_line["ui"]


def test_the_token_file_is_private_whatever_the_umask_and_kept_across_restarts(recorders, tdir):
    data = os.path.join(tdir, "new", "d")  # nothing there yet
    rec = recorders(data, umask=0)
    path = os.path.join(data, "token")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700
    first = rec.token
    assert rec.stop() == 0
    rec = recorders(data, umask=0)
    assert rec.token == first, "a restart keeps the token its clients hold"
    assert not [n for n in os.listdir(data) if n.startswith(".token")], "no temp file left"
    with connect(f"tcp://127.0.0.1:{rec.tcp}", data_dir=data) as client:
        assert client.ping()
    assert rec.stop() == 0


def _make_token(data_dir: str, start, out) -> None:
    from tracedb.config import ensure_local_token

    start.wait(30)
    out.put(ensure_local_token(data_dir))


def test_listeners_starting_together_agree_on_one_token(tdir):
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    for attempt in range(5):
        data = os.path.join(tdir, f"d{attempt}")
        start, out = ctx.Barrier(8), ctx.Queue()
        procs = [ctx.Process(target=_make_token, args=(data, start, out)) for _ in range(8)]
        for p in procs:
            p.start()
        tokens = {out.get(timeout=60) for _ in procs}
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        with open(os.path.join(data, "token")) as f:
            assert tokens == {f.read().strip()}, "every listener holds the token its clients will read"
        assert sorted(os.listdir(data)) == ["token"]


def test_a_given_token_wins_and_no_token_file_is_made(recorders, tdir, tmp_path, monkeypatch):
    monkeypatch.delenv("TRACEDB_TOKEN", raising=False)
    rec = recorders(tdir, env={"TRACEDB_TOKEN": "given-by-env"})
    assert not os.path.exists(os.path.join(tdir, "token"))
    address = f"tcp://127.0.0.1:{rec.tcp}"
    with pytest.raises(SidecarError):
        connect(address, data_dir=tdir)  # the environment holds it, this client has none
    monkeypatch.setenv("TRACEDB_TOKEN", "given-by-env")
    with connect(address, data_dir=tdir) as client:
        assert client.ping()
    otlp_line = next(d for d in rec.log if d.get("msg") == "otlp listening")
    assert otlp_line["token"] == "$TRACEDB_TOKEN"
    assert "given-by-env" not in json.dumps(rec.log)
    assert rec.stop() == 0
    monkeypatch.delenv("TRACEDB_TOKEN")
    given = tmp_path / "token-file"
    given.write_text("given-by-file\n")
    rec = recorders(tdir, "--token-file", str(given))
    assert not os.path.exists(os.path.join(tdir, "token"))
    r = httpx.get(f"http://127.0.0.1:{rec.http}/", headers={"Authorization": "Bearer given-by-file"}, timeout=30)
    assert r.status_code == 200
    hint = next(d for d in rec.log if d.get("msg", "").startswith("exporters send the token"))["msg"]
    assert f"$(cat {given})" in hint and "given-by-file" not in hint
    assert rec.stop() == 0


def test_a_token_file_other_users_can_read_is_refused(tdir):
    path = os.path.join(tdir, "token")
    with open(path, "w") as f:
        f.write("leaked-token\n")
    os.chmod(path, 0o644)
    r = subprocess.run([sys.executable, "-m", "tracedb", "--data-dir", tdir, "serve", "--tcp", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60, env=serve_env())
    assert r.returncode == 1, r.stderr
    assert "error: the token file" in r.stderr and "can be read by other users (mode 0644)" in r.stderr
    assert f"hint: chmod 600 {path}" in r.stderr and "Traceback" not in r.stderr


def test_trusting_local_users_restores_token_free_loopback(recorders, shared_dir):
    rec = recorders(shared_dir, "--trust-local-users")
    assert not os.path.exists(os.path.join(shared_dir, "token"))
    _record_a_secret(rec)
    r = httpx.get(f"http://127.0.0.1:{rec.http}/", headers={"Host": "evil.example"}, timeout=30)
    assert r.status_code == 403, "trusting the local users does not trust every web page"
    out = as_nobody(str(rec.tcp), str(rec.http), str(rec.otlp), os.path.join(shared_dir, "token"))
    assert out["tcp_start"]["ok"] is True, out
    assert {p: s for p, (s, _b) in out["web"].items()} == {p: 200 for p in out["web"]}
    assert "exec-secret" in out["web"]["/"][1]
    assert "open_executions" in json.loads(out["web"]["/health"][1])
    assert out["otlp"][0] == 200, out["otlp"]
    assert rec.stop() == 0


ROUTES = ["/", "/counts", "/e/exec-secret", "/api/event?id=exec-secret&seq=1", "/api/rows?id=exec-secret",
          "/api/live?id=exec-secret", "/api/overview?id=exec-secret", "/diff", "/static/app.css", "/metrics",
          "/health", "/nowhere"]


def test_the_host_header_must_name_a_loopback_host_on_every_route(recorders, tdir):
    rec = recorders(tdir, "--allowed-host", "tracedb.test")
    _record_a_secret(rec)
    auth = {"Authorization": f"Bearer {rec.token}"}
    web, otlp = f"http://127.0.0.1:{rec.http}", f"http://127.0.0.1:{rec.otlp}/v1/traces"
    with httpx.Client(timeout=30, headers=auth) as http:
        for host in ("evil.example", f"evil.example:{rec.http}", "127.0.0.1.evil.example", "localhost.:1"):
            for path in ROUTES:
                r = http.get(web + path, headers={"Host": host})
                assert r.status_code == 403, (host, path, r.status_code)
                assert "Host header" in r.text and "--allowed-host" in r.text and "secret" not in r.text
            r = http.post(otlp, content=b"{}", headers={"Host": host, "Content-Type": "application/json"})
            assert r.status_code == 403, (host, "otlp")
        for host in (f"localhost:{rec.http}", f"127.0.0.1:{rec.http}", f"[::1]:{rec.http}", "localhost",
                     "LocalHost", "[::1]", "tracedb.test", f"TRACEDB.test:{rec.http}"):
            r = http.get(web + "/", headers={"Host": host})
            assert r.status_code == 200 and "exec-secret" in r.text, host
            r = http.post(otlp, content=b"{}", headers={"Host": host, "Content-Type": "application/json"})
            assert r.status_code == 200, host
    assert rec.stop() == 0


def test_health_says_only_the_status_without_the_token(recorders, tdir):
    rec = recorders(tdir)
    _record_a_secret(rec)
    url = f"http://127.0.0.1:{rec.http}/health"
    assert httpx.get(url, timeout=30).json() == {"status": "ok"}
    full = httpx.get(url, headers={"Authorization": f"Bearer {rec.token}"}, timeout=30).json()
    assert full["status"] == "ok" and full["open_executions"] == 1
    assert httpx.get(f"http://127.0.0.1:{rec.http}/metrics", timeout=30).status_code == 401
    assert "tracedb_open_executions 1.0" in httpx.get(
        f"http://127.0.0.1:{rec.http}/metrics", headers={"Authorization": f"Bearer {rec.token}"}, timeout=30).text
    assert rec.stop() == 0


def test_the_web_address_with_its_token_goes_to_the_owners_terminal_only(tdir):
    # On a terminal (the owner's), the log line holds the address to open, as `tracedb ui` prints
    # it; in a file or a journal, only where the token is.
    leader, follower = pty.openpty()
    rec = Recorder(tdir, stderr=follower)
    os.close(follower)
    try:
        buf = b""
        deadline = time.monotonic() + 60
        while b"otlp listening" not in buf:
            assert time.monotonic() < deadline, buf.decode(errors="replace")
            ready, _w, _x = select.select([leader], [], [], 1)
            if ready:
                buf += os.read(leader, 65536)
        for line in buf.splitlines():
            rec.seen(line)
        token = rec.token
        http_line = next(d for d in rec.log if d.get("msg") == "http listening")
        assert http_line["ui"] == f"http://127.0.0.1:{rec.http}/?token={token}"
        r = httpx.get(http_line["ui"], timeout=30)
        assert r.status_code == 303 and r.headers["location"] == "/"
    finally:
        rec.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # read the terminal until the recorder is gone
            ready, _w, _x = select.select([leader], [], [], 1)
            if ready:
                try:
                    if not os.read(leader, 65536):
                        break
                except OSError:  # EIO: the recorder closed its end
                    break
            elif rec.proc.poll() is not None:
                break
        assert rec.proc.wait(60) == 0
        os.close(leader)
