"""Parity replay: re-execute a stored plan without its planner, then compare.

A plan is the list of skill calls a run made: skill name, parameters, skill version, retry budget.
`run_plan` executes one through the caller's skill functions and records it: a `plan.recorded`
event with the whole plan first, then one `skill.step` event per step:

    {"step": 0, "skill": "http_call", "version": "0.1.0", "params": {...}, "max_retries": 2,
     "status": "success" | "failure", "retries": 1, "error": {"type", "message"} | null,
     "response": ..., "duration_ns": ...}

`replay_run` reads the plan back from a stored trace (its `plan.recorded` event, else its
`skill.step` events, else its `tool.requested`/`tool.responded` pairs), runs it again through the
skill functions given now, stores the replay as a new trace linked to the original
(`parent_execution_id`), and checks parity.

Parity is equality of the determinism signature: skill names in order, canonical parameters, step
status and retry counts. Response data, timing and cost never enter it: an external API that now
answers differently keeps parity (same call made, different response expected).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from tracedb.errors import InvalidInputError
from tracedb.records.record import (
    FINAL_RESPONSE,
    TOOL_REQUESTED,
    ExecutionEvent,
    ExecutionRecord,
)
from tracedb.replay._canon import canonical_json, content_hash
from tracedb.replay.eventlog import EventLog, intent_of

PLAN_RECORDED = "plan.recorded"
SKILL_STEP = "skill.step"
REPLAY_PARITY = "replay.parity"

SUCCESS = "success"
FAILURE = "failure"


@dataclass(frozen=True)
class PlanStep:
    """One step of a stored plan: which skill, with which parameters, at which version."""

    skill: str
    params: Any = None
    version: Optional[str] = None
    max_retries: int = 0

    def to_dict(self) -> dict:
        """The JSON shape stored in `plan.recorded`."""
        return {
            "skill": self.skill,
            "params": self.params,
            "version": self.version,
            "max_retries": self.max_retries,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PlanStep":
        """Read a step back from `plan.recorded` or `skill.step`."""
        return cls(
            skill=data["skill"],
            params=data.get("params"),
            version=data.get("version"),
            max_retries=int(data.get("max_retries") or 0),
        )


@dataclass(frozen=True)
class Skill:
    """A skill function with its version; `retry_on` says which exceptions a retry may cure."""

    fn: Callable[[Any], Any]
    version: Optional[str] = None
    retry_on: Tuple[type, ...] = (Exception,)


SkillLike = Union[Skill, Callable[[Any], Any]]


@dataclass(frozen=True)
class StepOutcome:
    """What one step did: the signature's four parts, plus what the signature leaves out."""

    step: int
    skill: str
    params: Any
    status: str
    retries: int
    version: Optional[str] = None
    max_retries: int = 0
    error: Optional[Dict[str, str]] = None
    response: Any = None
    duration_ns: int = 0

    def signature_entry(self) -> Dict[str, Any]:
        """The part of this step that parity compares."""
        return {
            "skill": self.skill,
            "params": canonical_json(self.params),
            "status": self.status,
            "retries": self.retries,
        }

    def to_payload(self) -> dict:
        """The `skill.step` event payload."""
        return {
            "step": self.step,
            "skill": self.skill,
            "version": self.version,
            "params": self.params,
            "max_retries": self.max_retries,
            "status": self.status,
            "retries": self.retries,
            "error": self.error,
            "response": self.response,
            "duration_ns": self.duration_ns,
        }


@dataclass(frozen=True)
class ParityResult:
    """An original trace compared with its replay: their step signatures, and where they first differ."""

    is_parity: bool
    original_signature: str
    replay_signature: str
    divergence_step: Optional[int] = None
    divergence_reason: Optional[str] = None

    def to_dict(self) -> dict:
        """JSON shape (the `replay.parity` event, `trace diff --json`)."""
        return {
            "is_parity": self.is_parity,
            "original_signature": self.original_signature,
            "replay_signature": self.replay_signature,
            "divergence_step": self.divergence_step,
            "divergence_reason": self.divergence_reason,
        }


@dataclass(frozen=True)
class ParityReplayResult:
    """A parity replay's result (named apart from exact replay's ReplayResult).

    `success` is True when every step of the plan ran and succeeded. In a dry run nothing runs:
    `trace` and `parity_check` are None and `plan` says what would have run.
    """

    success: bool
    parity_check: Optional[ParityResult]
    trace: Optional[ExecutionRecord]
    divergence_point: Optional[int]
    plan: List[PlanStep] = field(default_factory=list)
    dry_run: bool = False
    warnings: List[str] = field(default_factory=list)


