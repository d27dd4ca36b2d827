"""A client that pipelines requests and never reads its replies cannot grow the recorder: the
server stops reading it once its replies pile up, keeps serving everyone else, and answers every
request in order once the client reads again."""

from __future__ import annotations

import socket
import time

import orjson

from tracedb.sidecar.client import Client


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_pipelined_gets_of_a_large_record_never_read(serve_process):
    rec = serve_process()
    with Client(rec.socket) as client:
        ex = client.start("big.record", {"intent": "big.record"})
        ex.event("myapp.blob", {"blob": "x" * 200_000})
        ex.finish({"status": "success", "payload": {}})
        eid = ex.execution_id
    rss_before = _rss_bytes(rec.proc.pid)

    hog = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hog.connect(rec.socket)
    hog.setblocking(False)
    sent = 0
    deadline = time.monotonic() + 8
    n = 0
    while time.monotonic() < deadline:  # write as many gets as the server will take, read nothing
        frame = orjson.dumps({"id": n, "op": "get", "execution_id": eid}) + b"\n"
        try:
            hog.send(frame)
        except BlockingIOError:
            time.sleep(0.01)
            continue
        n += 1
        sent += len(frame)
    grown = _rss_bytes(rec.proc.pid) - rss_before
    # 200 KB replies: unbounded, the thousands of gets taken would need gigabytes.
    assert n > 100
    assert grown < 150 << 20, f"the recorder grew {grown >> 20} MiB for {n} unread gets"

    # Everyone else is still served meanwhile.
    with Client(rec.socket) as other:
        assert other.ping()
        ex2 = other.start("still.served", {"intent": "still.served"})
        assert ex2.event("myapp.step", {}) == 1

    # The hog reads again: every request it managed to send is answered (gets run a few at a
    # time, so their answers may come in another order; the ids tell them apart).
    hog.setblocking(True)
    hog.settimeout(60)
    buf = bytearray()
    answered = 0
    ids = set()
    while answered < n:
        chunk = hog.recv(1 << 20)
        assert chunk, f"the server closed the connection after {answered} of {n} answers"
        buf += chunk
        while (nl := buf.find(b"\n")) >= 0:
            resp = orjson.loads(bytes(buf[:nl]))
            del buf[: nl + 1]
            assert resp["ok"], resp
            ids.add(resp["id"])
            assert len(resp["record"]["events"][0]["payload"]["blob"]) == 200_000
            answered += 1
    hog.close()
    assert ids == set(range(n))
