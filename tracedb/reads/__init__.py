"""The read API: the Reader, its SQLite fast path, what only the WAL holds, stats, pages.

`from tracedb.reads import Reader, AsyncReader, Filter` is the public way in (`reads/reader.py`);
the rest of the folder is what they read with. Those names load `reads.reader` when first asked
for, not when the package is imported: the command line imports `reads.paging` to check a cursor
before any read, and `--help` must not load the replay engines the reader brings."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracedb.reads.reader import AsyncReader, Filter, Page, Progress, Reader, TimedEvent, Timeline

__all__ = ["AsyncReader", "Filter", "Page", "Progress", "Reader", "TimedEvent", "Timeline"]


def __getattr__(name: str):
    if name in __all__:
        # The package's lazy seam: the reader, and the replay engines it brings, at first use.
        from tracedb.reads import reader

        return getattr(reader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