# -- signatures -------------------------------------------------------------------------------


def _steps_from_skill_events(events: Sequence[ExecutionEvent]) -> List[StepOutcome]:
    out = []
    for e in events:
        if e.type != SKILL_STEP or not isinstance(e.payload, Mapping):
            continue
        p = e.payload
        out.append(
            StepOutcome(
                step=int(p.get("step", len(out))),
                skill=p["skill"],
                params=p.get("params"),
                status=p.get("status", SUCCESS),
                retries=int(p.get("retries") or 0),
                version=p.get("version"),
                max_retries=int(p.get("max_retries") or 0),
                error=p.get("error"),
                response=p.get("response"),
                duration_ns=int(p.get("duration_ns") or 0),
            )
        )
    return out


def _steps_from_tool_events(events: Sequence[ExecutionEvent]) -> List[StepOutcome]:
    # A tool call repeated with the same arguments right after it failed is a retry of the same
    # step, the way ReplayControl treats it, not a new step.
    log = EventLog(events)
    out: List[StepOutcome] = []
    for call in log.calls:
        if call.kind != "tool":
            continue
        req = call.request if isinstance(call.request, Mapping) else {}
        name = req.get("name", req.get("tool"))
        params = req.get("arguments")
        resp = call.response if isinstance(call.response, Mapping) else {}
        failed = (not call.answered) or "error" in resp
        status = FAILURE if failed else SUCCESS
        prev = out[-1] if out else None
        error, response = resp.get("error"), resp.get("response")
        if (
            prev is not None
            and prev.status == FAILURE
            and prev.skill == name
            and canonical_json(prev.params) == canonical_json(params)
        ):
            retries = prev.retries + 1
            out[-1] = StepOutcome(prev.step, name, params, status, retries, error=error, response=response)
            continue
        out.append(StepOutcome(len(out), name, params, status, 0, error=error, response=response))
    return out


def trace_steps(source: Union[ExecutionRecord, Sequence[ExecutionEvent]]) -> List[StepOutcome]:
    """The steps of a trace: its `skill.step` events, else its tool calls."""
    events = source.events if isinstance(source, ExecutionRecord) else source
    steps = _steps_from_skill_events(events)
    if steps:
        return steps
    if any(e.type == TOOL_REQUESTED for e in events):
        return _steps_from_tool_events(events)
    return []


def signature_entries(steps: Sequence[StepOutcome]) -> List[Dict[str, Any]]:
    """The compared part of each step, in order."""
    return [s.signature_entry() for s in steps]


def determinism_signature(
    source: Union[ExecutionRecord, Sequence[ExecutionEvent], Sequence[StepOutcome]],
) -> str:
    """"sha256:<hex>" over skill names, canonical parameters, step status and retry counts."""
    if isinstance(source, ExecutionRecord):
        steps: Sequence[StepOutcome] = trace_steps(source)
    elif source and isinstance(source[0], ExecutionEvent):
        steps = trace_steps(source)  # type: ignore[arg-type]
    else:
        steps = source  # type: ignore[assignment]
    return content_hash(signature_entries(steps))


def _first_difference(a: Dict[str, Any], b: Dict[str, Any]) -> Optional[str]:
    """The first part of two signature entries that differs, None if none does."""
    return next((part for part in ("skill", "params", "status", "retries") if a[part] != b[part]), None)


def _step_difference(a: Dict[str, Any], b: Dict[str, Any]) -> str:
    part = _first_difference(a, b)
    return "same" if part is None else f"{part} differ: original {a[part]}, replay {b[part]}"


def compare_steps(original: Sequence[StepOutcome], replay: Sequence[StepOutcome]) -> ParityResult:
    """Parity of two step lists: equal signatures, or the first step where they part."""
    a, b = signature_entries(original), signature_entries(replay)
    sig_a, sig_b = content_hash(a), content_hash(b)
    if sig_a == sig_b:
        return ParityResult(True, sig_a, sig_b)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return ParityResult(False, sig_a, sig_b, i, f"step {i}: {_step_difference(x, y)}")
    n = min(len(a), len(b))
    if len(a) > len(b):
        reason = f"step {n}: replay stopped after {len(b)} steps, original has {len(a)}"
    else:
        reason = f"step {n}: replay ran {len(b)} steps, original has {len(a)}"
    return ParityResult(False, sig_a, sig_b, n, reason)


def compare_traces(original: ExecutionRecord, replay: ExecutionRecord) -> ParityResult:
    """Parity of two stored traces: do they take the same steps?"""
    return compare_steps(trace_steps(original), trace_steps(replay))


# -- plans --------------------------------------------------------------------------------------


