"""IntentusNet routes recorded as they happen.

IntentusNet's `IntentRouter` keeps each execution's record in memory (an
`InMemoryExecutionRecorder`) and hands it to its record store only when the route ends: an agent
killed mid-call leaves nothing, in its own FileExecutionStore and in any other store. `LiveRouter`
is an `IntentRouter` whose recorder also writes each event into tracedb the moment the router
records it, durable in the WAL before routing goes on:

    router = LiveRouter(registry, store)          # store = tracedb.open(...), or
    registry.register(MyAgent(definition, router))  # tracedb.client.connect() next to `tracedb serve`
    router.route_intent(env)                      # start, then each event, durable as it happens

A process killed mid-route leaves a trace with every event up to the kill; the next open of the
data directory (or `tracedb recover`; with a sidecar, its idle sweeper or its next start) marks it
incomplete and not replayable (`execution_incomplete`). A finished route is the same record IntentusNet would have saved, under
IntentusNet's own execution id, and `LiveRouter.records` (a `TraceDBExecutionStore`) loads it
back for IntentusNet's `ReplayEngine`.

Recording stays passive, as IntentusNet requires: an event tracedb refuses (a NaN in an agent's
payload, say) is recorded as `{"tracedb.refused": reason}` in its place, the execution is flagged
`recording_failure` with the reason, an error is logged, and routing goes on.

How the router is made to use it: `IntentRouter.route_intent` builds its recorder by calling the
name `InMemoryExecutionRecorder` of its module. `LiveRouter` installs there, once, a factory that
builds IntentusNet's own recorder as before, unless a `LiveRouter` is routing in the current
context, in which case it builds a `LiveExecutionRecorder` (a subclass of IntentusNet's). Other
routers in the process record exactly as they did.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from typing import Any, Optional

from tracedb.errors import TraceDBError, UsageError
from tracedb.program import pip_install
from tracedb.records.record import FINAL_RESPONSE, REASON_MANUALLY_INVALIDATED
from tracedb.interop.intentusnet import (
    TraceDBExecutionStore,
    header_meta,
    parse_record,
    record_dict,
    start_execution,
    to_plain,
    tracedb_event_type,
)

try:
    from intentusnet import IntentRouter
    from intentusnet.core import router as router_module
    from intentusnet.recording.recorder import InMemoryExecutionRecorder
except ImportError:  # pragma: no cover - exercised only without the package
    IntentRouter = InMemoryExecutionRecorder = router_module = None

log = logging.getLogger(__name__)

REFUSED_KEY = "tracedb.refused"

# The adapter of the LiveRouter routing in this context, if any.
_ROUTING: contextvars.ContextVar = contextvars.ContextVar("tracedb_live_router", default=None)
_install_lock = threading.Lock()


def _require_package() -> None:
    if IntentRouter is None:
        raise UsageError("the intentusnet package is not installed", hint=f"`{pip_install('intentusnet')}`")


class LiveExecutionRecorder(InMemoryExecutionRecorder or object):
    """IntentusNet's in-memory recorder that also records into tracedb as it goes: the start
    when it is created, then each event, durable in the WAL before the call returns."""

    def __init__(self, record, records: TraceDBExecutionStore):
        super().__init__(record)
        self.records = records
        self.store = records.store
        self.error: Optional[str] = None  # the first refusal, if any
        self.finished = False
        self._pending_invalidation: Optional[str] = None
        self._live_lock = threading.Lock()
        data = record_dict(record)
        # The header as it is now: createdUtcIso and envelopeHash are final; replayability is
        # what the route decides, so it is not kept.
        header = header_meta(data["header"])
        meta = {"intentusnet": {k: header[k] for k in ("createdUtcIso", "envelopeHash")}}
        p = parse_record({**data, "events": [], "finalResponse": None, "routerDecision": None})
        self.execution_id = p.execution_id
        # Events go through the handle: through a client, each carries its seq, so that one
        # resent after a reconnect is never recorded twice.
        self.handle = start_execution(self.store, p, meta)
        records.live[self.execution_id] = self

    def record_event(self, event_type: str, payload: Any) -> None:
        """IntentusNet's record_event, and the event into tracedb's WAL before it returns."""
        with self._live_lock:
            super().record_event(event_type, payload)
            seq = self.get_record().events[-1].seq
            if event_type == FINAL_RESPONSE:
                self._finish(payload)
                return
            try:
                type_ = tracedb_event_type(event_type, seq)
                self.handle.event(type_, to_plain(payload))
            except TraceDBError as e:
                self._refused(seq, event_type, e)

    def _refused(self, seq: int, event_type: str, e: TraceDBError) -> None:
        reason = f"event {seq} ({event_type}) refused: {e.message}"
        log.error("tracedb: execution %s: %s; recorded in its place and flagged", self.execution_id, reason)
        self._flag(reason, lambda: self.handle.event("intentusnet.refused", {REFUSED_KEY: reason}))

    def _flag(self, reason: str, record_instead) -> None:
        """Record `record_instead` and flag the execution recording_failure; a store that
        refuses even that (closed, or its WAL failed) is logged: routing goes on."""
        first = self.error is None
        if first:
            self.error = reason
        try:
            record_instead()
            if first:
                self.store.mark_recording_failure(self.execution_id, reason)
        except TraceDBError as e:
            log.error("tracedb: execution %s could not be recorded further: %s", self.execution_id, e)

    def _finish(self, response: Any) -> None:
        try:
            self.handle.finish(to_plain(response))
        except TraceDBError as e:
            reason = f"final response refused: {e.message}"
            log.error("tracedb: execution %s: %s", self.execution_id, reason)
            self._flag(reason, lambda: self.handle.finish({REFUSED_KEY: reason}))
        self.finished = True
        if self._pending_invalidation is not None:
            self.store.invalidate(self.execution_id, self._pending_invalidation)

    def close(self) -> str:
        """The router saves the record at the end of the route: everything is recorded already
        (or flagged); returns the execution id, as a record store's save does."""
        if not self.finished:
            # The router always records the final response before it saves; a caller that
            # saves earlier leaves the execution running, to be completed or swept.
            log.warning("tracedb: execution %s saved before its final response", self.execution_id)
        return self.execution_id

    def mark_not_replayable(self, reason: str) -> None:
        """IntentusNet's mark_not_replayable, recorded: manually_invalidated invalidates the
        execution once it is finished; any other reason flags it recording_failure now."""
        with self._live_lock:
            super().mark_not_replayable(reason)
            if reason == REASON_MANUALLY_INVALIDATED:
                if self.finished:
                    self.store.invalidate(self.execution_id, reason)
                else:
                    self._pending_invalidation = reason
            else:
                self.store.mark_recording_failure(self.execution_id, str(reason))


