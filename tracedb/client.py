"""The recording client: `from tracedb.client import connect` (see tracedb.sidecar.client).

One API, sync and asyncio, whether it records through a sidecar (`tracedb serve`) or, with none
configured, in-process on the embedded store.
"""

from tracedb.sidecar.client import (  # noqa: F401
    AsyncClient,
    AsyncExecution,
    Client,
    Execution,
    OutcomeUnknownError,
    RecorderUnavailableError,
    SeqConflictError,
    SidecarError,
    connect,
    connect_async,
    resolve_sidecar,
)

__all__ = [
    "AsyncClient",
    "AsyncExecution",
    "Client",
    "Execution",
    "OutcomeUnknownError",
    "RecorderUnavailableError",
    "SeqConflictError",
    "SidecarError",
    "connect",
    "connect_async",
    "resolve_sidecar",
]