def plan_from_record(record: ExecutionRecord) -> List[PlanStep]:
    """The stored plan of a trace: `plan.recorded`, else its recorded steps, else its tool calls."""
    for e in record.events:
        if e.type == PLAN_RECORDED and isinstance(e.payload, Mapping):
            return [PlanStep.from_dict(s) for s in e.payload.get("steps") or []]
    steps = trace_steps(record)
    if not steps:
        raise InvalidInputError(
            f"execution {record.execution_id!r} holds no plan (no {PLAN_RECORDED}, {SKILL_STEP} or "
            f"{TOOL_REQUESTED} events)",
            hint="parity replay needs a run recorded with tracedb.run_plan or with tool call events",
        )
    return [PlanStep(s.skill, s.params, s.version, max(s.max_retries, s.retries)) for s in steps]


def _as_skill(value: SkillLike) -> Skill:
    return value if isinstance(value, Skill) else Skill(fn=value, version=getattr(value, "version", None))


def _check_skills(plan: Sequence[PlanStep], skills: Mapping[str, SkillLike]) -> List[str]:
    missing = sorted({s.skill for s in plan if s.skill not in skills})
    if missing:
        raise InvalidInputError(
            f"no skill function for {', '.join(missing)}",
            hint="pass every skill the plan uses in skills={name: fn}; nothing was executed",
        )
    warnings = []
    for i, step in enumerate(plan):
        now = _as_skill(skills[step.skill]).version
        if step.version is not None and now is not None and now != step.version:
            warnings.append(
                f"step {i}: {step.skill} recorded at version {step.version}, replayed with {now}"
            )
    return warnings


def _run_step(i: int, step: PlanStep, skill: Skill, clock: Callable[[], int]) -> StepOutcome:
    retries = 0
    t0 = clock()
    while True:
        try:
            response = skill.fn(step.params)
        except Exception as exc:
            if isinstance(exc, skill.retry_on) and retries < step.max_retries:
                retries += 1
                continue
            return StepOutcome(
                i, step.skill, step.params, FAILURE, retries, skill.version or step.version,
                step.max_retries, {"type": type(exc).__name__, "message": str(exc)}, None, clock() - t0,
            )
        return StepOutcome(
            i, step.skill, step.params, SUCCESS, retries, skill.version or step.version,
            step.max_retries, None, response, clock() - t0,
        )


def run_plan(
    execution: Any,
    plan: Sequence[Union[PlanStep, Mapping[str, Any]]],
    skills: Mapping[str, SkillLike],
    *,
    finish: bool = True,
    clock: Callable[[], int] = time.monotonic_ns,
) -> List[StepOutcome]:
    """Execute a plan step by step through `skills`, recording it into `execution`.

    A failing step is retried up to its `max_retries` (no sleeping: backoff belongs to the skill);
    the plan stops at the first step that still fails. With `finish`, the final response is
    recorded: {"status": "success", "payload": {"results": [...]}} or an error response.
    """
    steps = [s if isinstance(s, PlanStep) else PlanStep.from_dict(s) for s in plan]
    _check_skills(steps, skills)
    execution.event(PLAN_RECORDED, {"steps": [s.to_dict() for s in steps]})
    outcomes: List[StepOutcome] = []
    for i, step in enumerate(steps):
        outcome = _run_step(i, step, _as_skill(skills[step.skill]), clock)
        execution.event(SKILL_STEP, outcome.to_payload())
        outcomes.append(outcome)
        if outcome.status != SUCCESS:
            break
    if finish:
        execution.finish(plan_response(outcomes, len(steps)))
    return outcomes


def plan_response(outcomes: Sequence[StepOutcome], planned: int) -> dict:
    """The final response `run_plan` records for these outcomes."""
    if outcomes and outcomes[-1].status != SUCCESS:
        last = outcomes[-1]
        return {
            "status": "error",
            "error": {
                "code": "SKILL_FAILED",
                "message": f"step {last.step} ({last.skill}) failed: {(last.error or {}).get('message', '')}",
                "step": last.step,
            },
        }
    return {"status": "success", "payload": {"results": [o.response for o in outcomes], "steps": planned}}


