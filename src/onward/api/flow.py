"""Flow control over HTTP (R5): limits by key, circuit breakers, cost budgets, lane policies."""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from onward.api.models import NO_NUL

KeyPath = Annotated[
    str,
    Path(
        max_length=300,
        pattern=r"^(org|connection:[^\x00]+|provider:[^\x00]+)$",
        description="org, connection:<id> or provider:<name>",
    ),
]
CircuitPath = Annotated[
    str,
    Path(
        max_length=300,
        pattern=r"^(connection:[^\x00]+|provider:[^\x00]+)$",
        description="connection:<id> or provider:<name>",
    ),
]


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a whole number, not true or false")
    return value


Whole = Annotated[int, BeforeValidator(_not_a_bool)]


class LimitIn(BaseModel):
    """A concurrency cap (``max_concurrent``), a rate (``calls`` per ``per_seconds``), or both."""

    model_config = ConfigDict(extra="forbid")
    max_concurrent: Whole | None = Field(default=None, ge=1, le=100_000)
    calls: Whole | None = Field(default=None, ge=1, le=1_000_000)
    per_seconds: float | None = Field(default=None, gt=0, le=86_400, strict=True)


class LimitView(BaseModel):
    key: str
    max_concurrent: int | None
    calls: int | None
    per_seconds: float | None
    in_use: int = 0


class CircuitIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    threshold: Whole = Field(default=5, ge=1, le=10_000)
    window_seconds: float = Field(default=30.0, gt=0, le=86_400, strict=True)
    cooldown_seconds: float = Field(default=30.0, gt=0, le=86_400, strict=True)


class CircuitView(BaseModel):
    key: str
    state: str
    threshold: int
    window_seconds: float
    cooldown_seconds: float
    failures: int = 0
    retry_at: Any = None
    probe_run_id: str | None = None
    parked: int = 0


class BudgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    per_day: float = Field(
        ge=0, le=1e12, strict=True, description="in the unit of the path, per day (UTC)"
    )


class BudgetView(BaseModel):
    scope: str
    unit: str
    per_day: float
    charged_today: float = 0.0
    reserved: float = 0.0
    parked: int = 0


class LaneView(BaseModel):
    lane: str
    served: bool = Field(description="false: ONWARD_LANE_POLICY tunes it, ONWARD_LANES omits it")
    capacity: int
    lease_seconds: float
    max_attempts: int
    base: float
    cap: float


def router() -> APIRouter:
    """The flow-control routes, for ``create_app`` to include."""
    from onward.api.app import NOT_FOUND, JsonRoute, OrgDep, Refused

    routes = APIRouter(route_class=JsonRoute, tags=["flow control"])

    @routes.get("/v1/limits", response_model=list[LimitView])
    async def list_limits(org: OrgDep) -> Any:
        """Every key's limits, with the slots in use now (across every worker)."""
        return await org.read(org.engine.limits)

    @routes.put("/v1/limits/{key}", response_model=LimitView)
    async def set_limit(key: KeyPath, body: LimitIn, org: OrgDep) -> Any:
        """Set a key's limits (replacing what it had)."""
        return await org.write(
            lambda: org.engine.set_limit(
                key,
                max_concurrent=body.max_concurrent,
                calls=body.calls,
                per_seconds=body.per_seconds,
            )
        )

    @routes.delete("/v1/limits/{key}", status_code=204, responses=NOT_FOUND)
    async def remove_limit(key: KeyPath, org: OrgDep) -> None:
        """No limits for this key any more."""
        if not await org.write(lambda: org.engine.remove_limit(key)):
            raise Refused(404, "not_found", f"no limits for {key}")

    @routes.get("/v1/circuits", response_model=list[CircuitView])
    async def list_circuits(org: OrgDep) -> Any:
        """Every circuit: its state, failures in the window, the steps parked on it."""
        return await org.read(org.engine.circuits)

    @routes.put("/v1/circuits/{key}", response_model=CircuitView)
    async def configure_circuit(key: CircuitPath, body: CircuitIn, org: OrgDep) -> Any:
        """When the circuit opens (threshold failures in the window) and how long it stays
        open before one probe (the cool-down)."""
        return await org.write(
            lambda: org.engine.configure_circuit(
                key,
                threshold=body.threshold,
                window_seconds=body.window_seconds,
                cooldown_seconds=body.cooldown_seconds,
            )
        )

    @routes.get("/v1/budgets", response_model=list[BudgetView])
    async def list_budgets(org: OrgDep) -> Any:
        """Every budget with today's charges, live reservations and parked steps."""
        return await org.read(org.engine.budgets)

    @routes.put("/v1/budgets/{scope}/{unit}", response_model=BudgetView)
    async def set_budget(
        scope: Annotated[
            str, Path(max_length=256, pattern=NO_NUL, description="* or an automation")
        ],
        unit: Literal["usd", "tokens"],
        body: BudgetIn,
        org: OrgDep,
    ) -> Any:
        """Set a budget per day; the steps parked on budgets resume (each checks again)."""
        return await org.write(lambda: org.engine.set_budget(scope, unit, body.per_day))

    @routes.get("/v1/lanes", response_model=list[LaneView])
    async def list_lanes(org: OrgDep) -> Any:
        """The lane policies this engine's workers serve."""
        from onward.lanes import describe

        settings = org.engine.settings
        return describe(
            dict(settings.lanes), settings.lane_policy, lease_seconds=settings.lease_seconds
        )

    return routes
