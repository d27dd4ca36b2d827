"""The sidecar recorder: `tracedb serve`, its wire protocol (docs/protocol.md), the client.

Agents record through a separate process, so an agent crash loses nothing acknowledged and a
recorder crash is recovered from the WAL.

    from tracedb.client import connect        # sync;  connect_async for asyncio
    with connect() as rec:                    # the sidecar, or in-process with none running
        ex = rec.start("ProcessIntent", envelope)
        ex.event("tool.requested", {...})
        ex.finish({"status": "success"})

The client's names below are loaded on first use: importing `tracedb.sidecar.protocol` (what
`tracedb serve`'s command line needs) does not load the client and asyncio with it.
"""

__all__ = [
    "AsyncClient",
    "AsyncExecution",
    "Client",
    "Execution",
    "RecorderUnavailableError",
    "SeqConflictError",
    "SidecarError",
    "connect",
    "connect_async",
]


def __getattr__(name):
    if name in __all__:
        # The package's lazy seam: the client, and asyncio, at first use.
        from tracedb.sidecar import client

        return getattr(client, name)
    raise AttributeError(f"module 'tracedb.sidecar' has no attribute {name!r}")
