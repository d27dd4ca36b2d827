"""Per-turn dedup of repeated tool calls (a ReplayControl, its decision table exactly).

| Condition                                  | Decision                                   |
|--------------------------------------------|--------------------------------------------|
| Tool is non-idempotent                     | Always allow (never skip)                  |
| Idempotent, first call                     | Allow                                      |
| Idempotent, prior call succeeded           | Skip: ToolDenied(reason="duplicate")       |
| Idempotent, prior call failed or timed out | Allow (retry)                              |
| Idempotent, prior call was denied          | Allow (denied calls are no prior success)  |

A tool without a ToolSpec (registry miss) is idempotent. One ReplayControl per turn. Given an
execution handle (anything with `event(type, payload)`, such as the store's execution), every skip
is recorded in the trace as a `tool.denied` event.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Union

from tracedb.errors import UsageError

TOOL_DENIED = "tool.denied"
DUPLICATE = "duplicate"

# Outcomes kept per call key.
SUCCESS = "success"
FAILURE = "failure"
TIMEOUT = "timeout"
DENIED = "denied"


@dataclass(frozen=True)
class ToolSpec:
    """A tool's declaration; `idempotent=False` means a second call has a second effect."""

    name: str
    idempotent: bool = True


@dataclass(frozen=True)
class ToolDenied:
    """The outcome returned instead of executing a call (reason "duplicate" for a dedup skip)."""

    call_id: Optional[str]
    tool_name: str
    reason: str
    details: Optional[str] = None


def call_key(tool_name: str, arguments: Any) -> str:
    """The dedup key: md5 of f"{name}:{json.dumps(arguments, sort_keys=True)}" (as ReplayControl keys calls)."""
    raw = f"{tool_name}:{json.dumps(arguments, sort_keys=True)}"
    return hashlib.md5(raw.encode()).hexdigest()


Registry = Union[Mapping[str, ToolSpec], Iterable[ToolSpec], None]


class ReplayControl:
    """Decides whether a tool call repeats a prior successful idempotent call in the same turn."""

    def __init__(self, registry: Registry = None, *, execution: Any = None):
        if registry is None:
            self._registry: Dict[str, ToolSpec] = {}
        elif isinstance(registry, Mapping):
            self._registry = dict(registry)
        else:
            self._registry = {spec.name: spec for spec in registry}
        self._execution = execution
        # call key -> outcome of the calls with that key so far (SUCCESS sticks, see _record).
        self._history: Dict[str, str] = {}

    def _spec(self, tool_name: str, spec: Optional[ToolSpec]) -> Optional[ToolSpec]:
        return spec if spec is not None else self._registry.get(tool_name)

    def _idempotent(self, tool_name: str, spec: Optional[ToolSpec]) -> bool:
        found = self._spec(tool_name, spec)
        # Registry miss: conservative dedup, as the original harness did.
        return True if found is None else found.idempotent

    def _decide(
        self, tool_name: str, arguments: Any, spec: Optional[ToolSpec]
    ) -> Tuple[bool, Optional[str], Optional[dict]]:
        if not self._idempotent(tool_name, spec):
            return False, None, None
        key = call_key(tool_name, arguments)
        if self._history.get(key) != SUCCESS:
            return False, None, None
        details = f"{tool_name} already succeeded with the same arguments in this turn (call key {key})"
        payload = {
            "tool": tool_name,
            "arguments": arguments,
            "reason": DUPLICATE,
            "details": details,
            "call_key": key,
        }
        return True, details, payload

    def should_skip(
        self, tool_name: str, arguments: Any, spec: Optional[ToolSpec] = None
    ) -> Tuple[bool, Optional[str]]:
        """(True, details) when the call repeats a prior success of an idempotent tool, else (False, None).

        A skip is recorded as a `tool.denied` event in the execution, when one was given (an
        asyncio execution needs `await ashould_skip(...)` instead).
        """
        skip, details, payload = self._decide(tool_name, arguments, spec)
        if payload is not None and self._execution is not None:
            pending = self._execution.event(TOOL_DENIED, payload)
            if inspect.isawaitable(pending):
                # Never drop the trace event silently: an un-awaited coroutine records nothing.
                if hasattr(pending, "close"):
                    pending.close()
                raise UsageError(
                    "ReplayControl.should_skip() got an asyncio execution handle",
                    hint="use `await control.ashould_skip(...)` / `await control.agate(...)`",
                )
        return skip, details

    async def ashould_skip(
        self, tool_name: str, arguments: Any, spec: Optional[ToolSpec] = None
    ) -> Tuple[bool, Optional[str]]:
        """should_skip for an asyncio execution handle: the skip event is awaited."""
        skip, details, payload = self._decide(tool_name, arguments, spec)
        if payload is not None and self._execution is not None:
            pending = self._execution.event(TOOL_DENIED, payload)
            if inspect.isawaitable(pending):
                await pending
        return skip, details

    def gate(
        self,
        tool_name: str,
        arguments: Any,
        spec: Optional[ToolSpec] = None,
        *,
        call_id: Optional[str] = None,
    ) -> Optional[ToolDenied]:
        """should_skip as the harness uses it: a ToolDenied(reason="duplicate") to return, or None to run."""
        skip, details = self.should_skip(tool_name, arguments, spec)
        if not skip:
            return None
        return ToolDenied(call_id=call_id, tool_name=tool_name, reason=DUPLICATE, details=details)

    async def agate(
        self,
        tool_name: str,
        arguments: Any,
        spec: Optional[ToolSpec] = None,
        *,
        call_id: Optional[str] = None,
    ) -> Optional[ToolDenied]:
        """gate for an asyncio execution handle."""
        skip, details = await self.ashould_skip(tool_name, arguments, spec)
        if not skip:
            return None
        return ToolDenied(call_id=call_id, tool_name=tool_name, reason=DUPLICATE, details=details)

    def _record(self, tool_name: str, arguments: Any, outcome: str) -> None:
        key = call_key(tool_name, arguments)
        # A success is never downgraded: the work was done, so a later failure, timeout or denial
        # of the same call (only possible when a caller ignored should_skip) must not re-open it.
        if self._history.get(key) != SUCCESS:
            self._history[key] = outcome

    def record_success(self, tool_name: str, arguments: Any, spec: Optional[ToolSpec] = None) -> None:
        """The call ran and succeeded: an identical idempotent call is a duplicate from now on."""
        self._record(tool_name, arguments, SUCCESS)

    def record_failure(self, tool_name: str, arguments: Any, spec: Optional[ToolSpec] = None) -> None:
        """The call ran and failed: a retry is allowed."""
        self._record(tool_name, arguments, FAILURE)

    def record_timeout(self, tool_name: str, arguments: Any, spec: Optional[ToolSpec] = None) -> None:
        """The call timed out: a retry is allowed."""
        self._record(tool_name, arguments, TIMEOUT)

    def record_denied(self, tool_name: str, arguments: Any, spec: Optional[ToolSpec] = None) -> None:
        """The call was denied (by policy): it does not count as a prior success."""
        self._record(tool_name, arguments, DENIED)

    def outcome(self, tool_name: str, arguments: Any) -> Optional[str]:
        """The outcome kept for a call ("success", "failure", "timeout", "denied"), None if unseen."""
        return self._history.get(call_key(tool_name, arguments))

    def history_size(self) -> int:
        """Number of distinct (name, arguments) pairs with a recorded outcome."""
        return len(self._history)
