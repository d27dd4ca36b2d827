"""The receiver in-process on a real store and real sockets: overload answers 429 and shutdown
503, both with Retry-After, and nothing is recorded for them."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import tracedb
from tests.waiting import wait_until_async

from .spans import agent_run, protobuf_body, trace_hex

pytest.importorskip("opentelemetry.proto")
pytestmark = pytest.mark.timeout(120)
PB = {"Content-Type": "application/x-protobuf"}


def test_overload_is_429_and_shutdown_503_with_retry_after(tmp_path):
    from tracedb.otel.receiver import start_receiver

    async def main():
        astore = await tracedb.open_async(str(tmp_path / "d"), config={"idle_timeout_s": 0})
        draining = False
        endpoint, receiver = await start_receiver(astore.store, max_inflight_requests=1,
                                                  draining=lambda: draining)
        url = f"http://127.0.0.1:{endpoint.port}/v1/traces"
        spans = agent_run()
        body = protobuf_body(spans)
        release = asyncio.Event()

        async def slow_body():  # a request that holds the only slot while its body trickles in
            yield body[:10]
            await release.wait()
            yield body[10:]

        try:
            async with httpx.AsyncClient(timeout=30) as http:
                slow = asyncio.create_task(http.post(url, content=slow_body(), headers=PB))
                await wait_until_async(lambda: receiver.inflight == 1, 10, "the slow request to be in flight")
                busy = await http.post(url, content=protobuf_body(agent_run()), headers=PB)
                assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
                release.set()
                assert (await slow).status_code == 200
                draining = True
                late = await http.post(url, content=protobuf_body(agent_run()), headers=PB)
                assert late.status_code == 503 and late.headers["retry-after"] == "1"
        finally:
            await endpoint.close()
        listed = await astore.list()
        assert [r.execution_id for r in listed] == [f"otel-{trace_hex(spans)}"]
        await astore.close()

    asyncio.run(main())


def test_the_same_spans_in_concurrent_requests_are_stored_once(tmp_path):
    from tracedb.otel.receiver import start_receiver

    async def main():
        astore = await tracedb.open_async(str(tmp_path / "d"), config={"idle_timeout_s": 0})
        endpoint, _receiver = await start_receiver(astore.store)
        url = f"http://127.0.0.1:{endpoint.port}/v1/traces"
        spans = agent_run()
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                # Nine overlapping requests at once: the first to reach the new trace starts its
                # execution, the others wait for that, and each span is staged by one of them.
                children, root = spans[:3], spans[3:]
                bodies = [protobuf_body(children), protobuf_body(children[:2]), protobuf_body(children[1:])] * 3
                answers = await asyncio.gather(*(http.post(url, content=b, headers=PB) for b in bodies))
                answers.append(await http.post(url, content=protobuf_body(root), headers=PB))
        finally:
            await endpoint.close()
        assert [r.status_code for r in answers] == [200] * (len(bodies) + 1)
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        for r in answers:  # none refused: every copy was recorded, or found recorded
            resp = ExportTraceServiceResponse()
            resp.ParseFromString(r.content)
            assert resp.partial_success.rejected_spans == 0, resp.partial_success.error_message
        rec = await astore.get(f"otel-{trace_hex(spans)}")
        assert rec.status == "completed"
        per_span = {}
        for e in rec.events[:-1]:
            per_span.setdefault(e.payload["span_id"], []).append(e.type)
        assert sorted(map(tuple, per_span.values())) == sorted([
            ("llm.requested", "llm.responded"), ("tool.requested", "tool.responded"),
            ("llm.requested", "llm.responded"), ("otel.invoke_agent",)])
        assert [e.seq for e in rec.events] == list(range(1, 9))
        await astore.close()

    asyncio.run(main())
