"""`tracedb serve` as a real process, for every folder's tests: its log read as it comes, ready
once it said what the test waits for (the store open, or where each listener it was asked for
listens), stopped with SIGTERM or killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

import orjson

from tests.conftest import REPO as ROOT
from tests.waiting import wait_until

TRACEDB = [sys.executable, "-m", "tracedb"]

# What a developer's shell may hold that would send the process, or the clients it is tested
# with, somewhere else than the test's data directory.
_FOREIGN = ("TRACEDB_SIDECAR", "TRACEDB_TOKEN", "TRACEDB_DATA_DIR", "TRACEDB_CONFIG", "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS")

# Log messages that say where a listener listens, and the field holding its address.
_LISTENERS = {"tcp": ("listening", "tcp"), "http": ("http listening", "ui"), "otlp": ("otlp listening", "otlp")}


def serve_env(extra: Optional[dict] = None, data_dir: Optional[str] = None) -> dict:
    """This checkout's tracedb, none of _FOREIGN unless `extra` sets it, idle connections kept."""
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    env.update(PYTHONPATH=ROOT, TRACEDB_IDLE_TIMEOUT_S="0")
    if data_dir is not None:
        env["TRACEDB_DATA_DIR"] = data_dir
    env.update(extra or {})
    return env


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1].split("/")[0])


class Serve:
    """`tracedb --data-dir DIR serve ARGS`. `ready`: what to wait for, "store open" (its log
    line) and any of "tcp", "http", "otlp" (the port each listens on, from the JSON log, which
    they turn on). `stderr`: a file descriptor to log to instead, which the caller reads (then
    nothing is waited for; `seen` takes the lines it read)."""

    def __init__(self, data_dir: str, *args: str, env: Optional[dict] = None, ready=("store open",),
                 umask: Optional[int] = None, stderr=None, timeout: float = 60):
        self.data_dir = data_dir
        self.env = env or {}
        self.log: list[dict] = []  # each line, parsed when it is JSON, else {"msg": the line}
        self.lines: list[bytes] = []
        self.tcp = self.http = self.otlp = None
        self._ready = tuple(ready)
        log = ["--log-format", "json"] if set(self._ready) & set(_LISTENERS) else ["--log-level", "info"]
        self.proc = subprocess.Popen(
            [*TRACEDB, "--data-dir", data_dir, "serve", *log, *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr or subprocess.PIPE,
            env=serve_env(self.env), preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
        )
        self._reader = None
        if stderr is not None:
            return
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            wait_until(self._is_ready, timeout, "tracedb serve to say " + ", ".join(self._ready))
        except AssertionError:  # timed out
            self.kill()
            raise

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.seen(line)

    def seen(self, line: bytes) -> None:
        """One line of its log."""
        self.lines.append(line)
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            doc = {"msg": line.decode(errors="replace")}
        self.log.append(doc)
        for name, (msg, field) in _LISTENERS.items():
            if doc.get("msg") == msg and isinstance(doc.get(field), str):  # "listening": tcp null on the socket alone
                setattr(self, name, _port(doc[field]))

    def _is_ready(self) -> bool:
        said = all(
            any(b"store open" in line for line in list(self.lines)) if what == "store open"
            else getattr(self, what) is not None
            for what in self._ready
        )
        if said:
            return True
        if self.proc.poll() is not None:
            self._reader.join(5)
            raise RuntimeError(f"tracedb serve exited {self.proc.returncode}: {self.stderr()[-2000:]}")
        return False

    @property
    def socket(self) -> str:
        return os.path.join(self.data_dir, "tracedb.sock")

    @property
    def token(self) -> str:
        """TRACEDB_TOKEN when it was started with one, else the data directory's token file,
        which it made."""
        if self.env.get("TRACEDB_TOKEN"):
            return self.env["TRACEDB_TOKEN"]
        with open(os.path.join(self.data_dir, "token")) as f:
            return f.read().strip()

    @property
    def auth(self) -> dict:
        """The header a client sends the token in."""
        return {"Authorization": f"Bearer {self.token}"}

    def stderr(self) -> str:
        """What it logged so far."""
        return b"".join(self.lines).decode(errors="replace")

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM; its exit code once it stopped."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        if self._reader is not None:
            self._reader.join(timeout)
        return code

    def terminate(self, timeout: float = 60) -> tuple[int, str]:
        """SIGTERM; (exit code, what it logged)."""
        return self.stop(timeout), self.stderr()

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)
        if self._reader is not None:
            self._reader.join(60)


@contextmanager
def serving(data_dir: str, *args: str, **options) -> Iterator[Serve]:
    """`Serve(data_dir, *args, **options)` for the block, then stopped with SIGTERM: the stop is
    checked to be clean (exit code 0) once the block went through."""
    serve = Serve(data_dir, *args, **options)
    try:
        yield serve
    finally:
        code, err = serve.terminate()
    assert code == 0, err
