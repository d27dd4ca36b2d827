"""Exact replay: give back the recorded final response, never call an agent or a model.

    Given an ExecutionRecord R with status=completed and replayable=true,
    replay(R) returns R.finalResponse exactly, with no agent execution.

`ReplayEngine` follows IntentusNet's engine; `replay_execution`, `CachingReplayEngine` and `batch_replay`
replay by execution id from a store (anything with `get(execution_id)`, or IntentusNet's `load`).

The hot path is `ReplayEngine.replay()` on an engine that has replayed before: the structural
checks run once per engine and are cached, and the recorded objects are handed back as they are
(no copy, no JSON round trip). Callers must treat a result as read-only; it shares its payload with
the record (and, through `CachingReplayEngine`, with every other caller).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from tracedb.errors import (
    NotReplayableError,
    RecordCorruptedError,
    ReplayHashMismatchError,
)
from tracedb.records.record import (
    REASON_EXECUTION_INCOMPLETE,
    REASON_RECORD_CORRUPTED,
    ExecutionRecord,
    compute_envelope_hash,
    normalize_envelope_hash,
    stored_envelope_hash,
)

FORCED_REPLAY_WARNING = "Forced replay of non-replayable record"


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What exact replay returns: the recorded payload and metadata, marked as coming from replay.

    `response` is the recorded finalResponse itself (None for a forced replay of an incomplete
    execution), so an error response stays visible as an error: see `status` and `error`.
    """

    payload: Optional[Any]
    metadata: Dict[str, Any]
    fromReplay: bool = True
    originalExecutionId: str = ""
    originalTimestamp: Optional[str] = None
    warnings: List[str] = field(default_factory=list)
    response: Optional[Dict[str, Any]] = None

    @property
    def status(self) -> Optional[str]:
        """The recorded response's status ("success", "error", ...), None if it recorded none."""
        r = self.response
        return r.get("status") if r is not None else None

    @property
    def error(self) -> Optional[Any]:
        """The recorded error object of an error response, else None."""
        r = self.response
        return r.get("error") if r is not None else None

    @property
    def is_error(self) -> bool:
        """True when the recorded response was an error: replay returns the error, not success."""
        return self.status == "error" or self.error is not None

    def to_dict(self) -> dict:
        """The JSON shape printed by `tracedb replay --json`."""
        return {
            "payload": self.payload,
            "metadata": self.metadata,
            "fromReplay": self.fromReplay,
            "originalExecutionId": self.originalExecutionId,
            "originalTimestamp": self.originalTimestamp,
            "warnings": list(self.warnings),
            "response": self.response,
        }


@dataclass(frozen=True, slots=True)
class EnvelopeVerifyResult:
    """Outcome of comparing a recorded envelope hash with a provided one (IntentusNet's VerifyResult).

    Named apart from the store's `tracedb.VerifyResult` (database verification); `VerifyResult`
    in this module is IntentusNet's name for it.
    """

    match: bool
    recorded_hash: Optional[str] = None
    provided_hash: Optional[str] = None
    error: Optional[str] = None


VerifyResult = EnvelopeVerifyResult


def verify_envelope(recorded: Optional[str], provided: str) -> EnvelopeVerifyResult:
    """Compare two envelope hashes; a mismatch says the envelope changed since the execution."""
    if normalize_envelope_hash(recorded) == normalize_envelope_hash(provided):
        return EnvelopeVerifyResult(match=True)
    return EnvelopeVerifyResult(
        match=False,
        recorded_hash=recorded,
        provided_hash=provided,
        error="Envelope modified since original execution",
    )


def envelope_matches(envelope: Any, envelope_hash: Optional[str], meta: Any) -> bool:
    """True when `envelope` still hashes to `envelope_hash` (or, when redaction rewrote it before
    it was stored, to the hash `meta` keeps: `stored_envelope_hash`)."""
    try:
        computed = compute_envelope_hash(envelope)
    except (TypeError, ValueError, AttributeError):
        return False
    return computed == stored_envelope_hash(envelope_hash, meta)


def verify_record_integrity(record: ExecutionRecord) -> bool:
    """True when the record's envelope still hashes to the header's envelope hash."""
    return envelope_matches(record.envelope, record.header.envelopeHash, getattr(record, "meta", None))


def seqs_increasing(seqs: Iterable[Any]) -> bool:
    """True when the seq numbers are strictly increasing (and positive)."""
    last_seq = 0
    for seq in seqs:
        if type(seq) is not int or seq <= last_seq:
            return False
        last_seq = seq
    return True


