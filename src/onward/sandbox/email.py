"""Sandbox email provider: send messages, with Stripe-style idempotency keys and metadata search.

``POST /email/messages`` sends (records) a message. With an ``Idempotency-Key`` header, a repeat
from the same account returns the first response and sends nothing; reusing a key with a
different request is refused (422), as real providers do, because it is almost always a bug.
``GET /email/messages?metadata_key=K&metadata_value=V`` finds sent messages by a metadata field,
which is how the engine reconciles an effect whose response it never saw.

Replies (the people side; admin endpoints, never faulted, never in the ledger):

* ``POST /_admin/email/inbound`` ``{"account", "inbound_url"}``: where replies to that account's
  messages are delivered (the engine's inbound webhook).
* ``POST /_admin/email/reply`` ``{"message_id", "text"?, "from"?, "event_id"?, "deliveries"?,
  "kind"?}``: the recipient of sent message ``message_id`` (any account) answers it. A new inbound
  message is recorded, and the event ``{"type": "email.received" | "email.unsubscribed",
  "event_id", "message_id" (the new message), "in_reply_to" (the original), "from", "to",
  "subject", "text", "received_at"}`` is POSTed as JSON with the header ``X-Event-Id`` to the
  account's inbound URL, ``deliveries`` times (transport duplicates: the same event each time).
  ``from`` defaults to the original's (first) recipient, ``to`` is the original's sender,
  ``subject`` is ``"Re: <original subject>"`` (not doubled), ``event_id`` defaults to a new
  ``evt_...``, ``kind`` is ``reply`` (default) or ``unsubscribe``. Answers ``{"event_id",
  "message_id", "event", "deliveries": [{"status", "body"}, ...]}``; a delivery the engine never
  answered has ``status`` null and an ``error``. An unknown message is 404, an account without an
  inbound URL 422.
* ``GET /_admin/email/messages?account=`` → ``{"data": [...]}``: every message, sent and received,
  oldest first, each with its ``account`` and ``direction`` (``outbound`` or ``inbound``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import httpx
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from onward.sandbox.common import Account, IdempotencyKey, new_id, now_iso
from onward.sandbox.ledger import Ledger, get_ledger

router = APIRouter(prefix="/email", tags=["email"])
admin_router = APIRouter(prefix="/_admin/email", tags=["admin"])

DELIVERY_TIMEOUT_S = 10.0
EVENT_TYPES = {"reply": "email.received", "unsubscribe": "email.unsubscribed"}


class EmailIn(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    sender: str = Field(alias="from", min_length=1)
    to: str | list[str]
    subject: str = ""
    body: str = ""
    metadata: dict[str, str] = Field(default_factory=dict)


class EmailStore:
    """Sent and received messages, remembered idempotent responses, inbound URLs, per account."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []  # (account, sent message)
        # (account, key) -> (request fingerprint, response)
        self.idempotent: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self.inbound_urls: dict[str, str] = {}  # account -> where its replies are delivered
        # Every message, sent or received, oldest first: (account, direction, message).
        self.log: list[tuple[str, str, dict[str, Any]]] = []

    def record_sent(self, account: str, message: dict[str, Any]) -> None:
        self.messages.append((account, message))
        self.log.append((account, "outbound", message))

    def record_received(self, account: str, message: dict[str, Any]) -> None:
        self.log.append((account, "inbound", message))

    def sent(self, message_id: str) -> tuple[str, dict[str, Any]] | None:
        """The account and the sent message with id ``message_id``, if any."""
        for account, message in self.messages:
            if message["id"] == message_id:
                return account, message
        return None

    def reset(self) -> None:
        self.messages.clear()
        self.idempotent.clear()
        self.inbound_urls.clear()
        self.log.clear()


def get_store(request: Request) -> EmailStore:
    store: EmailStore = request.app.state.world.email
    return store


Store = Annotated[EmailStore, Depends(get_store)]
LedgerDep = Annotated[Ledger, Depends(get_ledger)]