def replay_run(
    store: Any,
    run_id: str,
    skills: Mapping[str, SkillLike],
    *,
    verify_parity: bool = True,
    dry_run: bool = False,
    clock: Callable[[], int] = time.monotonic_ns,
) -> ParityReplayResult:
    """Re-execute the stored plan of `run_id` through `skills`; no planner is called.

    The replay is stored as a new trace whose parent is `run_id`. With `dry_run`, nothing is
    executed or stored: the result lists the plan and any version warnings.
    """
    original = store.get(run_id)
    plan = plan_from_record(original)
    warnings = _check_skills(plan, skills)
    if dry_run:
        return ParityReplayResult(True, None, None, None, plan, True, warnings)
    ex = store.start(intent_of(original), original.envelope, parent_execution_id=original.execution_id)
    outcomes = run_plan(ex, plan, skills, finish=False, clock=clock)
    parity = compare_steps(trace_steps(original), outcomes) if verify_parity else None
    if parity is not None:
        ex.event(REPLAY_PARITY, {"original_execution_id": original.execution_id, **parity.to_dict()})
    ex.finish(plan_response(outcomes, len(plan)))
    trace = store.get(ex.execution_id)
    success = len(outcomes) == len(plan) and all(o.status == SUCCESS for o in outcomes)
    return ParityReplayResult(
        success,
        parity,
        trace,
        parity.divergence_step if parity is not None else None,
        plan,
        False,
        warnings,
    )


# -- trace diff -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DiffRow:
    """One line of `tracedb trace diff`: the step in each trace and whether they agree."""

    step: int
    a: Optional[Dict[str, Any]]
    b: Optional[Dict[str, Any]]
    same: bool
    reason: Optional[str] = None


@dataclass(frozen=True)
class TraceDiff:
    """Two traces side by side up to and at their first divergent step."""

    a_id: str
    b_id: str
    unit: str  # "step" (skill/tool steps) or "event" (raw events when neither has steps)
    rows: List[DiffRow]
    divergence_step: Optional[int]
    divergence_reason: Optional[str]
    a_total: int
    b_total: int
    parity: Optional[ParityResult] = None

    @property
    def identical(self) -> bool:
        """True when no step differs."""
        return self.divergence_step is None

    def to_dict(self) -> dict:
        """The JSON shape printed by `tracedb trace diff --json`."""
        return {
            "a": self.a_id,
            "b": self.b_id,
            "unit": self.unit,
            "identical": self.identical,
            "divergence_step": self.divergence_step,
            "divergence_reason": self.divergence_reason,
            "a_total": self.a_total,
            "b_total": self.b_total,
            "rows": [
                {"step": r.step, "a": r.a, "b": r.b, "same": r.same, "reason": r.reason} for r in self.rows
            ],
            "parity": self.parity.to_dict() if self.parity is not None else None,
        }


def _event_entry(e: ExecutionEvent) -> Dict[str, Any]:
    return {"seq": e.seq, "type": e.type, "payload": canonical_json(e.payload)}


def diff_traces(a: ExecutionRecord, b: ExecutionRecord) -> TraceDiff:
    """Compare two traces step by step (raw events when neither has steps), up to the first difference."""
    steps_a, steps_b = trace_steps(a), trace_steps(b)
    if steps_a or steps_b:
        unit = "step"
        ea = [dict(s.signature_entry(), version=s.version) for s in steps_a]
        eb = [dict(s.signature_entry(), version=s.version) for s in steps_b]
        parity: Optional[ParityResult] = compare_steps(steps_a, steps_b)

        def differs(x, y):
            part = _first_difference(x, y)  # versions are shown, never compared
            # A vs B, as the event rows say it: two recorded traces, neither of them a replay.
            return None if part is None else f"{part} differs: {x[part]} vs {y[part]}"
    else:
        unit = "event"
        ea = [_event_entry(e) for e in a.events if e.type != FINAL_RESPONSE]
        eb = [_event_entry(e) for e in b.events if e.type != FINAL_RESPONSE]
        parity = None

        def differs(x, y):
            if x["type"] != y["type"]:
                return f"type differs: {x['type']} vs {y['type']}"
            if x["payload"] != y["payload"]:
                return "payload differs"
            return None

    rows: List[DiffRow] = []
    divergence: Optional[int] = None
    reason: Optional[str] = None
    for i in range(max(len(ea), len(eb))):
        x = ea[i] if i < len(ea) else None
        y = eb[i] if i < len(eb) else None
        if x is None or y is None:
            why = f"only in {a.execution_id if y is None else b.execution_id}"
        else:
            why = differs(x, y)
        rows.append(DiffRow(i, x, y, why is None, why))
        if why is not None:
            divergence, reason = i, f"{unit} {i}: {why}"
            break
    if divergence is None and unit == "event":
        fa, fb = canonical_json(a.finalResponse), canonical_json(b.finalResponse)
        if fa != fb:
            divergence, reason = len(ea), "final responses differ"
    return TraceDiff(a.execution_id, b.execution_id, unit, rows, divergence, reason, len(ea), len(eb), parity)
