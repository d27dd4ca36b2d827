"""An OpenTelemetry-instrumented agent whose spans carry secrets the way real applications let
them through: the official OpenAI instrumentation records the model's tool call (its arguments
hold an API key), and the application adds captured HTTP headers and OpenInference's
`llm.invocation_parameters` (JSON text with an api_key) to its spans. Run as a process:

    python -m tests.otel.secret_agent BASE_URL

It prints its trace id. The secrets are the constants below.
"""

import json
import sys

ARGUMENT_KEY = "sk-argument-3f9a1c7e5b2d4f60"   # in the tool call's arguments, under "api_key"
BEARER = "sk-bearer-8e1d2c3b4a5f6e7d"           # http.request.header.authorization
COOKIE = "session-cookie-5c4b3a2918"            # http.response.header.set-cookie
HEADER_KEY = "sk-header-0a1b2c3d4e5f"           # http.request.header.x-api-key
INVOCATION_KEY = "sk-invocation-77aa88bb99cc"   # "api_key" inside llm.invocation_parameters (JSON text)
PAIR_KEY = "sk-pair-1234abcd5678ef"             # a header list of [name, value] pairs
SECRETS = (ARGUMENT_KEY, BEARER, COOKIE, HEADER_KEY, INVOCATION_KEY, PAIR_KEY)


def main() -> None:
    from tests.otel.agent import ask_again, ask_and_run_tool, instrumented

    provider, tracer, client = instrumented(sys.argv[1], "secret-agent")
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    with tracer.start_as_current_span("answer_question", attributes={
        "http.request.header.authorization": [f"Bearer {BEARER}"],
        "http.response.header.set-cookie": [f"sid={COOKIE}; HttpOnly"],
        "http.request.header.x-api-key": [HEADER_KEY],
        "http.request.header.accept": ["application/json"],
        "llm.invocation_parameters": json.dumps({"model": "gpt-4o-mini", "temperature": 0, "api_key": INVOCATION_KEY}),
    }) as root:
        first, call = ask_and_run_tool(tracer, client, root, messages)
        with tracer.start_as_current_span("fetch_forecast") as fetch:
            # What an application that logs a request's headers as one attribute writes.
            fetch.set_attribute("app.request.headers", json.dumps(
                [["Authorization", f"Bearer {PAIR_KEY}"], ["Accept", "application/json"]]))
        ask_again(client, messages, first, call)
    provider.shutdown()


if __name__ == "__main__":
    main()
