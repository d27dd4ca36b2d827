"""Record and replay agents written against other frameworks, through their own extension points.

- `tracedb.integrations.openai`: the OpenAI Python SDK, through its httpx transport.
- `tracedb.integrations.agents`: the OpenAI Agents SDK, through a tracing processor (record) and a
  model provider (replay).

Both record through tracedb's record API and replay with the event-log replay engine
(`tracedb.replay.ReplaySession`): the same matching, occurrence counting, strict and permissive
modes and errors. Each needs the `tracedb[openai]` extra.

- `tracedb.integrations.langgraph`: LangGraph, through a checkpointer (`TraceDBSaver`) whose
  checkpoints are events of one execution per run; the `tracedb[langgraph]` extra.

`docs/integrations.md` has the details.
"""
