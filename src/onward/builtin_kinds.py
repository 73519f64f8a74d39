"""The built-in step kinds: ``set``, ``branch``, ``goto`` (fast lane) and ``wait_for``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from onward.automations import cel
from onward.automations.document import StepDef
from onward.durations import parse_duration
from onward.errors import PermanentError
from onward.kinds import Advance, StepContext, Wait, step_kind


class SetParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    values: dict[str, str] = Field(min_length=1, description="variable name -> CEL expression")


def _check_set(step: StepDef, params: SetParams) -> list[str]:
    return [f"step {step.id}: {p}" for src in params.values.values() for p in cel.check(src)]


@step_kind("set", lane="fast", params=SetParams, check=_check_set)
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
    "branch", lane="fast", params=BranchParams, successors=_branch_successors, check=_check_branch
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


@step_kind("goto", lane="fast", params=GotoParams, successors=lambda s, p: [p.target])
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


@step_kind("wait_for", lane="wait", params=WaitForParams)
async def wait_for(step: StepContext) -> Any:
    if step.wake is not None:  # the timer fired: the wait is over
        return Advance(output={"waited": step.params.duration, "woken_by": step.wake.get("by")})
    seconds = parse_duration(step.params.duration)
    return Wait(due_in=seconds, intent={"duration": step.params.duration})
