"""`tracedb fork` next to a running recorder: the fork is made through the sidecar and stays live,
so the agent continues it by id."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading

import pytest
from click.testing import CliRunner

from tracedb.cli import main
from tracedb.sidecar.client import Client
from tracedb.sidecar.server import ServerConfig, SidecarServer
from tracedb.sidecar.store_backend import open_backend


class Sidecar:
    """The real sidecar server with the store backend, on its own event-loop thread."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.socket_path = f"{data_dir}/tracedb.sock"  # the default socket the CLI looks for
        self._ready = threading.Event()
        self._error = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self):
        try:
            backend = await open_backend(self.data_dir)
            self.server = SidecarServer(backend, ServerConfig(socket_path=self.socket_path, data_dir=self.data_dir))
            await self.server.start()
            self.loop = asyncio.get_running_loop()
        except BaseException as e:  # noqa: BLE001 - reported to the test thread
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        await self.server.serve_until_stopped()

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(30), "sidecar did not start"
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.server.request_stop)
        self._thread.join(30)


@pytest.fixture
def short_dir(monkeypatch):
    # Unix socket paths are limited to ~100 bytes: pytest's tmp_path can be too long.
    monkeypatch.delenv("TRACEDB_SIDECAR", raising=False)
    monkeypatch.delenv("TRACEDB_TOKEN", raising=False)
    d = tempfile.mkdtemp(prefix="tdb")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_fork_through_a_running_sidecar_stays_live(short_dir):
    with Sidecar(short_dir) as sidecar:
        with Client(f"unix:{sidecar.socket_path}") as client:
            ex = client.start("lookup", {"intent": "lookup"})
            ex.event("INTENT_RECEIVED", {"intent": "lookup"})
            ex.event("ROUTER_DECISION", {"agent": "geo"})
            ex.finish({"status": "success", "payload": "Paris"})
            parent = ex.execution_id

            r = CliRunner().invoke(main, ["--data-dir", short_dir, "fork", parent, "--at", "1", "--json"])
            assert r.exit_code == 0, r.output
            out = json.loads(r.stdout)
            assert out["live"] is True and out["copied_events"] == 1
            assert "no recorder" not in r.stderr

            # The agent continues the fork by id, right after the shared prefix.
            fork_ex = client.execution(out["execution_id"], next_seq=2)
            assert fork_ex.event("ROUTER_DECISION", {"agent": "math"}) == 2
            fork_ex.finish({"status": "success", "payload": "forked"})
            child = client.get(out["execution_id"])
    assert child.parentExecutionId == parent and child.forkedAtSeq == 1
    assert child.status == "completed" and child.header.replayable
    assert [e.type for e in child.events] == ["INTENT_RECEIVED", "ROUTER_DECISION", "FINAL_RESPONSE"]
