"""The asyncio side: dedup skips recorded through an async execution, fork on an AsyncStore, and
sync-only APIs refusing async handles loudly instead of dropping trace events."""

from __future__ import annotations

import asyncio

import pytest

import tracedb
from tracedb.errors import UsageError
from tracedb.replay.dedup import TOOL_DENIED, ReplayControl, ToolSpec
from tracedb.replay.eventlog import live_session
from tracedb.replay.exact import ReplayEngine
from tracedb.replay.forking import fork_async

Q = {"q": "capital of France"}
SEARCH = ToolSpec("web_search", True)


def test_async_dedup_records_the_skip(tmp_path):
    async def main():
        astore = await tracedb.open_async(str(tmp_path / "d"))
        try:
            ex = await astore.start("lookup", {"intent": "lookup"})
            rc = ReplayControl(execution=ex)
            assert await rc.agate("web_search", Q, SEARCH) is None
            rc.record_success("web_search", Q, SEARCH)
            denied = await rc.agate("web_search", Q, SEARCH, call_id="c2")
            assert denied.reason == "duplicate" and denied.call_id == "c2"
            with pytest.raises(UsageError, match="ashould_skip"):
                rc.should_skip("web_search", Q, SEARCH)
            await ex.finish({"status": "success", "payload": None})
            record = await astore.get(ex.execution_id)
        finally:
            await astore.close()
        return record

    record = asyncio.run(main())
    assert [e.type for e in record.events].count(TOOL_DENIED) == 1


def test_fork_async_shares_the_prefix_and_continues(tmp_path):
    async def main():
        astore = await tracedb.open_async(str(tmp_path / "d"))
        try:
            ex = await astore.start("lookup", {"intent": "lookup"})
            await ex.event("INTENT_RECEIVED", {"intent": "lookup"})
            await ex.event("ROUTER_DECISION", {"agent": "geo"})
            await ex.finish({"status": "success", "payload": "Paris"})
            f = await fork_async(astore, ex.execution_id, 1)
            assert await f.event("ROUTER_DECISION", {"agent": "math"}) == 2
            await f.finish({"status": "success", "payload": "forked"})
            with pytest.raises(UsageError):
                f.session()
            return await astore.get(f.execution_id), ex.execution_id
        finally:
            await astore.close()

    child, parent = asyncio.run(main())
    assert child.parentExecutionId == parent and child.forkedAtSeq == 1
    assert ReplayEngine(child).replay().payload == "forked"


def test_live_session_refuses_an_async_execution(tmp_path):
    async def main():
        astore = await tracedb.open_async(str(tmp_path / "d"))
        try:
            ex = await astore.start("lookup", {"intent": "lookup"})
            session = live_session(ex, tools={"web_search": lambda args: "Paris"})
            with pytest.raises(UsageError, match="synchronously"):
                session.tool("web_search", Q)
        finally:
            await astore.close()

    asyncio.run(main())
