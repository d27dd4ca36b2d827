"""Record and replay agents written against other frameworks, through their own extension points.

- `tracedb.integrations.openai`: the OpenAI Python SDK, through its httpx transport.
- `tracedb.integrations.anthropic`: the Anthropic Python SDK, through the same transports
  (`recorded.http_transports`).
- `tracedb.integrations.agents`: the OpenAI Agents SDK, through a tracing processor (record) and a
  model provider (replay).

All record through tracedb's record API and replay with the event-log replay engine
(`tracedb.replay.ReplaySession`): the same matching, occurrence counting, strict and permissive
modes and errors. The OpenAI ones need the `tracedb[openai]` extra, the Anthropic one
`tracedb[anthropic]`.

- `tracedb.integrations.langgraph`: LangGraph, through a checkpointer (`TraceDBSaver`) whose
  checkpoints are events of one execution per run; the `tracedb[langgraph]` extra.

`docs/integrations.md` has the details.
"""
