"""Signed intake over HTTP (issue 14, :mod:`onward.intake`): the Standard Webhooks secrets an
automation's webhook endpoint requires. A secret is answered once, when it is added."""

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from onward.api.models import NO_NUL
from onward.automations.document import ID_PATTERN

AutomationPath = Annotated[str, Path(pattern=ID_PATTERN)]
SecretPath = Annotated[str, Path(pattern=r"^hsec_[0-9a-f]{1,64}$", description="a secret's id")]


class HookSecretIn(BaseModel):
    """Optionally the secret to use (``whsec_<base64>``, at least 24 bytes); default: a new one."""

    model_config = ConfigDict(extra="forbid")
    secret: str | None = Field(default=None, max_length=200, pattern=NO_NUL)


class HookSecretAdded(BaseModel):
    automation_id: str
    secret_id: str
    secret: str = Field(description="the signing secret: shown here only, never again")
    created_at: datetime


class HookSecretView(BaseModel):
    automation_id: str
    secret_id: str
    created_at: datetime


def router() -> APIRouter:
    """The hook-secret routes, for ``create_app`` to include."""
    from onward.api.app import NOT_FOUND, JsonRoute, OrgDep, Refused

    routes = APIRouter(route_class=JsonRoute, tags=["automations"])

    @routes.post(
        "/v1/automations/{automation_id}/hook-secrets",
        response_model=HookSecretAdded,
        status_code=201,
        responses=NOT_FOUND,
    )
    async def add_secret(automation_id: AutomationPath, body: HookSecretIn, org: OrgDep) -> Any:
        """Require the Standard Webhooks signature on ``POST /v1/hooks/{automation_id}`` with one
        more secret (the others stay valid: rotation). 404 for an automation not published;
        422 for a secret that is not ``whsec_<base64>`` of at least 24 bytes."""
        return await org.write(lambda: org.engine.add_hook_secret(automation_id, body.secret))

    @routes.get("/v1/automations/{automation_id}/hook-secrets", response_model=list[HookSecretView])
    async def list_secrets(automation_id: AutomationPath, org: OrgDep) -> Any:
        """The endpoint's secrets (ids, never the secrets); none: it takes unsigned requests."""
        return await org.read(lambda: org.engine.hook_secrets(automation_id))

    @routes.delete(
        "/v1/automations/{automation_id}/hook-secrets/{secret_id}",
        status_code=204,
        responses=NOT_FOUND,
    )
    async def remove_secret(
        automation_id: AutomationPath, secret_id: SecretPath, org: OrgDep
    ) -> None:
        """Refuse requests signed with this secret from now on (with none left, the endpoint
        takes unsigned requests again)."""
        if not await org.write(lambda: org.engine.remove_hook_secret(automation_id, secret_id)):
            raise Refused(404, "not_found", f"no secret {secret_id!r} on {automation_id!r}")

    return routes
