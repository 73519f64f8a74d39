"""Operator actions over HTTP (B2/B3, :mod:`onward.actions`)::

    POST /v1/runs/{run_id}/review   {how: happened|retry|skip, reference?, effect_key?, by}
    POST /v1/runs/{run_id}/resume   {by}
    POST /v1/runs/{run_id}/fork     {from_step?, version?, by}   201 a new fork, 200 the same again

Each names who acts (``by``), written in the run's history. An unknown run is a 404
``unknown_run``; an action that does not apply to the run as it is (not parked, parked on
something else, finished, never reached the step, ...) a 409 ``action_refused`` with the
reason, and nothing changed; ``happened`` without a reference a 422.

``create_app`` includes :func:`router`; the routes are built when it is called, because they
share ``onward.api.app``'s dependencies and that module imports this one.
"""

# No ``from __future__ import annotations``: the routes are defined inside ``router()`` and
# FastAPI must see their annotations (local aliases) as objects, not as strings to resolve.
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from onward.actions import MAX_BY
from onward.api.models import NO_NUL
from onward.automations.document import ID_PATTERN

ByText = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_BY,
        pattern=r"^[^\x00]*[^\s\x00][^\x00]*$",
        description="who acts (written in the run's history)",
    ),
]


class ReviewIn(BaseModel):
    """How a person resolves the review a run is parked for: the call ``happened`` (give the
    provider's ``reference``: the step advances with it, no call is made), ``retry`` (call the
    provider again with the same idempotency key), or ``skip`` (the step is skipped and the
    run goes on)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"how": "happened", "reference": "ch_3f9a", "by": "ana@example.test"}]
        },
    )
    how: Literal["happened", "retry", "skip"]
    reference: str | None = Field(
        default=None, min_length=1, max_length=512, pattern=NO_NUL, description="with happened"
    )
    effect_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        pattern=NO_NUL,
        description="the effect, when the step has several in review",
    )
    by: ByText


class ResumeIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"by": "ana"}]})
    by: ByText


class ForkIn(BaseModel):
    """Retry a failed, cancelled or exceeded run from ``from_step`` (default: where it stopped)
    as a new run on ``version`` (default: its own)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"by": "ana"}]})
    from_step: str | None = Field(default=None, pattern=ID_PATTERN)
    version: int | None = Field(default=None, ge=1, le=2_147_483_647)
    by: ByText


class ActionAnswer(BaseModel):
    run_id: str
    status: str = Field(description="active: the step is ready again")
    seq: int
    step_id: str
    by: str
    how: str | None = Field(default=None, description="review: happened, retry or skip")
    reference: str | None = None
    effects: list[str] | None = Field(default=None, description="review: the effects resolved")
    was: str | None = Field(default=None, description="resume: what it was parked on")


class ForkAnswer(BaseModel):
    run_id: str = Field(description="the fork")
    forked_from: str
    created: bool
    duplicate: bool = Field(description="the same fork was asked before: this is the first")
    start_key: str
    step_id: str
    seq: int
    version: int


def router() -> APIRouter:
    """The operator routes, for ``create_app`` to include."""
    from onward.api.app import NOT_FOUND, JsonRoute, NoNulPath, OrgDep, _errors

    routes = APIRouter(prefix="/v1/runs", route_class=JsonRoute, tags=["runs"])
    refusals = {**NOT_FOUND, **_errors(409)}

    @routes.post("/{run_id}/review", response_model=ActionAnswer, responses=refusals)
    async def resolve_review(run_id: NoNulPath, body: ReviewIn, org: OrgDep) -> Any:
        """Resolve the review a run is parked for (an outside call whose outcome the engine
        could not settle safely); its step is ready again. 409 when the run is not parked for
        review."""
        return await org.write(
            lambda: org.engine.resolve_review(
                run_id, body.how, by=body.by, reference=body.reference, effect_key=body.effect_key
            )
        )

    @routes.post("/{run_id}/resume", response_model=ActionAnswer, responses=refusals)
    async def resume(run_id: NoNulPath, body: ResumeIn, org: OrgDep) -> Any:
        """Resume a parked run (reconnect once the connection is restored, budget, circuit
        once closed, migration once its step is in the version); its step is ready again. 409
        when it does not apply (a review is resolved instead)."""
        return await org.write(lambda: org.engine.resume(run_id, by=body.by))

    @routes.post(
        "/{run_id}/fork",
        response_model=ForkAnswer,
        status_code=201,
        responses={**refusals, 200: {"model": ForkAnswer, "description": "the same fork again"}},
    )
    async def fork(run_id: NoNulPath, body: ForkIn, org: OrgDep, response: Response) -> Any:
        """Retry a failed, cancelled or exceeded run from a step as a new run linked to it: the
        steps before it are not run again. 201 a new fork; 200 the same fork asked again."""
        forked = await org.write(
            lambda: org.engine.fork(
                run_id, by=body.by, from_step=body.from_step, version=body.version
            )
        )
        if not forked.created:
            response.status_code = 200
        return forked.as_dict()

    return routes
