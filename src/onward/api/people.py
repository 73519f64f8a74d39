"""People in the loop over HTTP (R9, R10): signals, a provider-shaped inbound-email webhook
that routes a reply by the message it answers, approvals, approvers, and Slack's
interactivity endpoint.

Every intake answers 2xx only once the signal or decision is durably stored: 202 for a new
signal, 200 for a repeat of one already stored (the same answer); 409 ``signal_refused`` for a
signal whose run has finished or was cancelled (it is recorded as refused all the same).
"""

import asyncio
import hashlib
import json
import logging
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs

from fastapi import APIRouter, Header, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, JsonValue
from slack_sdk.signature import SignatureVerifier

from onward import ids
from onward.api.models import MAX_EVENT_ID, NO_NUL
from onward.automations.document import ID_PATTERN
from onward.errors import DecisionRefused, InvalidInput
from onward.signals import MAX_NAME, Delivered

log = logging.getLogger("onward.api")

IdText = Annotated[str, Field(min_length=1, max_length=MAX_EVENT_ID, pattern=NO_NUL)]
NameText = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=NO_NUL)]


class SignalIn(BaseModel):
    """A signal: its identity (the sender's event id: a repeat is a duplicate), what it means
    (``name``), and where it goes -- a ``run_id``, or the ``correlation_key`` recorded when the
    answered thing was created (``email:<message id>``)."""

    model_config = ConfigDict(extra="forbid")
    signal_id: IdText
    name: NameText
    run_id: IdText | None = None
    correlation_key: IdText | None = None
    payload: dict[str, JsonValue] = Field(default_factory=dict)


class SignalAnswer(BaseModel):
    signal_id: str
    name: str
    status: str = Field(description="consumed, pending (kept until a step waits), unrouted, late")
    run_id: str | None
    seq: int | None
    duplicate: bool
    reason: str | None = None
    deliveries: int


class SignalView(BaseModel):
    signal_id: str
    name: str
    correlation_key: str | None
    run_id: str | None
    status: str = Field(
        description="pending, unrouted (pending, nobody to route to), consumed, ..."
    )
    reason: str | None
    seq: int | None
    deliveries: int
    received_at: datetime
    consumed_at: datetime | None