def verify_event_sequence(record: ExecutionRecord) -> bool:
    """True when the events' seq numbers are strictly increasing (and positive)."""
    return seqs_increasing(event.seq for event in record.events)


def value_problems(
    envelope: Any, envelope_hash: Optional[str], meta: Any, seqs: Optional[List[Any]], final_response: Any
) -> List[str]:
    """Every integrity problem of a record's stored values, in words: its envelope, the header's
    envelope hash, its meta, its events' seq numbers in order (None: the events are not a list)
    and its final response. A listing judges rows by this without building their records."""
    problems: List[str] = []
    if not isinstance(envelope, dict):
        problems.append("envelope is not an object")
    elif not envelope_matches(envelope, envelope_hash, meta):
        problems.append("envelope hash does not match the envelope")
    if seqs is None:
        problems.append("events is not a list")
    elif not seqs_increasing(seqs):
        problems.append("event seq numbers are not strictly increasing")
    if final_response is not None and not isinstance(final_response, dict):
        problems.append("finalResponse is not an object")
    elif final_response is not None and not isinstance(final_response.get("metadata", {}), dict):
        problems.append("finalResponse.metadata is not an object")
    return problems


def record_problems(record: ExecutionRecord) -> List[str]:
    """Every structural or integrity problem of a record, in words; empty when it is sound."""
    header = getattr(record, "header", None)
    if header is None or not isinstance(getattr(header, "executionId", None), str):
        return ["header missing or without executionId"]
    events = record.events
    seqs = [event.seq for event in events] if isinstance(events, list) else None
    return value_problems(record.envelope, header.envelopeHash, getattr(record, "meta", None), seqs,
                          record.finalResponse)


