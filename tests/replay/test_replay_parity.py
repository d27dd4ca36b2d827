"""Parity replay (seed 003) on the real store: the parity table, what the signature ignores, the
limitations (external state keeps parity, time-dependent parameters and logic break it, version
changes warn, dry run executes nothing), the replay stored as a trace linked to its original, and
the diff of two traces."""

from __future__ import annotations

import pytest

from tracedb.errors import InvalidInputError
from tracedb.records.record import TOOL_REQUESTED, TOOL_RESPONDED
from tracedb.replay.parity import (
    PlanStep,
    Skill,
    compare_traces,
    determinism_signature,
    diff_traces,
    plan_from_record,
    replay_run,
    run_plan,
    trace_steps,
)

PLAN = [
    PlanStep("http_call", {"url": "https://api.example.com/item/123"}, "0.1.0", max_retries=2),
    PlanStep("json_transform", {"q": ".status"}, "1.0.0"),
    PlanStep("llm_invoke", {"p": "Summarise the status"}, "2.0.0"),
]


class Skills:
    """Skill functions with call logs; http_call fails `http_failures` times, then answers `item`."""

    def __init__(self, item="available", http_failures=1, versions=("0.1.0", "1.0.0", "2.0.0"), cost=0.01):
        self.calls = []
        self.item = item
        self.http_failures = http_failures
        self.versions = versions
        self.cost = cost

    def http_call(self, params):
        self.calls.append(("http_call", params))
        if self.http_failures > 0:
            self.http_failures -= 1
            raise TimeoutError("upstream timed out")
        return {"status": self.item}

    def json_transform(self, params):
        self.calls.append(("json_transform", params))
        return {"value": self.item}

    def llm_invoke(self, params):
        self.calls.append(("llm_invoke", params))
        return {"text": f"the item is {self.item}", "cost_usd": self.cost}

    def mapping(self):
        v = self.versions
        return {
            "http_call": Skill(self.http_call, v[0]),
            "json_transform": Skill(self.json_transform, v[1]),
            "llm_invoke": Skill(self.llm_invoke, v[2]),
        }


class Ticks:
    """A fake monotonic clock in nanoseconds that advances by `step` per reading."""

    def __init__(self, step):
        self.now, self.step = 0, step

    def __call__(self):
        self.now += self.step
        return self.now


def record_original(store, skills=None, plan=PLAN, clock=None):
    ex = store.start("check_item", {"intent": "check_item", "item": 123})
    run_plan(ex, plan, (skills or Skills()).mapping(), clock=clock or Ticks(1_000))
    return ex.execution_id


# -- the parity table ----------------------------------------------------------------------------


def test_parity_table(store):
    run_id = record_original(store)
    original = store.get(run_id)
    assert [s.skill for s in trace_steps(original)] == ["http_call", "json_transform", "llm_invoke"]
    assert [s.status for s in trace_steps(original)] == ["success"] * 3
    assert [s.retries for s in trace_steps(original)] == [1, 0, 0]

    skills = Skills()
    result = replay_run(store, run_id, skills.mapping())
    assert result.success
    parity = result.parity_check
    assert parity.is_parity
    assert parity.original_signature == parity.replay_signature == determinism_signature(original)
    assert parity.divergence_step is None and parity.divergence_reason is None
    assert result.divergence_point is None
    replayed = trace_steps(result.trace)
    assert [(s.skill, s.params, s.status, s.retries) for s in replayed] == [
        (s.skill, s.params, s.status, s.retries) for s in trace_steps(original)
    ]


def test_replay_calls_the_recorded_skills_with_the_recorded_params_and_no_planner(store):
    run_id = record_original(store)
    skills = Skills()
    replay_run(store, run_id, skills.mapping())
    assert skills.calls == [
        ("http_call", PLAN[0].params),
        ("http_call", PLAN[0].params),  # the retry
        ("json_transform", PLAN[1].params),
        ("llm_invoke", PLAN[2].params),
    ]


def test_replay_is_stored_as_a_new_trace_linked_to_its_original(store):
    run_id = record_original(store)
    result = replay_run(store, run_id, Skills().mapping())
    trace = store.get(result.trace.execution_id)
    assert trace.execution_id != run_id
    assert trace.parentExecutionId == run_id
    assert trace.to_dict()["lineage"]["parentExecutionId"] == run_id
    assert trace.status == "completed"
    assert trace.envelope == store.get(run_id).envelope
    parity_events = [e.payload for e in trace.events if e.type == "replay.parity"]
    assert parity_events and parity_events[0]["is_parity"] is True
    assert parity_events[0]["original_execution_id"] == run_id