# Routes are `async def` on purpose: they run on the event loop one at a time, so the
# check-then-record of an idempotency key below cannot interleave with another request.
@router.post("/messages")
async def send_message(
    payload: EmailIn,
    account: Account,
    store: Store,
    ledger: LedgerDep,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    request_json = payload.model_dump(by_alias=True)
    fingerprint = json.dumps(request_json, sort_keys=True)
    if idempotency_key is not None:
        seen = store.idempotent.get((account, idempotency_key))
        if seen is not None:
            if seen[0] != fingerprint:
                return JSONResponse(
                    {
                        "error": "idempotency_key_reused",
                        "message": "this Idempotency-Key was used with a different request",
                    },
                    status_code=422,
                )
            return seen[1]

    message = {
        "id": new_id("msg"),
        "status": "sent",
        **request_json,
        "created_at": now_iso(),
    }
    store.record_sent(account, message)
    if idempotency_key is not None:
        store.idempotent[(account, idempotency_key)] = (fingerprint, message)
    ledger.append(
        provider="email",
        account=account,
        op="message.send",
        idempotency_key=idempotency_key,
        metadata=payload.metadata,
        request=request_json,
        response_id=message["id"],
    )
    return message


@router.get("/messages")
async def search_messages(
    account: Account,
    store: Store,
    metadata_key: str | None = None,
    metadata_value: str | None = None,
) -> dict[str, list[dict[str, Any]]]:
    found = [
        message
        for owner, message in store.messages
        if owner == account
        and (metadata_key is None or message["metadata"].get(metadata_key) == metadata_value)
    ]
    return {"data": found}


# --- admin: replies ----------------------------------------------------------------------------


class InboundIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    account: str = Field(min_length=1)
    inbound_url: str = Field(min_length=1)


class ReplyIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    message_id: str = Field(min_length=1)
    text: str = ""
    sender: str | None = Field(default=None, alias="from")
    event_id: str | None = None
    deliveries: int = Field(default=1, ge=1, le=100)
    kind: Literal["reply", "unsubscribe"] = "reply"


@admin_router.post("/inbound")
async def register_inbound(inbound: InboundIn, store: Store) -> dict[str, str]:
    store.inbound_urls[inbound.account] = inbound.inbound_url
    return {"account": inbound.account, "inbound_url": inbound.inbound_url}


@admin_router.get("/messages")
async def all_messages(store: Store, account: str | None = None) -> dict[str, list[dict[str, Any]]]:
    return {
        "data": [
            {**message, "account": owner, "direction": direction}
            for owner, direction, message in store.log
            if account is None or owner == account
        ]
    }


@admin_router.post("/reply")
async def reply(knobs: ReplyIn, store: Store) -> dict[str, Any]:
    found = store.sent(knobs.message_id)
    if found is None:
        raise HTTPException(
            404,
            detail={
                "error": "message_not_found",
                "message": f"no sent message with id {knobs.message_id!r}",
            },
        )
    account, original = found
    inbound_url = store.inbound_urls.get(account)
    if inbound_url is None:
        raise HTTPException(
            422,
            detail={
                "error": "no_inbound_url",
                "message": f"no inbound URL registered for account {account!r}: "
                "POST /_admin/email/inbound first",
            },
        )
    recipients = original["to"]
    sender = knobs.sender or (recipients[0] if isinstance(recipients, list) else recipients)
    subject = original["subject"]
    if not subject.lower().startswith("re:"):
        subject = f"Re: {subject}"
    received_at = now_iso()
    event_id = knobs.event_id or new_id("evt")
    message = {
        "id": new_id("msg"),
        "status": "received",
        "from": sender,
        "to": original["from"],
        "subject": subject,
        "body": knobs.text,
        "metadata": {},
        "in_reply_to": original["id"],
        "kind": knobs.kind,
        "event_id": event_id,
        "created_at": received_at,
    }
    store.record_received(account, message)
    event = {
        "type": EVENT_TYPES[knobs.kind],
        "event_id": event_id,
        "message_id": message["id"],
        "in_reply_to": original["id"],
        "from": sender,
        "to": original["from"],
        "subject": subject,
        "text": knobs.text,
        "received_at": received_at,
    }
    # One serialisation for every delivery: duplicates are byte-identical, as transports make them.
    body = json.dumps(event).encode()
    headers = {"Content-Type": "application/json", "X-Event-Id": event_id}
    deliveries: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=DELIVERY_TIMEOUT_S) as client:
        for _ in range(knobs.deliveries):
            try:
                response = await client.post(inbound_url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                deliveries.append(
                    {"status": None, "body": None, "error": f"{type(exc).__name__}: {exc}"}
                )
                continue
            deliveries.append({"status": response.status_code, "body": _answer(response)})
    return {
        "event_id": event_id,
        "message_id": message["id"],
        "event": event,
        "deliveries": deliveries,
    }


def _answer(response: httpx.Response) -> Any:
    """The engine's answer: its JSON when it is JSON, else its text."""
    try:
        return response.json()
    except ValueError:
        return response.text
