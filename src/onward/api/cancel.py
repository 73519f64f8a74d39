"""Cancellation over HTTP (R12): one run, or every run a filter names in batches, and the
progress of bulk operations.

``POST /v1/runs/{run_id}/cancel`` answers what it did to the run (idempotent: a repeat says
``already_requested`` / ``already_cancelled``). ``POST /v1/runs/cancel`` records a bulk cancel
and answers 202 with its operation at once; this API process drives it in batches in the
background (each batch and its progress one transaction), and ``GET
/v1/operations/{operation_id}`` shows how far it got. If this process dies, the operation's
lease lapses and the elected sweeper continues it from its cursor.
"""

import asyncio
import logging
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from onward.api.models import MAX_EVENT_ID, NO_NUL, OperationView
from onward.automations.document import ID_PATTERN
from onward.engine import Engine

log = logging.getLogger("onward.api")

Text = Annotated[str, Field(min_length=1, max_length=MAX_EVENT_ID, pattern=NO_NUL)]
Reason = Annotated[str, Field(min_length=1, max_length=1000, pattern=NO_NUL)]


def _text_instant(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError("an ISO 8601 instant, as text")
    return value


Instant = Annotated[datetime, BeforeValidator(_text_instant)]
RunIdPath = Annotated[str, Path(pattern=NO_NUL, max_length=256)]
OperationIdPath = Annotated[str, Path(pattern=NO_NUL, max_length=256)]


class CancelIn(BaseModel):
    """Why, and who asks (both optional)."""

    model_config = ConfigDict(extra="forbid")
    reason: Reason | None = None
    by: Text | None = None


class CancelAnswer(BaseModel):
    run_id: str
    status: str = Field(description="the run's status after the cancel")
    outcome: Literal[
        "cancelled",
        "cancel_requested",
        "already_requested",
        "already_cancelled",
        "already_finished",
    ] = Field(
        description="cancelled: at once (it was waiting, parked or ready); cancel_requested: a "
        "step is in flight, the run stops at its next safe point; already_*: nothing changed"
    )
    was: str | None = Field(default=None, description="the step's state when cancelled at once")


class CancelFilter(BaseModel):
    """Which unfinished runs to cancel: at least one of the filter fields."""

    model_config = ConfigDict(extra="forbid")
    automation_id: Annotated[str, Field(pattern=ID_PATTERN)] | None = None
    version: int | None = Field(default=None, ge=1, le=2_147_483_647, strict=True)
    status: Literal["active", "waiting", "parked"] | None = None
    contact_id: Text | None = None
    created_before: Instant | None = None
    created_after: Instant | None = None
    reason: Reason | None = None
    by: Text | None = None


def _drive_in_background(request: Request, engine: Engine, operation_id: str) -> None:
    tasks: set[asyncio.Task[Any]] = getattr(request.app.state, "operation_tasks", None) or set()
    request.app.state.operation_tasks = tasks

    async def drive() -> None:
        try:
            await engine.resume_operation(operation_id)
        except Exception:  # its lease lapses and the sweeper continues it
            log.exception("operation %s: its driver stopped", operation_id)

    task = asyncio.create_task(drive(), name=f"operation {operation_id}")
    tasks.add(task)
    task.add_done_callback(tasks.discard)


def router() -> APIRouter:
    """The cancellation routes, for ``create_app`` to include."""
    from onward.api.app import NOT_FOUND, JsonRoute, OrgDep

    routes = APIRouter(route_class=JsonRoute, tags=["cancellation"])

    @routes.post("/v1/runs/cancel", response_model=OperationView, status_code=202)
    async def cancel_many(body: CancelFilter, org: OrgDep, request: Request) -> Any:
        """Cancel every unfinished run the filter names, in batches, in the background of this
        process: 202 with the operation; its progress at ``GET /v1/operations/{id}``."""
        filters = body.model_dump(exclude={"reason", "by"}, exclude_none=True)
        op = await org.write(
            lambda: org.engine.begin_cancel_many(by=body.by or "api", reason=body.reason, **filters)
        )
        _drive_in_background(request, org.engine, op["operation_id"])
        return op

    @routes.post("/v1/runs/{run_id}/cancel", response_model=CancelAnswer, responses=NOT_FOUND)
    async def cancel_run(run_id: RunIdPath, org: OrgDep, body: CancelIn | None = None) -> Any:
        """Cancel one run: at once if nothing is executing (its timers, signal wait and
        approval closed), else at its next safe point. Idempotent: says what it did."""
        how = body or CancelIn()
        return await org.read(  # idempotent: safe to repeat after a lost connection
            lambda: org.engine.cancel(run_id, by=how.by or "api", reason=how.reason)
        )

    @routes.get("/v1/operations", response_model=list[OperationView], tags=["operations"])
    async def list_operations(org: OrgDep, limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> Any:
        """Bulk operations, newest first."""
        return await org.read(lambda: org.engine.operations(limit=limit))

    @routes.get(
        "/v1/operations/{operation_id}",
        response_model=OperationView,
        responses=NOT_FOUND,
        tags=["operations"],
    )
    async def get_operation(operation_id: OperationIdPath, org: OrgDep) -> Any:
        """One bulk operation and its progress."""
        return await org.read(lambda: org.engine.operation(operation_id))

    return routes
