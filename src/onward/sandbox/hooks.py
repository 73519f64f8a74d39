"""A customer's notification receiver: where an organisation's webhook destination points.

``POST /hooks/{inbox}`` receives a notification as onward sends it (Standard Webhooks headers:
``webhook-id``, ``webhook-timestamp``, ``webhook-signature``). Every request is an *attempt*
and is recorded; a notification is *received* once per ``webhook-id`` -- a repeat is answered
200 with ``duplicate: true`` and not received again, as a real receiver deduplicates. Like a
customer's endpoint it needs no bearer token and sits outside the providers' fault layer; its
own knob makes it fail: ``fail_next`` answers the next N attempts 503 (nothing received).

Admin (``/_admin/hooks/{inbox}``): ``POST`` ``{"fail_next": N, "secret": "whsec_..."}``
configures the inbox (with a secret, each attempt records whether its signature holds;
``redirect_to`` answers every attempt 307 to that URL, ``pad_bytes`` answers 200 with a body
that large -- for the outbound check's tests);
``GET`` answers ``{"attempts": n, "distinct": m, "received": [...], "log": [...]}``. Reset
forgets every inbox.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from standardwebhooks import Webhook

from onward.sandbox.common import now_iso

router = APIRouter(prefix="/hooks", tags=["hooks"])
admin_router = APIRouter(prefix="/_admin/hooks", tags=["admin"])


@dataclass
class Inbox:
    fail_next: int = 0
    secret: str | None = None
    redirect_to: str | None = None  # answer 307 to this URL (an outbound check's test)
    pad_bytes: int = 0  # answer with a body this large (an outbound size cap's test)
    log: list[dict[str, Any]] = field(default_factory=list)  # every attempt, oldest first
    received: dict[str, dict[str, Any]] = field(default_factory=dict)  # by webhook-id

    def view(self) -> dict[str, Any]:
        return {
            "attempts": len(self.log),
            "distinct": len(self.received),
            "fail_next": self.fail_next,
            "received": list(self.received.values()),
            "log": self.log,
        }


class HookStore:
    def __init__(self) -> None:
        self.inboxes: dict[str, Inbox] = {}

    def inbox(self, name: str) -> Inbox:
        return self.inboxes.setdefault(name, Inbox())

    def reset(self) -> None:
        self.inboxes.clear()


def get_store(request: Request) -> HookStore:
    store: HookStore = request.app.state.world.hooks
    return store


Store = Annotated[HookStore, Depends(get_store)]


class InboxIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fail_next: int = Field(default=0, ge=0, le=10_000)
    secret: str | None = None
    redirect_to: str | None = Field(default=None, max_length=2048)
    pad_bytes: int = Field(default=0, ge=0, le=64 * 1024 * 1024)


def signature_holds(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The Standard Webhooks check, by the ``standardwebhooks`` package (never by hand): a
    ``v1`` signature of ``id.timestamp.body`` within the library's timestamp tolerance."""
    try:
        Webhook(secret).verify(body, headers, json_parse=False)
    except Exception:  # WebhookVerificationError, and what a malformed header raises
        return False
    return True


@router.post("/{inbox}")
async def receive(inbox: str, request: Request, store: Store) -> JSONResponse:
    box = store.inbox(inbox)
    body = await request.body()
    headers = {k.lower(): v for k, v in request.headers.items()}
    msg_id = headers.get("webhook-id")
    attempt: dict[str, Any] = {"webhook_id": msg_id, "at": now_iso()}
    if box.secret is not None:
        attempt["signature_ok"] = signature_holds(box.secret, headers, body)
    if box.fail_next > 0:
        box.fail_next -= 1
        attempt["status"] = 503
        box.log.append(attempt)
        return JSONResponse({"error": "unavailable"}, status_code=503)
    if box.redirect_to is not None:
        attempt["status"] = 307
        box.log.append(attempt)
        return JSONResponse({"moved": True}, status_code=307, headers={"Location": box.redirect_to})
    if box.pad_bytes:
        attempt["status"] = 200
        box.log.append(attempt)
        return JSONResponse({"ok": True, "pad": "x" * box.pad_bytes})
    if not msg_id:
        attempt["status"] = 400
        box.log.append(attempt)
        return JSONResponse({"error": "no webhook-id header"}, status_code=400)
    duplicate = msg_id in box.received
    attempt["status"] = 200
    attempt["duplicate"] = duplicate
    box.log.append(attempt)
    if not duplicate:
        try:
            event: Any = json.loads(body)
        except ValueError:
            event = body.decode("utf-8", "replace")
        box.received[msg_id] = {
            "webhook_id": msg_id,
            "timestamp": headers.get("webhook-timestamp"),
            "event": event,
            "received_at": attempt["at"],
        }
    return JSONResponse({"ok": True, "duplicate": duplicate})


@admin_router.post("/{inbox}")
async def configure(inbox: str, knobs: InboxIn, store: Store) -> dict[str, Any]:
    box = store.inbox(inbox)
    box.fail_next = knobs.fail_next
    box.secret = knobs.secret
    box.redirect_to = knobs.redirect_to
    box.pad_bytes = knobs.pad_bytes
    return box.view()


@admin_router.get("/{inbox}")
async def inspect(inbox: str, store: Store) -> dict[str, Any]:
    return store.inbox(inbox).view()
