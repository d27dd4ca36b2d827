"""A process routing IntentusNet intents, killed by the test in the middle of an agent call.

    python live_child.py tracedb DATA_DIR    # LiveRouter over tracedb.open(DATA_DIR)
    python live_child.py sidecar DATA_DIR    # LiveRouter over a client of DATA_DIR's `tracedb serve`
    python live_child.py file RECORDS_DIR    # IntentRouter over IntentusNet's FileExecutionStore

It routes one intent that completes, then one whose agent prints IN_AGENT and waits for ever.
"""

from __future__ import annotations

import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import tracedb  # noqa: E402
from intentusnet import (  # noqa: E402
    AgentDefinition, AgentRegistry, AgentResponse, BaseAgent, Capability, FileExecutionStore, IntentRef,
    IntentRouter,
)
from tests.interop.conftest import envelope  # noqa: E402
from tracedb.client import connect  # noqa: E402
from tracedb.interop.intentusnet_live import LiveRouter  # noqa: E402


class Slow(BaseAgent):
    """Answers the first call; on "hang" it says so and never returns."""

    def handle_intent(self, env):
        if env.payload["text"] == "hang":
            print("IN_AGENT", flush=True)
            threading.Event().wait()
        return AgentResponse.success({"text": env.payload["text"].upper()}, agent=self.definition.name)


def main() -> None:
    mode, where = sys.argv[1], sys.argv[2]
    registry = AgentRegistry()
    if mode == "tracedb":
        store = tracedb.open(where, config={"compact_interval_ms": 0, "idle_timeout_s": 0})
        router = LiveRouter(registry, store)
    elif mode == "sidecar":
        router = LiveRouter(registry, connect("unix:" + os.path.join(where, "tracedb.sock")))
    else:
        router = IntentRouter(registry, record_store=FileExecutionStore(where))
    registry.register(Slow(AgentDefinition(name="slow", capabilities=[Capability(intent=IntentRef(name="UpperIntent"))]), router))
    router.route_intent(envelope(text="done")[0])
    print("ROUTED", flush=True)
    router.route_intent(envelope(text="hang")[0])


if __name__ == "__main__":
    main()
