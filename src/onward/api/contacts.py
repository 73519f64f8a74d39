"""Erasing a contact over HTTP (R14): ``POST /v1/contacts/{contact_id}/erase``."""

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Body, Path, Response
from fastapi.routing import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from onward.api.models import NO_NUL, Text

ContactPath = Annotated[
    str,
    Path(min_length=1, max_length=320, pattern=NO_NUL, description="the contact's id"),
]


class ErasureIn(BaseModel):
    """Who asks, and the contact's email addresses beyond those its runs' inputs hold."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"emails": ["maya@example.test"], "by": "dpo@acme"}]},
    )
    emails: list[Annotated[Text, Field(min_length=3, max_length=320)]] = Field(
        default_factory=list, max_length=100
    )
    by: Text = Field(default="operator", min_length=1, max_length=256)


class ErasedRun(BaseModel):
    run_id: str
    cancel: str | None = Field(
        description="cancelled, cancel_requested, already_requested, already_cancelled; "
        "null: it had finished"
    )
    erasure: Literal["erased", "already_erased", "waiting", "gone"] = Field(
        description="waiting: a step was in flight; erased once the run stops"
    )


class ErasureAnswer(BaseModel):
    contact_id: str
    status: Literal["done", "pending"]
    subject: str = Field(description="the contact's pseudonym (what onward keeps)")
    requested_by: str
    requested_at: datetime
    requests: int
    finished_at: datetime | None
    identifiers: int = Field(description="identifiers erased: the id and email addresses")
    suppressed: int = Field(description="pseudonyms added to the suppression list")
    scrubbed: dict[str, int]
    runs: list[ErasedRun]
    erased: int
    already_erased: int
    waiting: int
    cancelled: int


def router() -> APIRouter:
    """The contact routes, for ``create_app`` to include."""
    from onward.api.app import JsonRoute, OrgDep

    routes = APIRouter(route_class=JsonRoute, tags=["consent"])

    @routes.post(
        "/v1/contacts/{contact_id}/erase",
        response_model=ErasureAnswer,
        responses={
            202: {
                "model": ErasureAnswer,
                "description": "Pending: a run had a step in flight; it is erased once it stops",
            }
        },
    )
    async def erase_contact(
        contact_id: ContactPath,
        org: OrgDep,
        response: Response,
        body: Annotated[ErasureIn | None, Body()] = None,
    ) -> Any:
        """Erase a contact: cancel every run that references it, remove their data (the
        history stays as a skeleton with a redaction marker and who erased it), suppress the
        contact by a pseudonym. Idempotent: 200 with what was done (``done``), 202 while a run
        that had a step in flight has not stopped yet (``pending``)."""
        request = body or ErasureIn()
        answer = await org.write(
            lambda: org.engine.erase_contact(contact_id, identifiers=request.emails, by=request.by)
        )
        if answer["status"] == "pending":
            response.status_code = 202
        return answer

    return routes
