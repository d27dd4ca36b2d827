"""Fixtures: `tracedb serve --otlp-port` as a real process, and OTLP helpers."""

from __future__ import annotations

import functools
import os
import subprocess
from typing import Optional

import orjson
import pytest

from tests.children import killed_after
from tests.serving import TRACEDB, Serve, serve_env



def env_for(data_dir: str, **extra: str) -> dict:
    return serve_env(extra, data_dir)


class OtlpServe(Serve):
    """`tracedb serve --otlp-port 0` on a data directory; `.port` is the OTLP port it bound."""

    def __init__(self, data_dir: str, *args: str, env: Optional[dict] = None,
                 otlp_args: tuple = ("--otlp-port", "0")):
        super().__init__(data_dir, *otlp_args, *args, env=env, ready=("otlp",))

    @property
    def port(self) -> Optional[int]:
        return self.otlp

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    @property
    def exporter_headers(self) -> str:
        """OTEL_EXPORTER_OTLP_HEADERS for an exporter of this receiver, as docs/otel.md writes
        it (the recorder's own log line writes the space as %20, which the SDK takes too)."""
        return f"Authorization=Bearer {self.token}"


@pytest.fixture
def otlp_serve(data_dir):
    """A factory of OTLP-receiving recorders on `data_dir`; all stopped after the test."""
    with killed_after(functools.partial(OtlpServe, data_dir)) as start:
        yield start


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
