"""A trace whose execution cannot be started (its service name cannot be an intent, its resource
cannot be stored in the envelope) has its spans rejected with the reason, as partial success;
the other traces of the same request are recorded."""

from __future__ import annotations

import secrets

import httpx
import pytest

from .conftest import record_of

pytestmark = pytest.mark.timeout(120)


def _resource_spans(service: str, extra: list, name: str) -> tuple[dict, str]:
    trace_id = secrets.token_hex(16)
    span = {"traceId": trace_id, "spanId": secrets.token_hex(8), "name": name, "kind": 1,
            "startTimeUnixNano": "1000", "endTimeUnixNano": "2000"}
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": service}}, *extra]}
    return {"resource": resource, "scopeSpans": [{"spans": [span]}]}, trace_id


@pytest.mark.parametrize("service, extra, why", [
    ("agent\x00nul", [], "NUL"),
    ("agent", [{"key": "gpu.load", "value": {"doubleValue": "NaN"}}], "NaN"),
])
def test_a_trace_that_cannot_start_is_rejected_and_the_others_are_recorded(otlp_serve, data_dir, service, extra, why):
    srv = otlp_serve()
    bad, bad_tid = _resource_spans(service, extra, "bad_root")
    good, good_tid = _resource_spans("good-agent", [], "good_root")
    r = httpx.post(srv.endpoint, json={"resourceSpans": [bad, good]}, headers=srv.auth, timeout=60)
    assert r.status_code == 200, r.text
    partial = r.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and why in partial["errorMessage"], partial
    rec = record_of(data_dir, f"otel-{good_tid}")
    assert rec["status"] == "completed" and rec["intent"] == "good-agent"
    # Nothing of the refused trace was written.
    from tracedb.client import connect

    with connect(f"unix:{srv.data_dir}/tracedb.sock") as client:
        with pytest.raises(Exception, match="no execution"):
            client.get(f"otel-{bad_tid}")
    assert srv.stop() == 0
