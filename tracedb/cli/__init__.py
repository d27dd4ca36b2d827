"""`tracedb`: a thin command line over the library (`tracedb.reads.reader` for reads, `tracedb.maintenance.admin`
for maintenance). `main` is the click group; it imports a command's module when that command is
resolved (`tracedb.cli.main.COMMANDS`).
"""

from tracedb.cli.main import main

__all__ = ["main"]