def test_signature_ignores_response_data_timing_and_cost(store):
    run_id = record_original(store, Skills(cost=0.01), clock=Ticks(1_000))
    result = replay_run(store, run_id, Skills(cost=0.5).mapping(), clock=Ticks(9_000_000))
    assert result.parity_check.is_parity
    a, b = trace_steps(store.get(run_id)), trace_steps(result.trace)
    assert a[2].response != b[2].response
    assert a[0].duration_ns != b[0].duration_ns


def test_regression_check_over_golden_runs(store):
    golden = [record_original(store) for _ in range(2)]
    for run_id in golden:
        result = replay_run(store, run_id, Skills().mapping(), verify_parity=True)
        assert result.parity_check.is_parity, f"Regression in {run_id}"


# -- limitations -----------------------------------------------------------------------------------


def test_external_state_change_keeps_parity(store):
    # Original at T=0: available. Replay at T=1: sold. Same call made: parity holds.
    run_id = record_original(store, Skills(item="available"))
    result = replay_run(store, run_id, Skills(item="sold").mapping())
    assert result.parity_check.is_parity
    assert trace_steps(store.get(run_id))[0].response == {"status": "available"}
    assert trace_steps(result.trace)[0].response == {"status": "sold"}


def test_time_dependent_parameter_breaks_parity(store):
    # BAD: params = {"timestamp": datetime.now()}: each run of the same plan sends another value.
    clock = iter(["2026-01-01T00:00:00Z", "2026-01-01T00:00:07Z"])

    def plan_now():
        return [PlanStep("report", {"timestamp": next(clock)})]

    skills = {"report": lambda params: {"ok": True}}
    first = store.start("report", {"intent": "report"})
    run_plan(first, plan_now(), skills)
    second = store.start("report", {"intent": "report"})
    run_plan(second, plan_now(), skills)
    parity = compare_traces(store.get(first.execution_id), store.get(second.execution_id))
    assert not parity.is_parity
    assert parity.divergence_step == 0
    assert "params differ" in parity.divergence_reason and "timestamp" in parity.divergence_reason


def test_fixed_timestamp_parameter_keeps_parity(store):
    # GOOD: params = {"timestamp": "2025-01-01T00:00:00Z"}
    fixed = [PlanStep("report", {"timestamp": "2025-01-01T00:00:00Z"})]
    skills = {"report": lambda params: {"ok": True}}
    ids = []
    for _ in range(2):
        ex = store.start("report", {"intent": "report"})
        run_plan(ex, fixed, skills)
        ids.append(ex.execution_id)
    assert compare_traces(store.get(ids[0]), store.get(ids[1])).is_parity


def test_time_dependent_skill_logic_diverges_at_that_step(store):
    now = {"t": 0}

    def offer(params):
        if now["t"] > params["valid_until"]:
            raise ValueError("offer expired")
        return {"price": 10}

    plan = [PlanStep("lookup", {"id": 1}), PlanStep("offer", {"valid_until": 5}), PlanStep("lookup", {"id": 2})]
    skills = {"lookup": lambda p: {"id": p["id"]}, "offer": offer}
    ex = store.start("buy", {"intent": "buy"})
    run_plan(ex, plan, skills)
    now["t"] = 10
    result = replay_run(store, ex.execution_id, skills)
    parity = result.parity_check
    assert not parity.is_parity
    assert parity.divergence_step == 1 == result.divergence_point
    assert "status differ" in parity.divergence_reason
    assert not result.success
    assert result.trace.finalResponse["status"] == "error"


def test_different_retry_behaviour_breaks_parity(store):
    run_id = record_original(store, Skills(http_failures=1))
    result = replay_run(store, run_id, Skills(http_failures=0).mapping())
    assert not result.parity_check.is_parity
    assert result.parity_check.divergence_step == 0
    assert "retries differ: original 1, replay 0" in result.parity_check.divergence_reason


def test_retry_budget_exhausted_fails_the_step_and_stops_the_plan(store):
    run_id = record_original(store, Skills(http_failures=5))
    steps = trace_steps(store.get(run_id))
    assert [(s.skill, s.status, s.retries) for s in steps] == [("http_call", "failure", 2)]
    assert steps[0].error == {"type": "TimeoutError", "message": "upstream timed out"}
    # The plan is still whole: a replay runs all of it and parts at step 0.
    assert len(plan_from_record(store.get(run_id))) == 3
    result = replay_run(store, run_id, Skills(http_failures=0).mapping())
    assert result.parity_check.divergence_step == 0


