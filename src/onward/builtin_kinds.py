"""The built-in step kinds: ``set``, ``branch``, ``goto`` (fast lane), ``wait_for``,
``wait_until`` and ``wait_signal`` (wait lane). ``approval`` is in ``onward.approvals``."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from onward import calendar
from onward.automations import cel
from onward.automations.document import StepDef
from onward.durations import parse_duration
from onward.errors import NeedsReview, PermanentError
from onward.kinds import Advance, StepContext, Wait, reads_no_outputs, step_kind


class SetParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    values: dict[str, str] = Field(min_length=1, description="variable name -> CEL expression")


def _check_set(step: StepDef, params: SetParams) -> list[str]:
    return [f"step {step.id}: {p}" for src in params.values.values() for p in cel.check(src)]


@step_kind(
    "set",
    lane="fast",
    params=SetParams,
    check=_check_set,
    reads=lambda s, p: list(p.values.values()),
)
async def set_values(step: StepContext) -> Advance:
    params: SetParams = step.params
    env, computed = step.env, {}
    for name, source in params.values.items():
        try:
            computed[name] = cel.evaluate(source, env)
        except cel.CelError as exc:
            raise PermanentError(str(exc)) from None
        env = {**env, "vars": {**env["vars"], name: computed[name]}}
    return Advance(output=computed, vars=computed)


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid")
    when: str
    next: str


class BranchParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cases: list[Case] = Field(min_length=1)
    default: str | None = None


def _branch_successors(step: StepDef, params: BranchParams) -> list[str]:
    targets = [c.next for c in params.cases]
    fallback = params.default or step.next
    return [*targets, fallback] if fallback else targets


def _check_branch(step: StepDef, params: BranchParams) -> list[str]:
    return [f"step {step.id}: {p}" for c in params.cases for p in cel.check(c.when)]


@step_kind(
    "branch",
    lane="fast",
    params=BranchParams,
    successors=_branch_successors,
    check=_check_branch,
    reads=lambda s, p: [c.when for c in p.cases],
)
async def branch(step: StepContext) -> Advance:
    params: BranchParams = step.params
    for i, case in enumerate(params.cases):
        try:
            hit = cel.evaluate(case.when, step.env)
        except cel.CelError as exc:
            raise PermanentError(str(exc)) from None
        if hit is True:
            return Advance(output={"case": i, "next": case.next}, next=case.next)
    fallback = params.default or step.definition.next
    return Advance(output={"case": None, "next": fallback}, next=fallback)


class GotoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str


@step_kind(
    "goto",
    lane="fast",
    params=GotoParams,
    successors=lambda s, p: [p.target],
    reads=reads_no_outputs,
)
async def goto(step: StepContext) -> Advance:
    return Advance(output={"target": step.params.target}, next=step.params.target)


class WaitForParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    duration: str | float

    @field_validator("duration")
    @classmethod
    def _valid(cls, v: str | float) -> str | float:
        parse_duration(v)
        return v


@step_kind("wait_for", lane="wait", params=WaitForParams, reads=reads_no_outputs)
async def wait_for(step: StepContext) -> Any:
    if step.wake is not None:  # the timer fired: the wait is over
        return Advance(output={"waited": step.params.duration, "woken_by": step.wake.get("by")})
    seconds = parse_duration(step.params.duration)
    return Wait(due_in=seconds, intent={"duration": step.params.duration})


class WaitUntilParams(BaseModel):
    """``rule`` on the wall clock of a zone: ``zone`` (an IANA name), or ``zone_from`` (a CEL
    expression over the run's data, e.g. ``input.contact.tz``) with ``fallback_zone`` -- else
    the automation's ``timezone``. ``spread`` (a duration, or ``off``): the deterministic
    offset that keeps a Monday 09:00 from waking every run in the same second (R8)."""

    model_config = ConfigDict(extra="forbid")
    rule: str = Field(description="e.g. '09:00 on weekdays', 'cron 30 8 1 * *', an RRULE")
    zone: str | None = None
    zone_from: str | None = Field(default=None, description="CEL, e.g. input.contact.tz")
    fallback_zone: str | None = None
    spread: str | float = Field(default=calendar.DEFAULT_SPREAD_S, description="or 'off'")

    @field_validator("rule")
    @classmethod
    def _rule(cls, v: str) -> str:
        calendar.parse_rule(v)  # RuleError is a ValueError: a validation problem
        return v

    @field_validator("zone", "fallback_zone")
    @classmethod
    def _zone(cls, v: str | None) -> str | None:
        if v is not None:
            calendar.zone(v)
        return v

    @field_validator("spread")
    @classmethod
    def _spread(cls, v: str | float) -> str | float:
        if v != "off":
            parse_duration(v)
        return v

    @property
    def spread_s(self) -> float:
        return 0.0 if self.spread == "off" else parse_duration(self.spread)


def _check_wait_until(step: StepDef, params: WaitUntilParams) -> list[str]:
    problems = []
    if params.zone is not None and params.zone_from is not None:
        problems.append(f"step {step.id}: give zone or zone_from, not both")
    if params.zone_from is not None:
        problems += [f"step {step.id}: zone_from: {p}" for p in cel.check(params.zone_from)]
    return problems


def _zone_of(step: StepContext, params: WaitUntilParams) -> tuple[str, str]:
    """The zone this wait uses and where it came from. A zone read from the run's data that
    is not an IANA zone parks the run for a person: a retry would read the same data."""
    if params.zone is not None:
        return params.zone, "step"
    fallback = params.fallback_zone or (step.automation.timezone if step.automation else None)
    if params.zone_from is not None:
        try:
            value = cel.evaluate(params.zone_from, step.env)
        except cel.CelError:
            value = None
        if value not in (None, ""):
            try:
                calendar.zone(str(value))
            except calendar.UnknownZone:
                raise NeedsReview(
                    f"step {step.step_id}: {value!r} from {params.zone_from} is not a time zone; "
                    "correct the data (an IANA name such as Europe/Berlin), then resume",
                    detail={"zone_from": params.zone_from, "value": str(value)[:200]},
                ) from None
            return str(value), "data"
    if fallback is not None:
        return fallback, "fallback" if params.fallback_zone else "automation"
    raise NeedsReview(
        f"step {step.step_id}: no time zone: {params.zone_from or 'zone'} gave none and there is no "
        "fallback_zone or automation timezone",
        detail={"zone_from": params.zone_from},
    )


@step_kind(
    "wait_until",
    lane="wait",
    params=WaitUntilParams,
    check=_check_wait_until,
    needs_zone=True,
    reads=lambda s, p: [p.zone_from] if p.zone_from else [],
)
async def wait_until(step: StepContext) -> Any:
    """Wait for the next occurrence of a calendar rule on a person's wall clock (R6): the
    timer stores the rule, the zone (and the data it came from), the reference instant and the
    spread beside the UTC instant, so the instant can be recomputed when any of them changes."""
    params: WaitUntilParams = step.params
    if step.wake is not None:
        return Advance(output={"woken_by": step.wake.get("by"), "due_at": step.wake.get("due_at")})
    if step.now is None:
        raise PermanentError("wait_until needs the database's clock of the claim (step.now)")
    zone_name, source = _zone_of(step, params)
    planned = calendar.plan(
        params.rule, zone_name, step.now, spread_s=params.spread_s, key=step.run_id
    )
    if planned is None:
        raise PermanentError(
            f"step {step.step_id}: {params.rule!r} has no occurrence after {step.now}"
        )
    due_at, intent = planned
    intent["zone_source"] = source
    if params.zone_from is not None:
        intent["zone_from"] = params.zone_from
    return Wait(due_at=due_at, intent=intent)


class WaitSignalParams(BaseModel):
    """Wait for the first of ``signals`` (names such as ``reply``, ``unsubscribe``) that
    reaches this run -- one that came before the step began waiting counts -- or until
    ``deadline`` (a duration) passes, whichever commits first (R9)."""

    model_config = ConfigDict(extra="forbid")
    signals: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(min_length=1)
    deadline: str | float = Field(description="e.g. 3d: how long to wait before giving up")

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, v: str | float) -> str | float:
        if parse_duration(v) <= 0:
            raise ValueError("the deadline must be positive")
        return v


@step_kind("wait_signal", lane="wait", params=WaitSignalParams, reads=reads_no_outputs)
async def wait_signal(step: StepContext) -> Any:
    """Output: ``{"signal": name, "signal_id", "payload", "timed_out": false}`` when a signal
    woke the step, ``{"signal": null, "timed_out": true}`` when the deadline did."""
    params: WaitSignalParams = step.params
    wake = step.wake
    if wake is not None and wake.get("by") == "signal":
        return Advance(
            output={
                "signal": wake.get("name"),
                "signal_id": wake.get("signal_id"),
                "payload": wake.get("payload") or {},
                "received_at": wake.get("received_at"),
                "timed_out": False,
            }
        )
    if wake is not None:  # the deadline timer fired first
        return Advance(
            output={"signal": None, "timed_out": True, "deadline_at": wake.get("due_at")}
        )
    return Wait(
        due_in=parse_duration(params.deadline),
        intent={"deadline": params.deadline, "signals": params.signals},
        on="signal",
        signals=list(params.signals),
    )
