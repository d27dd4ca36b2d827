"""Redaction's text search before its walk (`Rules.might_match`) never says "nothing to redact"
for a value the walk would redact: generated values with secret key names hidden at any depth,
in [name, value] pairs, dotted and header-prefixed names, strings holding documents (escaped
too), odd case, dashes and underscores, non-ASCII look-alikes. Both searches are checked: the one
an event loop's thread runs (one pass of an automaton) and the one other threads run (a search
per key)."""

from __future__ import annotations

import asyncio

import orjson
import pytest
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


_LOOP = asyncio.new_event_loop()


def might_match(rules, on_loop: bool, value, text=None) -> bool:
    """`rules.might_match` called on a thread running an event loop, or on one that is not."""
    if not on_loop:
        return rules.might_match(value, text)

    async def call():
        return rules.might_match(value, text)

    return _LOOP.run_until_complete(call())


SEARCHES = pytest.mark.parametrize("on_loop", [False, True], ids=["per-key", "automaton"])


VALUES = st.recursive(LEAVES, lambda c: st.one_of(
    _docs(c),
    _docs(c).map(lambda d: orjson.dumps(d).decode()),  # a string holding a document
    _docs(c).map(lambda d: orjson.dumps(d).decode().replace("a", "\\u0061")),  # escaped letters
), max_leaves=20)


@SEARCHES
@settings(max_examples=400, deadline=None)
@given(value=VALUES)
def test_text_search_never_hides_what_the_walk_finds(on_loop, value):
    plain = orjson.loads(orjson.dumps(value))
    needles = RULES.needles
    assert needles is not None
    _, changed = redact(plain, RULES)
    if changed:
        assert might_match(RULES, on_loop, plain)


@SEARCHES
def test_secret_found_through_the_text(on_loop):
    assert might_match(RULES, on_loop, {"a": [{"b": '{"X-API-KEY": 1}'}]})
    assert might_match(RULES, on_loop, {"headers": [["Authorization", "Bearer x"]]})
    assert might_match(RULES, on_loop, {"http.request.header.x-api-key": "v"})
    assert might_match(RULES, on_loop, {"a": '{"\\u0061pi_key": 1}'})  # an escape: left to the walk
    assert not might_match(RULES, on_loop, {"usage": {"prompt_tokens": 3}, "content": "hello"})
    assert not might_match(RULES, on_loop, {"a": '{"q": "x"}', "stop": ["\n\n"]})  # escapes, none \\u


@SEARCHES
@settings(max_examples=300, deadline=None)
@given(value=VALUES)
def test_text_given_by_the_caller_is_searched_as_written(on_loop, value):
    """`might_match(value, text)` searches the JSON text the caller has (the stored payload's,
    or one a client wrote with other spacing and escapes) and never hides what the walk finds."""
    import json

    plain = orjson.loads(orjson.dumps(value))
    _, changed = redact(plain, RULES)
    if changed:
        assert might_match(RULES, on_loop, plain, orjson.dumps(plain))
        assert might_match(RULES, on_loop, plain, json.dumps(plain, indent=1).replace("/", "\\/").encode())
        assert might_match(RULES, on_loop, plain, json.dumps(plain, ensure_ascii=False).encode())


@SEARCHES
def test_keys_sharing_a_start_are_each_found(on_loop):
    rules = Redactor(keys=("password", "passwd"), patterns=()).for_intent(None)
    assert might_match(rules, on_loop, {"PassWD": 1}, b'{"PassWD":1}')
    assert might_match(rules, on_loop, {"pass-word": 1}, b'{"pass-word":1}')
    assert not might_match(rules, on_loop, {"passport": 1}, b'{"passport":1}')


def spy_on_the_automaton(rules) -> list:
    """Replace the rules' automaton with one that finds nothing and notes each text it is given."""
    searched: list = []

    class Spy:
        def find_matches_as_indexes(self, text):
            searched.append(text)
            return []

    object.__setattr__(rules, "_matcher", Spy())
    return searched


def test_an_event_loops_thread_searches_with_the_automaton_and_any_other_thread_key_by_key():
    rules = Redactor(keys=("api_key",), patterns=()).for_intent(None)
    assert rules.needles == (b"apikey",)
    searched = spy_on_the_automaton(rules)
    assert not might_match(rules, False, {"Q-x": 1})
    assert searched == []
    assert not might_match(rules, True, {"Q-x": 1})
    assert searched == [b'{"qx":1}']  # lowered, "-" and "_" taken out


def test_more_keys_than_a_search_key_by_key_pays_for_are_searched_in_one_pass_on_a_loop():
    """Beyond `_NEEDLES_MAX` keys a thread without a loop walks every value; a loop's thread
    still searches the text first, in the automaton's one pass, whatever the number of keys."""
    keys = DEFAULT_KEYS + tuple(f"vault_{i:03d}_token" for i in range(100))
    rules = Redactor(keys=keys, patterns=()).for_intent(None)
    assert rules.needles is not None and len(rules.needles) > 64
    for on_loop in (False, True):
        assert might_match(rules, on_loop, {"a": [{"Vault-099-Token": 1}]})
        assert might_match(rules, on_loop, {"a": '{"x": {"vault_007_token": 2}}'})
        assert not might_match(rules, on_loop, {"usage": {"prompt_tokens": 3}, "content": "hello"})
    searched = spy_on_the_automaton(rules)
    assert not might_match(rules, False, {"q": 1})
    assert searched == []  # walked, not searched
    assert not might_match(rules, True, {"q": 1})
    assert searched == [b'{"q":1}']
    redacted, changed = redact({"vault_042_token": "s3cret", "q": 1}, rules)
    assert changed and redacted["vault_042_token"] != "s3cret" and redacted["q"] == 1


def test_a_thread_asks_for_a_loop_while_another_imports_asyncio(monkeypatch):
    """While a first `import asyncio` runs on another thread, the module is in sys.modules
    before its functions are: redaction then takes this thread for one without a loop."""
    import sys
    import types

    rules = Redactor(keys=("api_key",), patterns=()).for_intent(None)
    monkeypatch.setitem(sys.modules, "asyncio", types.ModuleType("asyncio"))  # half imported
    assert not rules.might_match({"q": 1})
    assert rules.might_match({"API-Key": 1})