def _recorder_factory(record):
    records = _ROUTING.get()
    if records is None:
        return InMemoryExecutionRecorder(record)
    return LiveExecutionRecorder(record, records)


def _install() -> None:
    """Make IntentusNet's router module build its recorders through `_recorder_factory`."""
    with _install_lock:
        if getattr(router_module, "InMemoryExecutionRecorder", None) is not _recorder_factory:
            router_module.InMemoryExecutionRecorder = _recorder_factory


class LiveRouter(IntentRouter or object):
    """An IntentusNet `IntentRouter` that records each route into tracedb as it happens.

    `store` is a `tracedb.Store` (`tracedb.open(...)`), or a recording client
    (`tracedb.client.connect()`) to record through `tracedb serve`, which holds the data
    directory; the other arguments are IntentRouter's (`record_store` is this router's
    `records`, a `TraceDBExecutionStore` over `store`).
    """

    def __init__(self, registry, store, **kwargs):
        _require_package()
        if "record_store" in kwargs:
            raise UsageError("LiveRouter records into the tracedb store it is given; drop record_store")
        self.records = TraceDBExecutionStore(store)
        super().__init__(registry, record_store=self.records, **kwargs)
        _install()

    def route_intent(self, env):
        """IntentRouter.route_intent, with every event durable in tracedb as it is recorded."""
        token = _ROUTING.set(self.records)
        try:
            return super().route_intent(env)
        finally:
            _ROUTING.reset(token)
