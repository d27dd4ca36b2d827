"""`tracedb`: a thin command line over the library (`tracedb.reads.reader` for reads, `tracedb.maintenance.admin`
for maintenance). `main` is the click group; importing the command modules adds their commands.
"""

from tracedb.cli import interop, maintenance, read, replay, serve, ui  # noqa: F401 - they add their commands to main
from tracedb.cli.main import main

__all__ = ["main"]
