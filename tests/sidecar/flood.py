"""A same-host adversary for the listener tests: holds slow connections open on each port.

    python -m tests.sidecar.flood --per-port 2000 wire:unix:/path/tracedb.sock wire:tcp:127.0.0.1:7411 \\
        http:tcp:127.0.0.1:4318 http:tcp:127.0.0.1:9464

Every target gets `--per-port` connections: half of them stay silent, the other half send a
request that never ends (a frame without its newline, headers without their blank line), one
byte at a time. A connection the server closes (refused, made room for, past a deadline) is
opened again a second later, so the pressure lasts. Prints one JSON line of counts per target
every half second and when it stops (SIGTERM, or standard input closed).
"""

from __future__ import annotations

import argparse
import errno
import resource
import select
import signal
import socket
import sys
import time

import orjson

PARTIAL = {
    "wire": b'{"id":1,"op":"ping","pad":"' + b"x" * 20000,
    "http": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 12000,
}
RECONNECT_S = 1.0
TRICKLE_S = 0.5  # each trickling connection sends a byte this often
TICK_S = 0.05


class Slot:
    __slots__ = ("target", "trickle", "sock", "connecting", "sent", "retry_at")

    def __init__(self, target: "Target", trickle: bool):
        self.target = target
        self.trickle = trickle
        self.sock = None
        self.connecting = False
        self.sent = 0
        self.retry_at = 0.0


class Target:
    def __init__(self, spec: str, n: int):
        kind, family, where = spec.split(":", 2)
        self.name = spec
        self.kind = kind
        self.family = socket.AF_UNIX if family == "unix" else socket.AF_INET
        if family == "unix":
            self.address = where
        else:
            host, port = where.rsplit(":", 1)
            self.address = (host, int(port))
        self.slots = [Slot(self, trickle=i % 2 == 1) for i in range(n)]
        self.stats = {"connects": 0, "held": 0, "closed_by_server": 0, "refused": 0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-port", type=int, default=2000)
    ap.add_argument("targets", nargs="+")
    args = ap.parse_args()
    need = args.per_port * len(args.targets) + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard) if hard != resource.RLIM_INFINITY else need, hard))
    targets = [Target(t, args.per_port) for t in args.targets]
    ep = select.epoll()
    by_fd: dict[int, Slot] = {}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        ep.register(sys.stdin.fileno(), select.EPOLLIN | select.EPOLLHUP)
    except OSError:  # not a pipe (a file, /dev/null): SIGTERM alone stops it
        pass

    def drop(slot: Slot, by_server: bool) -> None:
        s = slot.sock
        if s is None:
            return
        fd = s.fileno()
        by_fd.pop(fd, None)
        try:
            ep.unregister(fd)
        except OSError:
            pass
        s.close()
        slot.sock = None
        if not slot.connecting:
            slot.target.stats["held"] -= 1
        slot.connecting = False
        slot.retry_at = time.monotonic() + RECONNECT_S
        if by_server:
            slot.target.stats["closed_by_server"] += 1

    def connect(slot: Slot) -> None:
        t = slot.target
        s = socket.socket(t.family, socket.SOCK_STREAM)
        s.setblocking(False)
        t.stats["connects"] += 1
        rc = s.connect_ex(t.address)
        if rc not in (0, errno.EINPROGRESS):
            s.close()  # EAGAIN: the listen queue is full; ECONNREFUSED: not listening yet
            t.stats["refused"] += 1
            slot.retry_at = time.monotonic() + RECONNECT_S
            return
        slot.sock = s
        slot.sent = 0
        slot.connecting = rc != 0
        by_fd[s.fileno()] = slot
        if slot.connecting:
            ep.register(s.fileno(), select.EPOLLOUT)
        else:
            t.stats["held"] += 1
            ep.register(s.fileno(), select.EPOLLIN | select.EPOLLRDHUP)

    def report() -> None:
        print(orjson.dumps({t.name: t.stats for t in targets}).decode(), flush=True)

    next_report = 0.0
    trickle_turn = 0
    while not stop:
        now = time.monotonic()
        for t in targets:
            budget = 400  # connects per target per tick: the attacker stays a client, not a fork bomb
            for slot in t.slots:
                if slot.sock is None and slot.retry_at <= now:
                    connect(slot)
                    budget -= 1
                    if not budget:
                        break
        # A share of the trickling connections sends one more byte this tick.
        share = max(1, int(len(targets[0].slots) * TICK_S / TRICKLE_S))
        for t in targets:
            partial = PARTIAL[t.kind]
            for slot in t.slots[trickle_turn:trickle_turn + share]:
                if slot.trickle and slot.sock is not None and not slot.connecting and slot.sent < len(partial):
                    try:
                        slot.sock.send(partial[slot.sent:slot.sent + 1])
                        slot.sent += 1
                    except BlockingIOError:
                        pass
                    except OSError:
                        drop(slot, True)
        trickle_turn = (trickle_turn + share) % max(1, len(targets[0].slots))
        deadline = now + TICK_S
        while True:
            wait = deadline - time.monotonic()
            if wait <= 0:
                break
            for fd, ev in ep.poll(wait, 4096):
                if fd == sys.stdin.fileno():
                    if not sys.stdin.buffer.read1(1):
                        stop.append(1)
                    continue
                slot = by_fd.get(fd)
                if slot is None:
                    continue
                if slot.connecting:
                    err = slot.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        slot.target.stats["refused"] += 1
                        drop(slot, False)
                        continue
                    slot.connecting = False
                    slot.target.stats["held"] += 1
                    ep.modify(fd, select.EPOLLIN | select.EPOLLRDHUP)
                    continue
                try:
                    data = slot.sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data or ev & (select.EPOLLRDHUP | select.EPOLLHUP):
                    drop(slot, True)  # refused (an answer, then the end), or closed
        if time.monotonic() >= next_report:
            report()
            next_report = time.monotonic() + 0.5
    report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