class InboundEmail(BaseModel):
    """An inbound email event as the provider posts it: a reply names the message it
    answers (``in_reply_to``: the message id the send step recorded as the correlation key)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    type: Literal["email.received", "email.unsubscribed"] = "email.received"
    event_id: Annotated[str | None, Field(max_length=MAX_EVENT_ID, pattern=NO_NUL)] = None
    message_id: IdText | None = None
    in_reply_to: IdText
    from_: Annotated[str | None, Field(alias="from", max_length=320, pattern=NO_NUL)] = None
    subject: Annotated[str, Field(max_length=2000, pattern=NO_NUL)] = ""
    text: Annotated[str, Field(max_length=100_000, pattern=NO_NUL)] = ""


class DecisionIn(BaseModel):
    """Decide a request as ``user`` (an approver id), from anywhere but Slack (the first
    decision wins, whatever the channel)."""

    model_config = ConfigDict(extra="forbid")
    approval_id: IdText
    decision: Literal["approve", "reject"]
    user: IdText


class DecisionAnswer(BaseModel):
    approval_id: str
    status: str
    decided_by: str | None
    decided_via: str | None
    decided_at: datetime | None = None


class ApprovalView(BaseModel):
    approval_id: str
    run_id: str
    seq: int
    step_id: str
    request: int
    digest: str
    approvers: list[str]
    channel: str | None
    status: str
    decided_by: str | None
    decided_via: str | None
    decided_at: datetime | None
    deadline_at: datetime
    message_ts: str | None
    created_at: datetime


class ApproverIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    approver: IdText
    automation_id: Annotated[str, Field(pattern=ID_PATTERN)] | Literal["*"] = "*"


class ApproverView(BaseModel):
    approver: str
    scope: str
    granted_at: datetime
    revoked_at: datetime | None


class SlackAnswer(BaseModel):
    """What the interactivity endpoint answers (Slack only needs the 200 within 3 s; the
    clicker is told through the message's response_url)."""

    ok: bool
    outcome: str = Field(description="approved, rejected, or why nothing was decided")
    text: str


def _answer(got: Delivered, response: Response) -> SignalAnswer:
    if got.duplicate:
        response.status_code = 200
    return SignalAnswer(**got.as_dict())


def router() -> APIRouter:
    """The people-in-the-loop routes, for ``create_app`` to include."""
    from onward.api.app import (
        NOT_FOUND,
        CallbackOrgDep,
        JsonRoute,
        Org,
        OrgDep,
        OrgIdPath,
        Refused,
        _errors,
    )

    routes = APIRouter(route_class=JsonRoute, tags=["signals"])
    refused = _errors(409)

    @routes.post(
        "/v1/signals",
        response_model=SignalAnswer,
        status_code=202,
        responses={200: {"model": SignalAnswer, "description": "A repeat"}, **NOT_FOUND, **refused},
    )
    async def deliver_signal(body: SignalIn, org: OrgDep, response: Response) -> Any:
        """Deliver a signal. Stored durably before the answer: consumed at once when a step of
        its run waits on it, else kept until one does (``pending``), or kept visible when no
        run is known for its correlation key yet (``unrouted``). 409: its run has finished."""
        got = await org.read(  # idempotent by its identity: safe to repeat after a lost link
            lambda: org.engine.signal(
                body.signal_id,
                body.name,
                run_id=body.run_id,
                correlation_key=body.correlation_key,
                payload=body.payload,
            )
        )
        return _answer(got, response)

    @routes.get("/v1/signals", response_model=list[SignalView])
    async def list_signals(
        org: OrgDep,
        run_id: Annotated[str | None, Query(max_length=MAX_EVENT_ID, pattern=NO_NUL)] = None,
        status: Annotated[Literal["pending", "consumed", "refused", "late"] | None, Query()] = None,
        unrouted: Annotated[bool, Query(description="only those nobody can route")] = False,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> Any:
        """Signals, newest first."""
        return await org.read(
            lambda: org.engine.signals(run_id=run_id, status=status, unrouted=unrouted, limit=limit)
        )

    @routes.post(
        "/v1/inbound/email",
        response_model=SignalAnswer,
        status_code=202,
        responses={200: {"model": SignalAnswer, "description": "A repeat"}, **refused},
    )
    async def inbound_email(
        body: InboundEmail,
        request: Request,
        org: OrgDep,
        response: Response,
        x_event_id: Annotated[
            str | None, Header(alias="X-Event-Id", max_length=MAX_EVENT_ID, pattern=NO_NUL)
        ] = None,
    ) -> Any:
        """An email provider's inbound webhook: a reply (``email.received``) or an unsubscribe
        (``email.unsubscribed``, which also suppresses the sender) becomes the signal
        ``reply`` / ``unsubscribe``, routed by ``in_reply_to`` to the run whose send step
        recorded that message id. Its identity is the provider's event id (``X-Event-Id`` or
        ``event_id``; else the new message's id; else, weaker, a hash of the body), so a
        redelivery is a duplicate."""
        event = x_event_id or body.event_id or body.message_id or _body_hash(await request.body())
        name = "unsubscribe" if body.type == "email.unsubscribed" else "reply"
        payload = {
            "from": body.from_,
            "subject": body.subject,
            "text": body.text[:10_000],
            "message_id": body.message_id,
            "in_reply_to": body.in_reply_to,
        }
        if name == "unsubscribe" and body.from_:
            sender = body.from_
            await org.write(
                lambda: org.engine.integrations.suppress(
                    org.org_id, sender, "unsubscribed by email reply", "email"
                )
            )
        got = await org.read(
            lambda: org.engine.signal(
                ids.signal_id("email", event),
                name,
                correlation_key=ids.correlation_key("email", body.in_reply_to),
                payload=payload,
            )
        )
        return _answer(got, response)

    # -- approvals ---------------------------------------------------------------------------

    @routes.get("/v1/approvals", response_model=list[ApprovalView], tags=["approvals"])
    async def list_approvals(
        org: OrgDep,
        run_id: Annotated[str | None, Query(max_length=MAX_EVENT_ID, pattern=NO_NUL)] = None,
        status: Annotated[
            Literal["pending", "approved", "rejected", "expired", "superseded", "cancelled"] | None,
            Query(),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> Any:
        """Requests for a decision, newest first."""
        return await org.read(
            lambda: org.engine.approvals(run_id=run_id, status=status, limit=limit)
        )

    @routes.post(
        "/v1/approvals/decide",
        response_model=DecisionAnswer,
        tags=["approvals"],
        responses={**NOT_FOUND, **refused},
    )
    async def decide(body: DecisionIn, org: OrgDep) -> Any:
        """Decide a request. 409 ``decision_refused``: expired, ``user`` may not decide (not
        asked, or the permission was revoked), the content changed (a new request was
        posted), or it was already decided -- the detail reads that decision back."""
        return await org.write(
            lambda: org.engine.decide(body.approval_id, body.decision, user=body.user)
        )

    @routes.get("/v1/approvers", response_model=list[ApproverView], tags=["approvals"])
    async def list_approvers(org: OrgDep) -> Any:
        """Who may decide (live and revoked grants)."""
        return await org.read(org.engine.approvers)

    @routes.post("/v1/approvers", response_model=ApproverView, status_code=201, tags=["approvals"])
    async def grant(body: ApproverIn, org: OrgDep) -> Any:
        """Let a person decide (for one automation, or ``*``); checked when they click."""
        return await org.write(
            lambda: org.engine.grant_approver(body.approver, automation_id=body.automation_id)
        )

    @routes.delete(
        "/v1/approvers/{approver}",
        response_model=ApproverView,
        tags=["approvals"],
        responses=NOT_FOUND,
    )
    async def revoke(
        approver: Annotated[str, Path(max_length=MAX_EVENT_ID, pattern=NO_NUL)],
        org: OrgDep,
        automation_id: Annotated[str, Query(max_length=256, pattern=NO_NUL)] = "*",
    ) -> Any:
        """Revoke a grant: a click after this is refused, whatever the message says."""
        revoked = await org.write(
            lambda: org.engine.revoke_approver(approver, automation_id=automation_id)
        )
        if revoked is None:
            raise Refused(404, "not_found", f"no live grant for {approver} on {automation_id}")
        return revoked

    pending: set[asyncio.Task[None]] = set()

    async def take_click(
        org: Org,
        connection_id: str,
        request: Request,
        timestamp: str | None,
        signature: str | None,
        retry_num: str | None,
    ) -> SlackAnswer:
        raw = await request.body()
        secret = await org.read(
            lambda: org.engine.integrations.signing_secret(org.org_id, connection_id)
        )
        if not _signed(secret, raw, timestamp, signature):
            raise Refused(
                401,
                "invalid_signature",
                "not signed with this connection's Slack signing secret, or older than 5 minutes",
            )
        action, user, response_url = _slack_click(raw)
        try:
            got = await org.write(
                lambda: org.engine.decide_by_token(
                    action["value"], user, via="slack", action=action["action_id"]
                )
            )
            answer = SlackAnswer(
                ok=True, outcome=got["status"], text=f"{got['status'].capitalize()} by <@{user}>"
            )
            update: dict[str, Any] = {"replace_original": True, "text": answer.text}
        except DecisionRefused as exc:
            answer = SlackAnswer(ok=False, outcome=exc.reason, text=str(exc))
            update = {"response_type": "ephemeral", "replace_original": False, "text": str(exc)}
            if retry_num and exc.reason == "decided" and "by you" in str(exc):
                response_url = None  # a retry of a click already answered
        if response_url:
            client = await org.engine.integrations.http_client(org.engine.org_id)  # checked
            task = asyncio.create_task(_tell(client, response_url, update))
            pending.add(task)
            task.add_done_callback(pending.discard)
        return answer

    @routes.post(
        "/v1/slack/{connection_id}/interactivity",
        response_model=SlackAnswer,
        tags=["approvals"],
        responses={**NOT_FOUND, **_errors(401)},
        openapi_extra=SLACK_FORM,
    )
    async def slack_interactivity(
        connection_id: Annotated[str, Path(pattern=ID_PATTERN)],
        request: Request,
        org: CallbackOrgDep,
        timestamp: Annotated[
            str | None, Header(alias="X-Slack-Request-Timestamp", max_length=32)
        ] = None,
        signature: Annotated[str | None, Header(alias="X-Slack-Signature", max_length=256)] = None,
        retry_num: Annotated[str | None, Header(alias="X-Slack-Retry-Num", max_length=8)] = None,
    ) -> Any:
        """Slack's interactivity requests (a button pressed in an approval message). The
        signature (v0, HMAC-SHA256 over the raw body with the connection's signing secret,
        at most 5 minutes old) is verified before anything is parsed: 401 if it does not
        hold. The decision is stored before the answer; the clicker is told the outcome
        through the message's ``response_url``. Slack's retries decide nothing new."""
        return await take_click(org, connection_id, request, timestamp, signature, retry_num)

    @routes.post(
        "/v1/orgs/{org_id}/slack/{connection_id}/interactivity",
        response_model=SlackAnswer,
        tags=["approvals"],
        responses={**NOT_FOUND, **_errors(401)},
        openapi_extra=SLACK_FORM,
    )
    async def org_slack_interactivity(
        org_id: OrgIdPath,
        connection_id: Annotated[str, Path(pattern=ID_PATTERN)],
        request: Request,
        org: CallbackOrgDep,
        timestamp: Annotated[
            str | None, Header(alias="X-Slack-Request-Timestamp", max_length=32)
        ] = None,
        signature: Annotated[str | None, Header(alias="X-Slack-Signature", max_length=256)] = None,
        retry_num: Annotated[str | None, Header(alias="X-Slack-Retry-Num", max_length=8)] = None,
    ) -> Any:
        """Slack's interactivity requests for the organisation ``org_id`` (no API key: the
        connection's Slack signing secret proves them), as ``/v1/slack/{connection_id}/...``
        does for the engine's own organisation."""
        return await take_click(org, connection_id, request, timestamp, signature, retry_num)

    return routes


# Slack's interactivity body: a form with one field, the click as JSON
SLACK_FORM: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/x-www-form-urlencoded": {
                "schema": {"type": "object", "properties": {"payload": {"type": "string"}}}
            }
        },
    }
}


