"""Migrating runs between versions over HTTP (R11), and an operation's progress.

``POST /v1/automations/{automation_id}/migrations`` validates the migration first: a refused
one (an unknown step or version, a reachable step left unmapped, ...) is 422
``migration_refused`` with every reason, and nothing moves. ``dry_run: true`` answers the plan
(200): per run, what would happen and why. Otherwise the migration becomes an operation,
driven in batches by this process: 202 with its row, whose progress ``GET
/v1/operations/{operation_id}`` shows (``pass``, ``done``, ``deferred``, ``outcomes``). If
this process stops, the operation keeps its cursor and ``operations.resume`` continues it.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from onward.api.models import NO_NUL, OperationView, operation_view
from onward.automations.document import ID_PATTERN

StepId = Annotated[str, Field(pattern=ID_PATTERN)]
Version = Annotated[int, Field(ge=1, le=2_147_483_647, strict=True)]
OperationIdPath = Annotated[str, Path(pattern=r"^op_[0-9a-f]{1,64}$")]


class MigrationIn(BaseModel):
    """Move the unfinished runs of version ``from`` to version ``to``. ``map``: ``{old: new}``
    for steps whose id changed (a step whose id both versions have maps to itself).
    ``removed_step_policy``: what happens to a run at a step the new version does not have --
    ``park`` (it waits for a person on its version), ``skip-to:STEP`` or ``cancel``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    from_version: Version = Field(alias="from")
    to_version: Version = Field(alias="to")
    map: dict[StepId, StepId] = Field(default_factory=dict, max_length=1000)
    removed_step_policy: str | None = Field(
        default=None,
        pattern=r"^(park|cancel|skip-to:[A-Za-z0-9][A-Za-z0-9_.\-]{0,127})$",
        description="park, skip-to:STEP or cancel",
    )
    dry_run: bool = Field(default=False, strict=True)
    by: str = Field(default="api", min_length=1, max_length=200, pattern=NO_NUL)


class PlannedRun(BaseModel):
    run_id: str
    status: str
    step_status: str | None
    from_step: str | None
    to_step: str | None
    outcome: str = Field(description="moved, reentered, skipped_to, parked, cancelled, ...")
    reason: str


class MigrationPlan(BaseModel):
    """A dry run: what the migration would do to each unfinished run of the old version."""

    model_config = ConfigDict(populate_by_name=True)
    automation_id: str
    from_version: int = Field(alias="from")
    to_version: int = Field(alias="to")
    map: dict[str, str]
    removed_step_policy: str | None
    dry_run: bool
    runs: int = Field(description="the unfinished runs of the old version")
    outcomes: dict[str, int]
    plan: list[PlannedRun] = Field(description="the first 1000 runs, by run id")


def router() -> APIRouter:
    """The migration and operation routes, for ``create_app`` to include."""
    from onward.api.app import JsonRoute, OrgDep

    routes = APIRouter(route_class=JsonRoute, tags=["versions"])

    @routes.post(
        "/v1/automations/{automation_id}/migrations",
        status_code=202,
        response_model=None,
        responses={
            202: {"model": OperationView, "description": "The migration began: its operation"},
            200: {"model": MigrationPlan, "description": "A dry run: the plan, nothing moved"},
        },
    )
    async def migrate_runs(
        automation_id: Annotated[str, Path(pattern=ID_PATTERN)], body: MigrationIn, org: OrgDep
    ) -> JSONResponse:
        """Move the unfinished runs of one version to another, in batches (or, ``dry_run``,
        say what would happen to each). 422 ``migration_refused`` lists every reason a
        migration cannot go ahead; nothing moved then."""

        async def go() -> dict[str, Any]:
            answer: dict[str, Any] = await org.engine.migrate_runs(
                automation_id,
                body.from_version,
                body.to_version,
                body.map,
                body.removed_step_policy,
                dry_run=body.dry_run,
                by=body.by,
                wait=False,
            )
            return answer

        answer = await (org.read(go) if body.dry_run else org.write(go))
        if body.dry_run:
            plan = MigrationPlan.model_validate(answer).model_dump(mode="json", by_alias=True)
            return JSONResponse(plan, status_code=200)
        return JSONResponse(operation_view(answer), status_code=202)

    return routes
