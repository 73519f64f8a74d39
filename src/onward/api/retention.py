"""Retention over HTTP: how long finished runs are kept, and pruning them now (onward.retention)."""

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from onward.retention import MAX_DAYS, MIN_DAYS


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a number, not true or false")
    return value


Days = Annotated[float, Field(ge=MIN_DAYS, le=MAX_DAYS)]
Whole = Annotated[int, BeforeValidator(_not_a_bool)]


class RetentionIn(BaseModel):
    """``{"days": 90}``, ``{"days": "forever"}``, or ``{"days": null}`` for the engine's
    default (``ONWARD_RETENTION_DAYS``)."""

    model_config = ConfigDict(extra="forbid")
    days: Days | Literal["forever"] | None = Field(
        description="days after a run finished (1..36525), forever, or null: the default"
    )

    @field_validator("days", mode="before")
    @classmethod
    def _days_not_a_bool(cls, value: Any) -> Any:
        return _not_a_bool(value)


class RetentionView(BaseModel):
    org_id: str
    days: float | None = Field(description="the bound in force; null when kept forever")
    keep_forever: bool
    source: Literal["organisation", "default"]
    default_days: float | None
    cutoff: datetime | None = Field(description="runs finished before this instant are deleted")
    oldest_finished_at: datetime | None
    oldest_finished_age_days: float | None


class PruneIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dry_run: bool = Field(
        default=False, strict=True, description="only count what would be deleted"
    )
    max_runs: Whole = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description="stop after this many runs (the sweeper continues)",
    )


class PruneAnswer(BaseModel):
    org_id: str
    dry_run: bool
    days: float | None
    keep_forever: bool
    cutoff: datetime | None
    pruned: int = Field(description="finished runs deleted with every row of theirs")
    batches: int
    rows: dict[str, int] = Field(description="rows deleted per table")
    seconds: float
    due: int = Field(description="finished runs past the cutoff still there")


def router() -> APIRouter:
    """The retention routes, for ``create_app`` to include."""
    from onward.api.app import JsonRoute, OrgDep

    routes = APIRouter(route_class=JsonRoute, tags=["retention"])

    @routes.get("/v1/retention", response_model=RetentionView)
    async def show_retention(org: OrgDep) -> Any:
        """How long this organisation's finished runs are kept, and its oldest finished run."""
        return await org.read(org.engine.retention)

    @routes.put("/v1/retention", response_model=RetentionView)
    async def set_retention(body: RetentionIn, org: OrgDep) -> Any:
        """Set how long finished runs are kept: days, forever, or the engine's default."""
        days = None if body.days == "forever" else body.days
        return await org.write(
            lambda: org.engine.set_retention(days, keep_forever=body.days == "forever")
        )

    @routes.post("/v1/retention/prune", response_model=PruneAnswer)
    async def prune(org: OrgDep, body: PruneIn | None = None) -> Any:
        """Delete finished runs past the retention now, in batches, at most ``max_runs``."""
        ask = body or PruneIn()
        return await org.write(lambda: org.engine.prune(dry_run=ask.dry_run, max_runs=ask.max_runs))

    return routes
