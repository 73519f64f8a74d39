"""Notifications over HTTP (R15, :mod:`onward.notify`): destinations, and whether notifications
arrived."""

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from onward.api.models import NO_NUL
from onward.errors import InvalidInput
from onward.notify import MAX_URL

DestinationPath = Annotated[
    str,
    Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$", description="a name for the destination"),
]
NotificationPath = Annotated[int, Path(ge=1, le=2**63 - 1)]


class DestinationIn(BaseModel):
    """A webhook (``url``, optionally its ``secret``: a new one is made and answered once), or a
    Slack channel / an email address (``connection_id`` + ``target``)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["webhook", "slack", "email"] = "webhook"
    url: str | None = Field(default=None, max_length=MAX_URL, pattern=NO_NUL)
    secret: str | None = Field(default=None, max_length=200, pattern=NO_NUL)
    connection_id: str | None = Field(default=None, max_length=256, pattern=NO_NUL)
    target: str | None = Field(default=None, max_length=320, pattern=NO_NUL)


class DestinationView(BaseModel):
    destination_id: str
    kind: str
    url: str | None
    connection_id: str | None
    target: str | None
    signed: bool = Field(description="a webhook whose requests carry a signature")
    created_at: datetime
    updated_at: datetime


class DestinationSet(BaseModel):
    destination_id: str
    kind: str
    url: str | None
    connection_id: str | None
    target: str | None
    secret: str | None = Field(
        description="the webhook's signing secret when onward made it: shown here only "
        "(a secret sent in the request is not echoed back)"
    )
    backlog: int = Field(description="notifications still undelivered that now go there too")


class DeliveryView(BaseModel):
    destination_id: str
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    next_attempt_at: datetime | None = None
    last_status: int | None = None
    last_error: str | None = None
    delivered_at: datetime | None = None


class NotificationView(BaseModel):
    notification_id: int
    webhook_id: str = Field(description="what receivers deduplicate by (header webhook-id)")
    kind: str
    subject: str
    body: dict[str, Any]
    created_at: datetime
    delivered_at: datetime | None
    deliveries: list[DeliveryView]


class Retried(BaseModel):
    retried: int = Field(description="deliveries due now")


def router() -> APIRouter:
    """The notification routes, for ``create_app`` to include."""
    from onward.api.app import NOT_FOUND, JsonRoute, OrgDep, Refused

    routes = APIRouter(route_class=JsonRoute, tags=["notifications"])

    @routes.get("/v1/notifications", response_model=list[NotificationView])
    async def list_notifications(
        org: OrgDep,
        undelivered: bool = False,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> Any:
        """Newest first, each with its deliveries (status, attempts, last answer)."""
        return await org.read(
            lambda: org.engine.notifications(undelivered=undelivered, limit=limit)
        )

    @routes.post("/v1/notifications/retry", response_model=Retried)
    async def retry_all(org: OrgDep) -> Any:
        """Every failed (or backing-off) delivery is due now, with a new round of attempts."""
        return Retried(retried=len(await org.write(org.engine.retry_notifications)))

    @routes.post(
        "/v1/notifications/{notification_id}/retry", response_model=Retried, responses=NOT_FOUND
    )
    async def retry_one(notification_id: NotificationPath, org: OrgDep) -> Any:
        """This notification's failed (or backing-off) deliveries are due now."""
        try:
            rows = await org.write(lambda: org.engine.retry_notifications(notification_id))
        except InvalidInput as exc:  # the only refusal: no such notification
            raise Refused(404, "not_found", str(exc)) from None
        return Retried(retried=len(rows))

    @routes.get("/v1/notification-destinations", response_model=list[DestinationView])
    async def list_destinations(org: OrgDep) -> Any:
        """Where the organisation's notifications go."""
        return await org.read(org.engine.notification_destinations)

    @routes.put("/v1/notification-destinations/{destination_id}", response_model=DestinationSet)
    async def set_destination(
        destination_id: DestinationPath, body: DestinationIn, org: OrgDep
    ) -> Any:
        """Create or replace a destination. 422 with the reason (nothing stored) for a URL that
        is not an absolute http(s) URL with a host, a secret not ``whsec_<base64>``, or fields
        that do not go with the kind."""
        return await org.write(
            lambda: org.engine.set_notification_destination(
                destination_id,
                body.kind,
                url=body.url,
                secret=body.secret,
                connection_id=body.connection_id,
                target=body.target,
            )
        )

    @routes.delete(
        "/v1/notification-destinations/{destination_id}", status_code=204, responses=NOT_FOUND
    )
    async def remove_destination(destination_id: DestinationPath, org: OrgDep) -> None:
        """Stop sending there; what it had not received yet is dropped for it."""
        if not await org.write(lambda: org.engine.remove_notification_destination(destination_id)):
            raise Refused(404, "not_found", f"no destination {destination_id}")

    return routes
