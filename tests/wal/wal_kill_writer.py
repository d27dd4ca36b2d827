"""A WAL writer process for the kill and lock tests (run with sys.executable).

    wal_kill_writer.py append DIR ROUND THREADS TASKS [ENGINE]
        appends forever from THREADS threads (one of them with append_many) and TASKS asyncio
        tasks; prints "LSN ID" for each record only after its append returned. ENGINE "loop"
        (the default) attaches the tasks' event loop (Wal.attach_loop), "thread" leaves every
        flush to the flusher thread.
    wal_kill_writer.py hold DIR
        opens the WAL, prints "ready PID", and holds the lock until stdin closes.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import zlib

import wal


def payload(record_id: str) -> bytes:
    """The payload of a record id; the test recomputes it."""
    return record_id.encode() + b"|" + b"." * (zlib.crc32(record_id.encode()) % 150)


_out = threading.Lock()


def emit(lsn: int, record_id: str) -> None:
    with _out:
        sys.stdout.write(f"{lsn} {record_id}\n")
        sys.stdout.flush()


def append_forever(directory: str, round_no: str, threads: int, tasks: int, engine: str = "loop") -> None:
    w = wal.Wal(directory, segment_size_bytes=4096)

    def producer(t: int) -> None:
        i = 0
        while True:
            if t == 0:
                ids = [f"r{round_no}-b{t}-{i + k}" for k in range(3)]
                lsns = w.append_many([payload(x) for x in ids])
                for lsn, x in zip(lsns, ids):
                    emit(lsn, x)
                i += 3
            else:
                record_id = f"r{round_no}-t{t}-{i}"
                emit(w.append(payload(record_id)), record_id)
                i += 1

    for t in range(threads):
        threading.Thread(target=producer, args=(t,), daemon=True).start()

    async def task(aw: wal.AsyncWal, k: int) -> None:
        i = 0
        while True:
            record_id = f"r{round_no}-a{k}-{i}"
            emit(await aw.append(payload(record_id)), record_id)
            i += 1

    async def main() -> None:
        aw = wal.AsyncWal(w)
        if engine == "loop" and not w.attach_loop():
            raise SystemExit("this machine offers no background fdatasync")
        await asyncio.gather(*(task(aw, k) for k in range(tasks)))

    asyncio.run(main())


def hold(directory: str) -> None:
    with wal.Wal(directory):
        sys.stdout.write(f"ready {os.getpid()}\n")
        sys.stdout.flush()
        sys.stdin.read()


if __name__ == "__main__":
    if sys.argv[1] == "append":
        append_forever(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), *sys.argv[6:7])
    elif sys.argv[1] == "hold":
        hold(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
