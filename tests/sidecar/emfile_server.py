"""A sidecar server in a process of its own whose file descriptors the test can use up.

    python -m tests.sidecar.emfile_server DIR

Serves the wire protocol on DIR/tracedb.sock and a TCP port (the in-memory test backend over a
real WAL), logs JSON lines on stderr, prints {"tcp": PORT} on stdout, then obeys one command per
line of standard input, answering each with a JSON line:

- `fill`: open /dev/null until the process has no descriptor left (EMFILE), and keep them;
- `free`: close them again;
- `metrics`: the Prometheus text of /metrics (as a JSON string);
- `quit`: shut down and exit.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sys

import orjson

from tracedb.sidecar.metrics import SidecarMetrics, configure_logging
from tracedb.sidecar.server import ServerConfig, SidecarServer

from .fake_backend import MemoryBackend


def _say(doc) -> None:
    sys.stdout.write(orjson.dumps(doc).decode() + "\n")
    sys.stdout.flush()


async def main(directory: str) -> None:
    configure_logging("info", json_format=True)
    server = SidecarServer(
        MemoryBackend(os.path.join(directory, "wal")),
        ServerConfig(socket_path=os.path.join(directory, "tracedb.sock"), tcp_host="127.0.0.1", tcp_port=0,
                     max_connections=1000, token="emfile-test-token"),
    )
    metrics = SidecarMetrics()
    metrics.attach(server)
    await server.start()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    held: list[int] = []
    _say({"tcp": server.tcp_address[1]})
    while True:
        line = (await reader.readline()).decode().strip()
        if line == "fill":
            while True:
                try:
                    held.append(os.open(os.devnull, os.O_RDONLY))
                except OSError as e:
                    assert e.errno == errno.EMFILE, e
                    break
            _say({"filled": len(held)})
        elif line == "free":
            for fd in held:
                os.close(fd)
            _say({"freed": len(held)})
            held.clear()
        elif line == "metrics":
            _say(metrics.render().decode())
        else:
            break
    for fd in held:
        os.close(fd)
    await server.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