def _body_hash(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _signed(secret: str | None, raw: bytes, timestamp: str | None, signature: str | None) -> bool:
    if not secret or not timestamp or not signature or not timestamp.isdigit():
        return False
    return bool(SignatureVerifier(secret).is_valid(raw, timestamp, signature))


def _slack_click(raw: bytes) -> tuple[dict[str, Any], str, str | None]:
    """The button pressed, who pressed it, and where to tell them (a verified body only)."""
    try:
        payload = json.loads(parse_qs(raw.decode("utf-8"))["payload"][0])
        action = payload["actions"][0]
        user = str(payload["user"]["id"])
        if not isinstance(action.get("value"), str) or not isinstance(action.get("action_id"), str):
            raise TypeError("action")
    except (KeyError, IndexError, TypeError, ValueError, UnicodeDecodeError):
        raise InvalidInput("not a Slack block_actions payload with a button") from None
    url = payload.get("response_url")
    return action, user, url if isinstance(url, str) else None


async def _tell(client: Any, url: str, body: dict[str, Any]) -> None:
    """Tell the clicker (Slack's response_url). Best effort, after the decision is stored."""
    for _ in range(3):
        try:
            reply = await client.post(url, json=body, timeout=5.0)
            if reply.status_code < 500:
                return
        except Exception as exc:  # the decision stands whatever happens here
            log.warning("telling the clicker through response_url failed: %s", exc)
        await asyncio.sleep(0.5)
