"""API keys over HTTP (issue 14, :mod:`onward.api_keys`): an organisation's keys, made,
listed and revoked with an ``admin`` key of that organisation. A key is answered once, when it
is made; only its hash is kept."""

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from onward.api.models import NO_NUL

Scope = Literal["runs:read", "runs:write", "automations:write", "admin"]
KeyIdPath = Annotated[str, Path(pattern=r"^[0-9a-f]{16}$", description="a key's id")]


class KeyIn(BaseModel):
    """A name for people to know the key by, and what it may do."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200, pattern=NO_NUL)
    scopes: list[Scope] = Field(min_length=1, max_length=4)


class KeyView(BaseModel):
    key_id: str
    name: str
    scopes: list[str]
    created_at: datetime
    created_by: str
    revoked_at: datetime | None = None
    revoked_by: str | None = None
    last_used_at: datetime | None = None


class KeyCreated(KeyView):
    key: str = Field(description="the key: shown here only, never again")


def router() -> APIRouter:
    """The key routes, for ``create_app`` to include."""
    from onward.api.app import NOT_FOUND, JsonRoute, OrgDep, Refused

    routes = APIRouter(route_class=JsonRoute, tags=["keys"])

    @routes.post("/v1/keys", response_model=KeyCreated, status_code=201)
    async def create_key(body: KeyIn, org: OrgDep) -> Any:
        """Make a key of this organisation with these scopes: the answer holds the key, the
        only time it is shown. Audited (``key_create``)."""
        row, key = await org.write(lambda: org.engine.create_key(body.name, body.scopes))
        return {**row, "key": key}

    @routes.get("/v1/keys", response_model=list[KeyView])
    async def list_keys(org: OrgDep) -> Any:
        """This organisation's keys, live and revoked, newest first (never a key)."""
        return await org.read(org.engine.keys)

    @routes.delete("/v1/keys/{key_id}", response_model=KeyView, responses=NOT_FOUND)
    async def revoke_key(key_id: KeyIdPath, org: OrgDep) -> Any:
        """Revoke a key: from this answer on it authenticates nothing. 404 when this
        organisation has no such live key. Audited (``key_revoke``)."""
        row = await org.write(lambda: org.engine.revoke_key(key_id))
        if row is None:
            raise Refused(404, "not_found", f"no live key {key_id}")
        return row

    return routes
