"""Fork: a new execution that shares its parent's events up to a seq, then runs live.

The fork's first events are copies of the parent's events 1..at_seq (same types, same payloads,
`request_seq` references renumbered to the fork's seqs), and its trace row records the lineage
(`parent_execution_id`, `forked_at_seq`). The store keeps a parent with existing forks out of
`prune`, so a fork's lineage never points at a deleted trace.

After `fork()`, either record new events straight into it (`f.event(...)`, `f.finish(...)`, or by
id through the store or the sidecar), or re-run the agent code through `f.session()`: calls up to
the fork point are served from the copied prefix (strict by default: the fork's value is its
shared lineage with the parent), later calls run live and land in the fork.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional

from tracedb.errors import InvalidInputError, UsageError
from tracedb.recorder.handles import AsyncExecution
from tracedb.records.record import FINAL_RESPONSE, LLM_RESPONDED, TOOL_RESPONDED, ExecutionEvent, ExecutionRecord
from tracedb.replay.eventlog import ReplaySession, intent_of

_RESPONSES = (LLM_RESPONDED, TOOL_RESPONDED)


@dataclass
class Fork:
    """A fork just made: its live execution handle, its lineage and the prefix it shares."""

    execution: Any
    parent_execution_id: str
    forked_at_seq: int
    prefix: List[ExecutionEvent]
    seq_map: Dict[int, int] = field(default_factory=dict)  # parent seq -> fork seq

    @property
    def execution_id(self) -> str:
        """The fork's own execution id."""
        return self.execution.execution_id

    def event(self, type: str, payload: Any) -> Any:
        """Record a new event in the fork; returns its seq (a coroutine for an asyncio fork)."""
        return self.execution.event(type, payload)

    def finish(self, response: Mapping[str, Any]) -> Any:
        """Record the fork's final response (a coroutine for an asyncio fork)."""
        return self.execution.finish(response)

    def session(
        self,
        *,
        strict: bool = True,
        llm: Optional[Callable[[Mapping[str, Any]], Any]] = None,
        tools: Optional[Mapping[str, Callable[[Any], Any]]] = None,
    ) -> ReplaySession:
        """A session that replays the shared prefix, then runs live into the fork."""
        if isinstance(self.execution, AsyncExecution):
            raise UsageError(
                "replay sessions record synchronously; this fork was made with fork_async",
                hint="make the fork with fork(store, ...) on a sync store to re-run agent code in it",
            )
        return ReplaySession(
            self.prefix,
            strict=strict,
            llm=llm,
            tools=tools,
            sink=self.execution,
            live_after_log=True,
            log_in_sink=self.seq_map,
        )

    def to_dict(self) -> dict:
        """The JSON shape printed by `tracedb fork --json`."""
        return {
            "execution_id": self.execution_id,
            "parent_execution_id": self.parent_execution_id,
            "forked_at_seq": self.forked_at_seq,
            "copied_events": len(self.prefix),
        }


def check_fork_point(parent: ExecutionRecord, at_seq: int) -> List[ExecutionEvent]:
    """The parent's events up to `at_seq`; InvalidInputError when the fork point is not usable."""
    if isinstance(at_seq, bool) or not isinstance(at_seq, int) or at_seq < 0:
        raise InvalidInputError(
            f"fork point must be a seq >= 0, not {at_seq!r}",
            hint="list the events with `tracedb trace get ID` and pick one seq",
        )
    seqs = [e.seq for e in parent.events]
    final_seqs = [e.seq for e in parent.events if e.type == FINAL_RESPONSE]
    if final_seqs and at_seq >= final_seqs[0]:
        raise InvalidInputError(
            f"cannot fork {parent.execution_id!r} at seq {at_seq}: its final response is seq {final_seqs[0]}",
            hint=f"fork at a seq below {final_seqs[0]}; a fork continues before the end",
        )
    if at_seq != 0 and at_seq not in seqs:
        last = seqs[-1] if seqs else 0
        raise InvalidInputError(
            f"execution {parent.execution_id!r} has no event with seq {at_seq} (last seq {last})",
            hint="list the events with `tracedb trace get ID` and pick one seq",
        )
    return [e for e in parent.events if e.seq <= at_seq]


def _start_fork(start: Any, parent: ExecutionRecord, at_seq: int, new_execution_id: Optional[str]) -> Any:
    """Call `start` (Store.start, or AsyncStore.start whose result is awaited) for a fork of `parent`."""
    return start(
        intent_of(parent),
        parent.envelope,
        new_execution_id,
        parent_execution_id=parent.execution_id,
        forked_at_seq=at_seq,
    )


def fork(
    store: Any, execution_id: str, at_seq: int, *, new_execution_id: Optional[str] = None
) -> Fork:
    """Make a new execution sharing `execution_id`'s events up to `at_seq`, with its lineage.

    `at_seq=0` shares nothing (a fresh run with the same intent and envelope, linked to the
    parent). The fork is left running: record into it, or re-run through `Fork.session()`.
    """
    parent = store.get(execution_id)
    prefix = check_fork_point(parent, at_seq)
    ex = _start_fork(store.start, parent, at_seq, new_execution_id)
    seq_map: Dict[int, int] = {}
    for e in prefix:
        seq_map[e.seq] = ex.event(e.type, _renumbered(e, seq_map))
    return Fork(ex, parent.execution_id, at_seq, prefix, seq_map)


async def fork_async(
    astore: Any, execution_id: str, at_seq: int, *, new_execution_id: Optional[str] = None
) -> Fork:
    """`fork` for an AsyncStore (`await tracedb.open_async(...)`); the fork's handle is async."""
    parent = await astore.get(execution_id)
    prefix = check_fork_point(parent, at_seq)
    ex = await _start_fork(astore.start, parent, at_seq, new_execution_id)
    seq_map: Dict[int, int] = {}
    for e in prefix:
        seq_map[e.seq] = await ex.event(e.type, _renumbered(e, seq_map))
    return Fork(ex, parent.execution_id, at_seq, prefix, seq_map)


def _renumbered(e: ExecutionEvent, seq_map: Mapping[int, int]) -> Any:
    # A copied answer must point at the copied request's seq in the fork.
    payload = e.payload
    if e.type in _RESPONSES and isinstance(payload, Mapping) and payload.get("request_seq") in seq_map:
        payload = {**payload, "request_seq": seq_map[payload["request_seq"]]}
    return payload
