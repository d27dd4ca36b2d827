"""`tracedb`: a thin command line over the library (`tracedb.reads` for reads, `tracedb.admin`
for maintenance). `main` is the click group; importing the command modules adds their commands.
"""

from . import interop, maintenance, read, replay, serve, ui  # noqa: F401 - they add their commands to main
from .main import main

__all__ = ["main"]
