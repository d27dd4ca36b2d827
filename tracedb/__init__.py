"""tracedb: a crash-safe recorder and replay store for AI agent executions.

    import tracedb
    with tracedb.open(".tracedb") as store:
        ex = store.start("ProcessIntent", {"intent": "ProcessIntent", "payload": {...}})
        ex.event("INTENT_RECEIVED", {"intent": "ProcessIntent"})
        ex.finish({"status": "success"})
        record = store.get(ex.execution_id)      # an ExecutionRecord; record.to_dict()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

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


# The package's lazy seam: these names are loaded from their modules when first asked for (the
# store pulls in SQLAlchemy and Alembic), through `__getattr__` below; so are the replay engines'
# names (`tracedb.replay.__all__`). `import tracedb`, and with it the command line's start-up,
# loads none of them. Type checkers see every one through the imports under TYPE_CHECKING.
_LAZY = {
    "Store": "tracedb.recorder.store",
    "Execution": "tracedb.recorder.store",
    "AsyncStore": "tracedb.recorder.store_async",
    "AsyncExecution": "tracedb.recorder.store_async",
    "TraceSummary": "tracedb.reads.rows",
    "CompactResult": "tracedb.projection.compactor",
    "RecoverResult": "tracedb.maintenance.recovery",
    "PruneResult": "tracedb.maintenance.retention",
    "VerifyResult": "tracedb.maintenance.verify",
}

if TYPE_CHECKING:
    from tracedb.maintenance.recovery import RecoverResult
    from tracedb.maintenance.retention import PruneResult
    from tracedb.maintenance.verify import VerifyResult
    from tracedb.projection.compactor import CompactResult
    from tracedb.reads.rows import TraceSummary
    from tracedb.recorder.store import Execution, Store
    from tracedb.recorder.store_async import AsyncExecution, AsyncStore
    from tracedb.replay import *  # noqa: F403


def _version() -> str:
    # Lazy seam: importlib.metadata is a noticeable part of a start-up that never asks for the version.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tracedb")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def open(data_dir=None, *, config=None, clock=None) -> Store:
    """Open (creating if needed) a data directory for recording and reading; a context manager.

    `config` is a `tracedb.Config`, a mapping of settings, or a TOML file path; `clock` (a
    function returning nanoseconds since the epoch) is for tests.
    """
    store = importlib.import_module(_LAZY["Store"])
    return store.open_store(data_dir, config=config, clock=clock)


async def open_async(data_dir=None, *, config=None, clock=None) -> AsyncStore:
    """The asyncio twin of `open`: `astore = await tracedb.open_async(data_dir)`."""
    store_async = importlib.import_module(_LAZY["AsyncStore"])
    return await store_async.open_store_async(data_dir, config=config, clock=clock)


def __getattr__(name):
    if name == "__version__":
        return _version()
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
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
    replay = importlib.import_module(".replay", __name__)

    if name == "__all__":
        return [*_own_all, *replay.__all__]
    if name == "replay":
        return replay
    if name in replay.__all__:
        return getattr(replay, name)
    raise AttributeError(f"module 'tracedb' has no attribute {name!r}")