def _envelope_dict(env: Any) -> dict:
    # IntentusNet passes an IntentEnvelope with to_dict(); plain dicts are the common case here.
    if isinstance(env, dict):
        return env
    to_dict = getattr(env, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise TypeError(f"envelope must be a dict or have to_dict(), not {type(env).__name__}")


class ReplayEngine:
    """Replays one ExecutionRecord exactly: its recorded final response, no agent call."""

    __slots__ = ("_record", "_validated", "_problems", "_replayable")

    def __init__(self, record: ExecutionRecord):
        self._record = record
        self._validated = False
        self._problems: List[str] = []
        # (ok, reason) once computed; the record is read-only to the engine, so it never changes.
        self._replayable: Optional[Tuple[bool, Optional[str]]] = None

    @property
    def record(self) -> ExecutionRecord:
        """The record this engine replays."""
        return self._record

    def _validate_structure(self) -> bool:
        if not self._validated:
            self._problems = record_problems(self._record)
            self._validated = True
        return not self._problems

    @property
    def problems(self) -> List[str]:
        """The record's integrity problems (empty when it is sound)."""
        self._validate_structure()
        return list(self._problems)

    def is_replayable(self) -> Tuple[bool, Optional[str]]:
        """Check if record is safe to replay: (True, None) or (False, reason)."""
        cached = self._replayable
        if cached is not None:
            return cached
        record = self._record
        header = record.header
        # The header's own verdict comes first when it names a reason: state 4 of the replay contract (an
        # invalidated record, possibly without a final response) must report
        # manually_invalidated, not execution_incomplete.
        if not header.replayable and header.replayableReason:
            result: Tuple[bool, Optional[str]] = (False, header.replayableReason)
        elif record.finalResponse is None:
            result = (False, REASON_EXECUTION_INCOMPLETE)
        elif not header.replayable:
            result = (False, header.replayableReason)
        elif not self._validate_structure():
            result = (False, REASON_RECORD_CORRUPTED)
        else:
            result = (True, None)
        self._replayable = result
        return result

    def _not_replayable(self, reason: Optional[str]) -> NotReplayableError:
        execution_id = self._record.header.executionId
        if reason == REASON_RECORD_CORRUPTED:
            return RecordCorruptedError(self.problems, execution_id=execution_id)
        return NotReplayableError(reason, execution_id=execution_id)

    def replay(self, env: Any = None, force: bool = False) -> ReplayResult:
        """Return the recorded response without re-execution.

        Raises NotReplayableError (RecordCorruptedError for a corrupted record) unless `force`;
        a forced replay carries the warning "Forced replay of non-replayable record". When `env`
        is given, its hash must equal the recorded envelope hash (ReplayHashMismatchError).
        """
        ok, reason = self.is_replayable()
        warnings: List[str]
        if ok:
            warnings = []
        elif force:
            warnings = [FORCED_REPLAY_WARNING]
        else:
            raise self._not_replayable(reason)
        if env is not None:
            self._verify_envelope(env)
        record = self._record
        final = record.finalResponse
        header = record.header
        if final is None:
            payload, metadata = None, {}
        elif isinstance(final, dict):
            payload, metadata = final.get("payload"), final.get("metadata", {})
        else:
            # Only reachable by force: the contract's "corrupted record may raise parse errors".
            raise RecordCorruptedError(self.problems, execution_id=header.executionId)
        return ReplayResult(
            payload,
            metadata,
            True,
            header.executionId,
            header.createdUtcIso,
            warnings,
            final,
        )

    def verify_envelope(self, env: Any) -> EnvelopeVerifyResult:
        """Compare `env`'s hash with the recorded one, without raising."""
        return verify_envelope(self._record.header.envelopeHash, compute_envelope_hash(_envelope_dict(env)))

    def _verify_envelope(self, env: Any) -> None:
        result = self.verify_envelope(env)
        if not result.match:
            raise ReplayHashMismatchError(
                recorded=result.recorded_hash, provided=result.provided_hash or ""
            )


def _load(store: Any, execution_id: str) -> ExecutionRecord:
    # tracedb's Store has get(); IntentusNet's ExecutionStore has load(). Accept both.
    get = getattr(store, "get", None)
    if get is None:
        get = store.load
    return get(execution_id)


def replay_execution(
    store: Any, execution_id: str, *, env: Any = None, force: bool = False
) -> ReplayResult:
    """Load an execution from the store and replay it exactly (see ReplayEngine.replay)."""
    return ReplayEngine(_load(store, execution_id)).replay(env=env, force=force)


class ReplayCache:
    """A small in-memory LRU with per-entry expiry, the `Cache` of IntentusNet's CachingReplayEngine.

    `clock` returns seconds (monotonic); tests pass a fake one.
    """

    def __init__(
        self,
        max_entries: int = 4096,
        *,
        default_ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._entries: "OrderedDict[str, Tuple[float, Any]]" = OrderedDict()
        self._max_entries = max_entries
        self._default_ttl_s = default_ttl_s
        self._clock = clock

    def get(self, key: str) -> Any:
        """The cached value, or None when absent or expired."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires_at, value = entry
        if self._clock() >= expires_at:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def set(self, key: str, value: Any, ttl: Optional[float] = None) -> None:
        """Cache `value` for `ttl` seconds (the default TTL when None), evicting the oldest entry."""
        ttl_s = self._default_ttl_s if ttl is None else ttl
        self._entries[key] = (self._clock() + ttl_s, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def invalidate(self, key: str) -> None:
        """Forget one key."""
        self._entries.pop(key, None)

    def clear(self) -> None:
        """Forget everything."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class CachingReplayEngine:
    """Replay by execution id with a result cache, for high-frequency replay.

    Only successful, non-forced replays are cached. A record invalidated after it was cached keeps
    replaying from the cache until its entry expires or `invalidate(execution_id)` is called.
    """

    def __init__(self, store: Any, cache: Any = None, *, ttl_s: float = 3600.0):
        self._store = store
        self._cache = cache if cache is not None else ReplayCache(default_ttl_s=ttl_s)
        self._ttl_s = ttl_s
        self.hits = 0
        self.misses = 0

    def replay(self, execution_id: str) -> ReplayResult:
        """The recorded response of `execution_id`, from the cache when it holds it."""
        cached = self._cache.get(execution_id)
        if cached is not None:
            self.hits += 1
            return cached
        self.misses += 1
        record = _load(self._store, execution_id)
        result = ReplayEngine(record).replay()
        self._cache.set(execution_id, result, ttl=self._ttl_s)
        return result

    def invalidate(self, execution_id: str) -> None:
        """Drop one execution's cached result (after `tracedb invalidate`, for instance)."""
        self._cache.invalidate(execution_id)


def batch_replay(store: Any, execution_ids: Iterable[str]) -> Dict[str, ReplayResult]:
    """Replay many executions; a non-replayable one gets a result with payload None and a warning.

    An unknown id raises ExecutionNotFoundError, as loading it does.
    """
    results: Dict[str, ReplayResult] = {}
    for exec_id in execution_ids:
        record = _load(store, exec_id)
        try:
            results[exec_id] = ReplayEngine(record).replay()
        except NotReplayableError as e:
            results[exec_id] = ReplayResult(
                payload=None,
                metadata={"error": e.reason, "message": e.message},
                fromReplay=True,
                originalExecutionId=exec_id,
                originalTimestamp=record.header.createdUtcIso,
                warnings=[f"Not replayable: {e.reason}"],
            )
    return results
