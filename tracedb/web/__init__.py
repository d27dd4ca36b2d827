"""The web view of a store: executions, timelines, diffs and forks in a browser (`tracedb ui`,
and `tracedb serve --http-port`). Read-only, server-rendered, over `tracedb.reads.reader.AsyncReader`."""

from tracedb.web.app import create_app

__all__ = ["create_app"]
