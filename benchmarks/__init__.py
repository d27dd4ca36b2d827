"""tracedb's benchmarks: kept out of the installed package, run from the project root.

    scripts/bench [--only wal,store,replay,sidecar,pg,cli] [--quick]   # all of them, with ratios
    python -m benchmarks.run ...                                       # the same, without the setup
    python -m benchmarks.sidecar [seconds] [window]                    # sidecar ingest alone
    python -m benchmarks.pg URL [--events N] [--recorders 1,4]         # compaction into PostgreSQL

`run` holds the sections, the WAL measurements and the fsync baselines (IntentusNet's own
per-execution layout among them); `api` the user's path through the public API (ingest,
compaction of an interleaved recording, replay from the store, building stores); `cli` the read
commands run as processes; `sidecar`, `replay` and `pg` the measurements of those parts. `run`
calls them and formats their figures.
"""
