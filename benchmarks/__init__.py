"""tracedb's benchmarks: kept out of the installed package, run from the project root.

    scripts/bench [--only wal,store,replay,sidecar,pg] [--quick]   # all of them, with ratios
    python -m benchmarks.run ...                                   # the same, without the setup
    python -m benchmarks.sidecar [seconds] [window]                # sidecar ingest alone
    python -m benchmarks.pg URL [--events N] [--recorders 1,4]     # compaction into PostgreSQL

`run` holds the sections and the WAL and store measurements; `sidecar`, `replay` and `pg` the
measurements of those parts, which `run` calls and formats.
"""
