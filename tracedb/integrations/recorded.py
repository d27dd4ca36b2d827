"""What the integrations share: the recorded execution a replay reads, the linked execution a
permissive replay records into, and recording calls made from a worker thread for an event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from typing import Any, Callable, Optional

import orjson

from .. import handles
from ..errors import NotReplayableError, UsageError
from ..record import ExecutionRecord
from ..replay.eventlog import ReplaySession, intent_of


def content_key(value: Any) -> str:
    """"sha256:<hex>" of `value` as JSON with sorted keys: equal content, equal key."""
    return "sha256:" + hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def load_record(source: Any, execution_id: Optional[str] = None, *, force: bool = False) -> ExecutionRecord:
    """The record to replay: `source` is an ExecutionRecord, or anything with `get(id)` (a
    `tracedb.reads.Reader`, a store, a recording client).

    A record that is not replayable (an execution that never finished: incomplete, or still
    running; invalidated; a recording failure) raises NotReplayableError, as `tracedb replay`
    does, unless `force`.
    """
    if isinstance(source, ExecutionRecord):
        record = source
    else:
        if execution_id is None:
            raise UsageError(
                "replay needs the id of the execution to replay",
                hint="pass execution_id=, or the ExecutionRecord itself",
            )
        getter = getattr(source, "get", None)
        if getter is None:
            raise UsageError(
                f"cannot read executions from {type(source).__name__}",
                hint="pass a tracedb.reads.Reader, a store (tracedb.open), a client, or an ExecutionRecord",
            )
        record = getter(execution_id)
        if inspect.isawaitable(record):
            _discard(record)
            raise UsageError(
                "replay reads its record synchronously and was given an asyncio reader",
                hint="pass the record itself: `record = await reader.get(execution_id)`",
            )
    if not force and record.header.replayable is not True:
        reason = record.header.replayableReason or f"status {record.status}"
        raise NotReplayableError(reason, execution_id=record.execution_id)
    return record


def is_async_recorder(recorder: Any) -> bool:
    """True for an asyncio recorder (`tracedb.open_async`, `tracedb.client.connect_async`)."""
    return inspect.iscoroutinefunction(getattr(recorder, "start", None))


def on_loop(loop: asyncio.AbstractEventLoop, make: Callable[[], Any]) -> Any:
    """From a worker thread: run the awaitable `make()` returns on `loop` and wait for its result.

    The awaitable is made on the loop itself, since the asyncio recorders submit their request as
    soon as it is made.
    """

    async def run() -> Any:
        return await make()

    return asyncio.run_coroutine_threadsafe(run(), loop).result()


class LoopExecution:
    """A sync handle over an asyncio execution, for code that runs on a worker thread while the
    execution's event loop runs: each call is awaited on the loop and waited for here."""

    def __init__(self, execution: handles.AsyncExecution, loop: asyncio.AbstractEventLoop):
        self.execution = execution
        self.loop = loop
        self.execution_id = execution.execution_id

    def event(self, type: str, payload: Any = None) -> int:
        """Record an event; returns its seq once durable."""
        return on_loop(self.loop, lambda: self.execution.event(type, payload))

    def finish(self, response: dict) -> int:
        """Record the final response; returns its seq once durable."""
        return on_loop(self.loop, lambda: self.execution.finish(response))


def linked_execution_factory(
    recorder: Any, record: ExecutionRecord, loop: Optional[asyncio.AbstractEventLoop] = None
) -> Optional[Callable[[], Any]]:
    """What a permissive replay calls at its first live call: a new execution on `recorder`,
    linked to the replayed one (parent_execution_id), as `tracedb.replay_session` makes.

    With an asyncio recorder the factory must run on a worker thread while `loop` runs.
    None when there is no recorder: the replay then records nothing.
    """
    if recorder is None:
        return None
    intent, envelope = intent_of(record), record.envelope
    parent = record.execution_id
    if is_async_recorder(recorder):

        def make_async() -> Any:
            if loop is None:
                raise UsageError(
                    "an asyncio recorder needs an asyncio client to record a permissive replay",
                    hint="use AsyncOpenAI with tracedb.open_async / connect_async, or a sync "
                    "recorder (tracedb.open, tracedb.client.connect) with the sync client",
                )
            ex = on_loop(loop, lambda: recorder.start(intent, envelope, parent_execution_id=parent))
            return LoopExecution(ex, loop)

        return make_async

    def make() -> Any:
        return recorder.start(intent, envelope, parent_execution_id=parent)

    return make


class ReplayCounts:
    """What a replay over a `ReplaySession` reports, for a class holding `record` and `session`."""

    record: Any
    session: ReplaySession

    @property
    def execution_id(self) -> str:
        """The replayed execution's id."""
        return self.record.execution_id

    @property
    def new_execution_id(self) -> Optional[str]:
        """Permissive mode: the execution the rerun is recorded into, once a live call made it."""
        return getattr(self.session.execution, "execution_id", None)

    @property
    def served(self) -> int:
        """Calls answered from the recording."""
        return self.session.served

    @property
    def consumed(self) -> bool:
        """Strict mode: True once every recorded call was asked again."""
        return self.session.consumed


def _discard(pending: Any) -> None:
    if hasattr(pending, "close"):
        pending.close()
