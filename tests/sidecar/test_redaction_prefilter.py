"""Redaction's text search before its walk (`Rules.might_match`) never says "nothing to redact"
for a value the walk would redact: generated values with secret key names hidden at any depth,
in [name, value] pairs, dotted and header-prefixed names, strings holding documents (escaped
too), odd case, dashes and underscores, non-ASCII look-alikes."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tracedb.records.redaction import DEFAULT_KEYS, Redactor, redact

RULES = Redactor(keys=DEFAULT_KEYS + ("llm.token_x", "weird key!"), patterns=()).for_intent(None)

NAMES = st.sampled_from([
    "api_key", "API-Key", "apiKey", "X-Api-Key", "llm.api_key", "http.request.header.authorization",
    "rpc.grpc.request.metadata.cookie", "Set_Cookie", "pass-word", "PASSWD", "a\u212aey", "api\u212aey",
    "q", "model", "prompt_tokens", "tokens", "content", "weird key!", "Weird-Key!", "llm.token_x",
])
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), st.text(max_size=12), NAMES)


def _docs(children):
    return st.one_of(
        st.dictionaries(st.one_of(NAMES, st.text(max_size=8)), children, max_size=4),
        st.lists(children, max_size=4),
        st.lists(st.tuples(NAMES, children).map(list), min_size=1, max_size=3),
    )


VALUES = st.recursive(LEAVES, lambda c: st.one_of(
    _docs(c),
    _docs(c).map(lambda d: orjson.dumps(d).decode()),  # a string holding a document
    _docs(c).map(lambda d: orjson.dumps(d).decode().replace("a", "\\u0061")),  # escaped letters
), max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(VALUES)
def test_text_search_never_hides_what_the_walk_finds(value):
    plain = orjson.loads(orjson.dumps(value))
    needles = RULES.needles
    assert needles is not None
    _, changed = redact(plain, RULES)
    if changed:
        assert RULES.might_match(plain)


def test_secret_found_through_the_text():
    assert RULES.might_match({"a": [{"b": '{"X-API-KEY": 1}'}]})
    assert RULES.might_match({"headers": [["Authorization", "Bearer x"]]})
    assert RULES.might_match({"http.request.header.x-api-key": "v"})
    assert not RULES.might_match({"usage": {"prompt_tokens": 3}, "content": "hello"})


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_text_given_by_the_caller_is_searched_as_written(value):
    """`might_match(value, text)` searches the JSON text the caller has (the stored payload's,
    or one a client wrote with other spacing and escapes) and never hides what the walk finds."""
    import json

    plain = orjson.loads(orjson.dumps(value))
    _, changed = redact(plain, RULES)
    if changed:
        assert RULES.might_match(plain, orjson.dumps(plain))
        assert RULES.might_match(plain, json.dumps(plain, indent=1).replace("/", "\\/").encode())
        assert RULES.might_match(plain, json.dumps(plain, ensure_ascii=False).encode())


def test_shared_start_searched_once():
    rules = Redactor(keys=("password", "passwd"), patterns=()).for_intent(None)
    assert rules.might_match({"PassWD": 1}, b'{"PassWD":1}')
    assert rules.might_match({"pass-word": 1}, b'{"pass-word":1}')
    assert not rules.might_match({"passport": 1}, b'{"passport":1}')
