"""The graph the LangGraph tests run: plain Python nodes a -> b -> slow -> c, each adding its name
to the state and to a log file (one line per time a node ran), so a test can tell which
supersteps ran again after a crash. `slow` blocks forever when its `block` file exists, for the
test to SIGKILL the process inside it.

`python -m tests.integrations.langgraph_graph DATA_DIR LOG THREAD [SOCKET]` runs the graph once on
THREAD, recording embedded into DATA_DIR, or through the `tracedb serve` at SOCKET.
"""

from __future__ import annotations

import operator
import os
import sys
import threading
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    steps: Annotated[list, operator.add]


def build(log: str):
    def node(name: str):
        def run(state: State) -> dict:
            with open(log, "a", encoding="utf-8") as f:
                f.write(name + "\n")
            if name == "slow" and os.path.exists(log + ".block"):
                threading.Event().wait()  # held here until the test kills the process
            return {"steps": [name]}

        return run

    g = StateGraph(State)
    for name in ("a", "b", "slow", "c"):
        g.add_node(name, node(name))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "slow")
    g.add_edge("slow", "c")
    g.add_edge("c", END)
    return g


def ran(log: str) -> list[str]:
    """The nodes that ran, in order."""
    if not os.path.exists(log):
        return []
    with open(log, encoding="utf-8") as f:
        return f.read().split()


def main(data_dir: str, log: str, thread: str, socket: str | None = None) -> None:
    import tracedb
    from tracedb.client import connect
    from tracedb.config import load_config
    from tracedb.integrations.langgraph import TraceDBSaver

    recorder = connect(socket) if socket else tracedb.open(data_dir)
    saver = TraceDBSaver(recorder, config=load_config(overrides={"data_dir": data_dir}))
    graph = build(log).compile(checkpointer=saver)
    # durability="sync": each superstep's checkpoint is durable before the next one starts.
    graph.invoke({"steps": []}, {"configurable": {"thread_id": thread}}, durability="sync")
    saver.close()
    recorder.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