def test_skill_version_change_is_reported(store):
    run_id = record_original(store)
    result = replay_run(store, run_id, Skills(versions=("0.2.0", "1.0.0", "2.0.0")).mapping())
    assert result.warnings == ["step 0: http_call recorded at version 0.1.0, replayed with 0.2.0"]
    assert result.parity_check.is_parity  # versions are pinned in the plan, not in the signature


def test_dry_run_executes_nothing(store):
    run_id = record_original(store)
    before = len(store.list())
    skills = Skills()
    result = replay_run(store, run_id, skills.mapping(), dry_run=True)
    assert skills.calls == []
    assert len(store.list()) == before
    assert result.dry_run and result.trace is None and result.parity_check is None
    assert [s.skill for s in result.plan] == ["http_call", "json_transform", "llm_invoke"]
    assert result.plan[0] == PLAN[0]


def test_missing_skill_is_refused_before_anything_runs(store):
    run_id = record_original(store)
    skills = Skills()
    mapping = skills.mapping()
    del mapping["llm_invoke"]
    before = len(store.list())
    with pytest.raises(InvalidInputError, match="llm_invoke"):
        replay_run(store, run_id, mapping)
    assert skills.calls == [] and len(store.list()) == before


def test_trace_without_a_plan_is_refused(store):
    ex = store.start("nothing", {"intent": "nothing"})
    ex.event("ROUTER_DECISION", {"agent": "a"})
    ex.finish({"status": "success", "payload": None})
    with pytest.raises(InvalidInputError, match="no plan"):
        replay_run(store, ex.execution_id, {})


def test_tool_call_trace_replays_as_a_plan(store):
    # A run recorded as seed 004 tool events: a failed call retried with the same arguments is one
    # step with one retry.
    ex = store.start("lookup", {"intent": "lookup"})
    for args, outcome in ((({"q": "x"}), {"error": {"type": "TimeoutError", "message": "t"}}), ({"q": "x"}, {"response": 1})):
        seq = ex.event(TOOL_REQUESTED, {"name": "web_search", "arguments": args})
        ex.event(TOOL_RESPONDED, {"name": "web_search", "request_seq": seq, **outcome})
    ex.finish({"status": "success", "payload": 1})
    steps = trace_steps(store.get(ex.execution_id))
    assert [(s.skill, s.params, s.status, s.retries) for s in steps] == [("web_search", {"q": "x"}, "success", 1)]
    attempts = {"n": 0}

    def web_search(params):
        attempts["n"] += 1
        if attempts["n"] == 1:
            raise TimeoutError("t")
        return 1

    result = replay_run(store, ex.execution_id, {"web_search": web_search})
    assert result.parity_check.is_parity


# -- trace diff --------------------------------------------------------------------------------------


def test_diff_shows_steps_up_to_and_at_the_first_divergence(store):
    run_id = record_original(store)
    other = store.start("check_item", {"intent": "check_item", "item": 123})
    changed = [PLAN[0], PlanStep("json_transform", {"q": ".price"}, "1.0.0"), PLAN[2]]
    run_plan(other, changed, Skills().mapping())
    diff = diff_traces(store.get(run_id), store.get(other.execution_id))
    assert diff.unit == "step"
    assert diff.divergence_step == 1
    assert [r.same for r in diff.rows] == [True, False]  # nothing after the divergent step
    assert "params differ" in diff.rows[1].reason
    assert diff.a_total == diff.b_total == 3


def test_diff_of_identical_runs(store):
    a, b = record_original(store), record_original(store)
    diff = diff_traces(store.get(a), store.get(b))
    assert diff.identical and len(diff.rows) == 3 and all(r.same for r in diff.rows)


def test_diff_of_traces_without_steps_compares_events(store):
    ids = []
    for agent in ("geo", "geo", "math"):
        ex = store.start("q", {"intent": "q"})
        ex.event("ROUTER_DECISION", {"agent": agent})
        ex.finish({"status": "success", "payload": agent})
        ids.append(ex.execution_id)
    same = diff_traces(store.get(ids[0]), store.get(ids[1]))
    assert same.unit == "event" and same.identical
    differ = diff_traces(store.get(ids[0]), store.get(ids[2]))
    assert differ.divergence_step == 0 and differ.rows[0].reason == "payload differs"
