"""tracedb: a crash-safe recorder and replay store for AI agent executions.

    import tracedb
    with tracedb.open(".tracedb") as store:
        ex = store.start("ProcessIntent", {"intent": "ProcessIntent", "payload": {...}})
        ex.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
        ex.finish({"status": "success"})
        record = store.get(ex.execution_id)      # an ExecutionRecord; record.to_dict()
"""

from __future__ import annotations

from tracedb.config import Config, load_config
from tracedb.errors import (
    ConfigError,
    ExecutionClosedError,
    ExecutionExistsError,
    ExecutionNotFoundError,
    IntegrityError,
    InvalidInputError,
    RecordingFailedError,
    StoreClosedError,
    StoreInUseError,
    StoreNotFoundError,
    TraceDBError,
    UsageError,
)
from tracedb.records.record import (
    ExecutionEvent,
    ExecutionHeader,
    ExecutionRecord,
    compute_envelope_hash,
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tracedb")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def open(data_dir=None, *, config=None, clock=None):
    """Open (creating if needed) a data directory for recording and reading; a context manager.

    `config` is a `tracedb.Config`, a mapping of settings, or a TOML file path; `clock` (a
    function returning nanoseconds since the epoch) is for tests.
    """
    from tracedb.recorder.store import open_store

    return open_store(data_dir, config=config, clock=clock)


async def open_async(data_dir=None, *, config=None, clock=None):
    """The asyncio twin of `open`: `astore = await tracedb.open_async(data_dir)`."""
    from tracedb.recorder.store_async import open_store_async

    return await open_store_async(data_dir, config=config, clock=clock)


def __getattr__(name):
    if name == "__version__":
        return _version()
    # The store pulls in SQLAlchemy and Alembic; load it only when asked for.
    if name in ("Store", "Execution"):
        from tracedb.recorder import store

        return getattr(store, name)
    if name in ("AsyncStore", "AsyncExecution"):
        from tracedb.recorder import store_async

        return getattr(store_async, name)
    if name == "TraceSummary":
        from tracedb.reads.rows import TraceSummary

        return TraceSummary
    if name == "CompactResult":
        from tracedb.projection.compactor import CompactResult

        return CompactResult
    if name == "RecoverResult":
        from tracedb.maintenance.recovery import RecoverResult

        return RecoverResult
    if name == "PruneResult":
        from tracedb.maintenance.retention import PruneResult

        return PruneResult
    if name == "VerifyResult":
        from tracedb.maintenance.verify import VerifyResult

        return VerifyResult
    return _replay_name(name)


__all__ = [
    "AsyncExecution",
    "AsyncStore",
    "CompactResult",
    "Config",
    "ConfigError",
    "Execution",
    "ExecutionClosedError",
    "ExecutionEvent",
    "ExecutionExistsError",
    "ExecutionHeader",
    "ExecutionNotFoundError",
    "ExecutionRecord",
    "IntegrityError",
    "InvalidInputError",
    "PruneResult",
    "RecordingFailedError",
    "RecoverResult",
    "Store",
    "StoreClosedError",
    "StoreInUseError",
    "StoreNotFoundError",
    "TraceDBError",
    "TraceSummary",
    "UsageError",
    "VerifyResult",
    "compute_envelope_hash",
    "load_config",
    "open",
    "open_async",
]

# Replay (tracedb/replay/): its names are tracedb's too, loaded when first asked for (the CLI's
# start-up does without them).
from tracedb.errors import (  # noqa: E402
    NotReplayableError,
    RecordCorruptedError,
    RecordedCallError,
    ReplayDivergenceError,
    ReplayHashMismatchError,
)

__all__ += [
    "NotReplayableError",
    "RecordCorruptedError",
    "RecordedCallError",
    "ReplayDivergenceError",
    "ReplayHashMismatchError",
]
_own_all = tuple(__all__)
del __all__  # made by __getattr__ below, with the replay names


def __dir__():
    return sorted(set(globals()) | set(_replay_name("__all__")))


def _replay_name(name: str):
    import importlib

    replay = importlib.import_module(".replay", __name__)

    if name == "__all__":
        return [*_own_all, *replay.__all__]
    if name == "replay":
        return replay
    if name in replay.__all__:
        return getattr(replay, name)
    raise AttributeError(f"module 'tracedb' has no attribute {name!r}")
