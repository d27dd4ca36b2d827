"""Interoperability with other runtimes' execution records.

`tracedb.interop.intentusnet`: IntentusNet (an intent router with recorded, replayable executions): a record store its
IntentRouter accepts, `tracedb import intentusnet DIR` and `tracedb export ID --format intentusnet`.
"""
