"""The audit over HTTP: who changed what in this organisation, and when (onward.audit)."""

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, BeforeValidator, Field

from onward.audit import ACTIONS, MAX_LIMIT

Action = Literal[ACTIONS]  # type: ignore[valid-type]


def _iso_instant(value: Any) -> Any:
    """An ISO 8601 instant only (a bare number is not one, as the schema says)."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            raise ValueError("an ISO 8601 instant") from None
    return value


Instant = Annotated[datetime, BeforeValidator(_iso_instant)]


class AuditRow(BaseModel):
    audit_id: int = Field(description="increasing; page on with ?before=")
    at: datetime
    actor: str = Field(description="who: an operator, 'api', or the by the call named")
    action: str
    target: str = Field(description="what: a run, automation version, operation, key, ...")
    detail: dict[str, Any] = Field(description="a small detail, never a secret")


class AuditPage(BaseModel):
    rows: list[AuditRow] = Field(description="newest first")
    next_before: int | None = Field(
        description="pass as ?before= for the next (older) page; null: this was the last"
    )


def router() -> APIRouter:
    """The audit route, for ``create_app`` to include."""
    from onward.api.app import JsonRoute, OrgDep

    routes = APIRouter(route_class=JsonRoute, tags=["audit"])

    @routes.get("/v1/audit", response_model=AuditPage)
    async def list_audit(
        org: OrgDep,
        action: Annotated[Action | None, Query(description="only this action")] = None,
        since: Annotated[Instant | None, Query(description="only rows at or after")] = None,
        before: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    ) -> Any:
        """This organisation's audit rows, newest first, keyset-paged by ``audit_id``."""
        rows = await org.read(
            lambda: org.engine.audit(limit=limit, action=action, since=since, before=before)
        )
        full = len(rows) == limit
        return AuditPage(
            rows=[AuditRow(**r) for r in rows],
            next_before=rows[-1]["audit_id"] if full and rows else None,
        )

    return routes
