"""OpenTelemetry in and out: OTLP/HTTP ingestion in `tracedb serve` (`receiver`), an SDK
`SpanExporter` (`exporter`), the span-to-event mapping (`mapping`), OTLP/JSON export (`export`).
docs/otel.md describes the mapping and the rules."""
