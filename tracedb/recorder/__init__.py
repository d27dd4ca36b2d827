"""Recording: the Store, its asyncio twin, staging, the compaction scheduler, execution handles."""
