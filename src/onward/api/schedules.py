"""The HTTP routes of schedules that start runs (:mod:`onward.schedules`)::

    GET  /v1/schedules[?automation=A]                          every schedule
    POST /v1/schedules/{automation_id}/{schedule_id}/pause     fires nothing until resumed
    POST /v1/schedules/{automation_id}/{schedule_id}/resume    [?catch_up=true]
    POST /v1/schedules/{automation_id}/{schedule_id}/trigger   fire now, once [Idempotency-Key]

An unknown schedule is a 404 ``unknown_schedule`` in the API's one error model (``ErrorBody``).
Pause and resume are idempotent, so they are repeated once after a lost database connection,
like reads; so is a trigger that carries an ``Idempotency-Key`` (its start key), while one
without answers 503 and may be sent again (a new instant: a second run).

``create_app`` includes :func:`router`; the routes are built when it is called, because they
share ``onward.api.app``'s dependencies (the organisation of a request) and error names, and
that module imports this one.
"""

# No ``from __future__ import annotations``: the routes are defined inside ``router()`` and
# FastAPI must see their annotations (local aliases) as objects, not as strings to resolve.
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Header, Path, Query, Response

from onward.api.models import ScheduleView, TriggerAnswer
from onward.automations.document import ID_PATTERN
from onward.errors import UnknownSchedule
from onward.schedules import MAX_TRIGGER_KEY

T = TypeVar("T")


def router() -> APIRouter:
    """The schedule routes, for ``create_app`` to include."""
    from onward.api.app import NOT_FOUND, OrgDep, Refused

    routes = APIRouter(prefix="/v1/schedules", tags=["schedules"])
    automation_path = Annotated[str, Path(pattern=ID_PATTERN, description="an automation id")]
    schedule_path = Annotated[str, Path(pattern=ID_PATTERN, description="its schedule id")]

    async def known(call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except UnknownSchedule as exc:
            raise Refused(404, "unknown_schedule", str(exc)) from None

    @routes.get("", response_model=list[ScheduleView])
    async def list_schedules(
        org: OrgDep,
        automation: Annotated[
            str | None, Query(pattern=ID_PATTERN, description="only this automation's")
        ] = None,
    ) -> Any:
        """Every schedule, by automation and id: its rule and zone, its next firing, what its
        last firing did (with its run's status), its counters, and whether it is paused."""
        return await org.read(lambda: org.engine.schedules(automation))

    @routes.post(
        "/{automation_id}/{schedule_id}/pause", response_model=ScheduleView, responses=NOT_FOUND
    )
    async def pause(automation_id: automation_path, schedule_id: schedule_path, org: OrgDep) -> Any:
        """Pause: the schedule fires nothing until resumed (pausing twice changes nothing)."""
        return await known(
            lambda: org.read(lambda: org.engine.pause_schedule(automation_id, schedule_id))
        )

    @routes.post(
        "/{automation_id}/{schedule_id}/resume", response_model=ScheduleView, responses=NOT_FOUND
    )
    async def resume(
        automation_id: automation_path,
        schedule_id: schedule_path,
        org: OrgDep,
        catch_up: Annotated[
            bool,
            Query(
                description="replay the paused period: its firings count as missed and the "
                "schedule's catch-up policy decides (default: the next firing is the next "
                "future one)"
            ),
        ] = False,
    ) -> Any:
        """Resume a paused schedule (a schedule that is not paused is left as it is)."""
        return await known(
            lambda: org.read(
                lambda: org.engine.resume_schedule(automation_id, schedule_id, catch_up=catch_up)
            )
        )

    @routes.post(
        "/{automation_id}/{schedule_id}/trigger",
        response_model=TriggerAnswer,
        status_code=202,
        responses={
            200: {"model": TriggerAnswer, "description": "Not started: a duplicate, or skipped"},
            **NOT_FOUND,
        },
    )
    async def trigger(
        automation_id: automation_path,
        schedule_id: schedule_path,
        org: OrgDep,
        response: Response,
        idempotency_key: Annotated[
            str | None,
            Header(
                alias="Idempotency-Key",
                pattern=r"^[!-~]+$",
                max_length=MAX_TRIGGER_KEY,
                description="your key: the same key again answers the same run (a duplicate)",
            ),
        ] = None,
    ) -> Any:
        """Fire the schedule now, once, under its overlap policy (paused or not). 202: a run
        started. 200: ``duplicate`` (this key already started ``run_id``) or ``skipped`` (a run
        of this schedule is unfinished and the overlap policy is skip or buffer_one)."""

        async def fire() -> Any:
            return await org.engine.trigger_schedule(
                automation_id, schedule_id, key=idempotency_key
            )

        repeat = org.read if idempotency_key is not None else org.write
        done = await known(lambda: repeat(fire))
        if done.outcome != "started":
            response.status_code = 200
        return TriggerAnswer.model_validate(done, from_attributes=True)

    return routes
