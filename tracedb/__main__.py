"""`python -m tracedb` runs the command line."""

from tracedb.cli import main

main(prog_name="tracedb")
