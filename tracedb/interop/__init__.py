"""Interoperability with other runtimes' execution records.

`tracedb.interop.intentusnet`: IntentusNet (the runtime of seeds 000 and 002): a record store its
IntentRouter accepts, `tracedb import intentusnet DIR` and `tracedb export ID --format intentusnet`.
"""
