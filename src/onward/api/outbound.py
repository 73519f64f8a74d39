"""The outbound allow-list over HTTP: where this organisation's user-configured HTTP may go
although the address is not public (onward.outbound)."""

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from onward.outbound import ENTRY_HELP, MAX_ENTRIES, MAX_ENTRY

Entry = Annotated[str, Field(min_length=1, max_length=MAX_ENTRY)]


class EntriesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    entries: list[Entry] = Field(min_length=1, max_length=MAX_ENTRIES, description=ENTRY_HELP)


class AllowView(BaseModel):
    engine: list[str] = Field(description="ONWARD_OUTBOUND_ALLOW: every organisation's")
    org: list[str] = Field(description="this organisation's own entries")


def router() -> APIRouter:
    """The outbound routes, for ``create_app`` to include."""
    from onward.api.app import JsonRoute, OrgDep

    routes = APIRouter(route_class=JsonRoute, tags=["outbound"])

    @routes.get("/v1/outbound/allow", response_model=AllowView)
    async def show_allow(org: OrgDep) -> Any:
        """The engine's and this organisation's allow-list entries."""
        return await org.read(org.engine.outbound_allow)

    @routes.post("/v1/outbound/allow", response_model=AllowView)
    async def allow(body: EntriesIn, org: OrgDep) -> Any:
        """Add entries to this organisation's allow-list (all or none: 422 names a bad one)."""
        return await org.write(lambda: org.engine.allow_outbound(body.entries))

    @routes.post("/v1/outbound/disallow", response_model=AllowView)
    async def disallow(body: EntriesIn, org: OrgDep) -> Any:
        """Remove entries from this organisation's allow-list."""
        return await org.write(lambda: org.engine.disallow_outbound(body.entries))

    return routes
