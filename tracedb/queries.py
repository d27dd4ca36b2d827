"""Moved to tracedb.reads; this name stays until the last callers switch."""
from .reads import *  # noqa: F401,F403
from .reads import inspect_view, list_traces, read_record, record_from_rows, to_ns, trace_status  # noqa: F401
