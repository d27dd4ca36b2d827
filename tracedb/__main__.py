"""`python -m tracedb` runs the command line."""

from .cli import main

main(prog_name="tracedb")
