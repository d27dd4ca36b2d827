"""Fixtures: `tracedb serve --otlp-port` as a real process, and OTLP helpers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Optional

import orjson
import pytest

from tests.waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACEDB = [sys.executable, "-m", "tracedb"]


def env_for(data_dir: str, **extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, TRACEDB_DATA_DIR=data_dir, **extra)
    for key in ("TRACEDB_SIDECAR", "TRACEDB_TOKEN", "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS"):
        if key not in extra:
            env.pop(key, None)
    return env


class OtlpServe:
    """`tracedb serve --otlp-port 0` on a data directory; `.port` is the OTLP port it bound."""

    def __init__(self, data_dir: str, *args: str, env: Optional[dict] = None,
                 otlp_args: tuple = ("--otlp-port", "0")):
        self.data_dir = data_dir
        self.env = env or {}
        self.port: Optional[int] = None
        self.log: list[dict] = []
        self.proc = subprocess.Popen(
            [*TRACEDB, "--data-dir", data_dir, "serve", "--log-format", "json", *otlp_args, *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=env_for(data_dir, **{"TRACEDB_IDLE_TIMEOUT_S": "0", **(env or {})}),
        )
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        wait_until(self._listening, 60, "tracedb serve to listen for OTLP")

    def _read_log(self) -> None:
        for line in self.proc.stderr:
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                doc = {"msg": line.decode(errors="replace")}
            self.log.append(doc)
            if doc.get("msg") == "otlp listening":
                self.port = int(doc["otlp"].rsplit(":", 1)[1].split("/")[0])

    def _listening(self) -> bool:
        if self.port is not None:
            return True
        if self.proc.poll() is not None:
            self._reader.join(5)
            raise RuntimeError(f"tracedb serve exited {self.proc.returncode}: {self.log[-5:]}")
        return False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    @property
    def token(self) -> str:
        """The receiver's bearer token: TRACEDB_TOKEN when it was started with one, else the
        data directory's token file, which it made."""
        if self.env.get("TRACEDB_TOKEN"):
            return self.env["TRACEDB_TOKEN"]
        with open(os.path.join(self.data_dir, "token")) as f:
            return f.read().strip()

    @property
    def auth(self) -> dict:
        """The header an exporter sends the token in."""
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def exporter_headers(self) -> str:
        """OTEL_EXPORTER_OTLP_HEADERS for an exporter of this receiver, as docs/otel.md writes
        it (the recorder's own log line writes the space as %20, which the SDK takes too)."""
        return f"Authorization=Bearer {self.token}"

    def terminate(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(60)


@pytest.fixture
def otlp_serve(data_dir):
    """A factory of OTLP-receiving recorders on `data_dir`; all stopped after the test."""
    procs: list[OtlpServe] = []

    def start(*args: str, env: Optional[dict] = None) -> OtlpServe:
        p = OtlpServe(data_dir, *args, env=env)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()


def tracedb_cli(data_dir: str, *args: str, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Run a tracedb command against `data_dir` (next to a running recorder)."""
    return subprocess.run([*TRACEDB, "--data-dir", data_dir, *args], capture_output=True, text=True,
                          env=env_for(data_dir, **(env or {})), timeout=120)


def record_of(data_dir: str, execution_id: str) -> dict:
    """The execution's record with everything acknowledged so far. A running recorder is asked
    through its socket (its `get` compacts what is durable first: read commands next to a
    recorder see what it has compacted, which lags an acknowledgment by up to an interval);
    without one, `trace get` folds in the WAL itself."""
    sock = os.path.join(data_dir, "tracedb.sock")
    if os.path.exists(sock):
        from tracedb.client import RecorderUnavailableError, connect

        try:
            with connect(f"unix:{sock}") as client:
                return client.get(execution_id).to_dict()
        except RecorderUnavailableError:
            pass
    out = tracedb_cli(data_dir, "trace", "get", execution_id, "--json")
    assert out.returncode == 0, out.stderr
    return orjson.loads(out.stdout)


def sdk_provider(endpoint: str, service: str = "test-agent", **exporter_kwargs):
    """A TracerProvider exporting through the official OTLP/HTTP exporter to `endpoint`."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, **exporter_kwargs)))
    return provider
