"""Calendar timers over HTTP (R6): preview a rule's next instants; recompute pending timers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from onward import calendar, timers
from onward.api.app import NOT_FOUND, JsonRoute, OrgDep
from onward.api.models import NO_NUL
from onward.durations import parse_duration
from onward.errors import InvalidInput

router = APIRouter(route_class=JsonRoute, tags=["timers"])

RuleText = Annotated[str, Field(min_length=1, max_length=500, pattern=NO_NUL)]
ZoneText = Annotated[str, Field(min_length=1, max_length=64, pattern=NO_NUL)]
IdText = Annotated[str, Field(min_length=1, max_length=256, pattern=NO_NUL)]


class Occurrence(BaseModel):
    wall: str = Field(description="the local wall time the rule asked for")
    local: str = Field(description="the local time it is (differs from wall in a DST gap)")
    utc: str
    substitution: str | None = Field(description="gap (moved forward), fold (the first), null")
    spread_s: float
    offset_s: float | None = None
    due_at: str | None = None


class RecomputeRequest(BaseModel):
    """Which pending calendar timers to recompute, and what changed. ``every_organisation``
    recomputes every pending calendar timer as it is (after a tz database update)."""

    model_config = ConfigDict(extra="forbid")
    run_id: IdText | None = None
    contact_id: IdText | None = None
    automation_id: IdText | None = None
    step_id: IdText | None = None
    zone: ZoneText | None = None
    rule: RuleText | None = None
    every_organisation: bool = False


class Move(BaseModel):
    org_id: str
    timer_id: int
    run_id: str
    from_: str = Field(alias="from")
    to: str


class RecomputeAnswer(BaseModel):
    examined: int
    moved: int
    unchanged: int
    no_occurrence: int
    seconds: float
    sample: list[Move]


@router.get("/v1/timers/preview", response_model=list[Occurrence])
async def preview_timers(
    org: OrgDep,
    rule: Annotated[str, Query(min_length=1, max_length=500, pattern=NO_NUL)],
    zone: Annotated[str, Query(min_length=1, max_length=64, pattern=NO_NUL)],
    after: Annotated[datetime | None, Query(description="ISO instant; default: now")] = None,
    count: Annotated[int, Query(ge=1, le=500)] = 5,
    spread: Annotated[str, Query(max_length=32, pattern=NO_NUL)] = "off",
    key: Annotated[str | None, Query(max_length=256, pattern=NO_NUL)] = None,
) -> Any:
    """The next instants of a rule in a zone, local and UTC, DST substitutions marked: check a
    schedule before publishing it. ``key`` (a run id) shows that run's exact spread offset."""
    if after is not None and after.tzinfo is None:
        raise InvalidInput("after: give an offset (Z, +01:00): an instant, not a wall time")
    reference: datetime = (
        after if after is not None else await org.read(lambda: timers.db_now(org.engine.pool))
    )
    try:
        spread_s = 0.0 if spread == "off" else parse_duration(spread)
        return calendar.preview(rule, zone, reference, count, spread_s=spread_s, key=key)
    except (calendar.RuleError, ValueError) as exc:
        raise InvalidInput(str(exc)) from None


@router.post("/v1/timers/recompute", response_model=RecomputeAnswer)
async def recompute_timers(body: RecomputeRequest, org: OrgDep) -> Any:
    """Move pending calendar timers to what their rule and zone say now (a contact's zone or an
    automation's rule changed, or the tz database was updated). Each move is written to its
    run's history with the old and new instants; the old wake then does nothing."""
    narrowed = (body.run_id, body.contact_id, body.automation_id)
    if body.every_organisation and any(
        v is not None for v in (*narrowed, body.step_id, body.zone, body.rule)
    ):
        raise InvalidInput("every_organisation recomputes every timer as it is: nothing else")
    if not body.every_organisation and all(v is None for v in narrowed):
        raise InvalidInput(
            "say which timers: run_id, contact_id, automation_id or every_organisation"
        )
    if body.step_id is not None and body.automation_id is None:
        raise InvalidInput("step_id needs automation_id")
    done = await org.write(
        lambda: org.engine.recompute_timers(
            run_id=body.run_id,
            contact_id=body.contact_id,
            automation_id=body.automation_id,
            step_id=body.step_id,
            zone=body.zone,
            rule=body.rule,
            every_organisation=body.every_organisation,
        )
    )
    return done.as_dict()


class SkipRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_id: IdText


class Skipped(BaseModel):
    timer_id: int
    from_: datetime = Field(alias="from")
    to: datetime
    purpose: str


@router.post(
    "/v1/timers/skip",
    response_model=list[Skipped],
    response_model_by_alias=True,
    responses=NOT_FOUND,
)
async def skip_timer(body: SkipRequest, org: OrgDep) -> Any:
    """Skip a waiting run's timer (a wait, or a signal's or approval's deadline): it fires now,
    with a ``timer_moved`` row in the run's history. Empty: the run waits on no timer."""
    return await org.write(lambda: org.engine.skip_wait(body.run_id))
