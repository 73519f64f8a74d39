"""Sandbox Slack provider: messages, and signed button clicks delivered to the engine.

Provider endpoints (what the engine calls):

* ``POST /slack/chat.postMessage`` (bearer auth; the account is the workspace): records a message
  and answers as Slack does, ``{"ok": true, "channel", "ts", "message"}``. ``ts`` is the message's
  id (unique and increasing within the sandbox). Each post is new work: Slack has no idempotency
  keys.
* ``POST /slack/response/{ts}`` (no auth, like Slack's ``response_url``): a JSON body such as
  ``{"replace_original": true, "text": "..."}`` is appended to the message's ``updates`` and
  answered ``{"ok": true}``; an unknown ``ts`` is answered 404 ``{"ok": false, "error":
  "expired_url"}``. The message's own ``text`` and ``blocks`` stay as posted, so a test can still
  click a button the engine has since replaced (the race a real user can win). This route is
  outside the fault layer (no auth, no faults), and is not a ledger entry.

Admin endpoints (what tests and the chaos runner call; never faulted):

* ``POST /_admin/slack/app`` ``{"account", "interactivity_url", "signing_secret"}``: registers the
  account's Slack app: where its clicks are sent and the secret that signs them.
* ``GET /_admin/slack/messages?channel=&account=`` → ``{"data": [{"account", "channel", "ts",
  "text", "blocks", "updates"}]}``, oldest first.
* ``POST /_admin/slack/click`` ``{"ts", "action_id", "user", "account"?, "user_name"?, "forge"?,
  "timestamp_offset_s"?, "reserialise"?, "retry_num"?, "replay"?}``: a user clicks the button
  ``action_id`` of message ``ts``. The sandbox builds Slack's ``block_actions`` payload (the
  button's ``value``, its ``block_id``, the user, a ``response_url`` pointing back here), sends it
  form-encoded as ``payload=<json>``, signed like Slack (``X-Slack-Request-Timestamp`` and
  ``X-Slack-Signature: v0=HMAC-SHA256(secret, "v0:{timestamp}:{body}")``), to the registered
  interactivity URL, and answers ``{"status", "body", "request": {"url", "timestamp",
  "signature", "body", "headers"}}`` (``status``/``body`` are the engine's answer; when the
  engine could not be reached ``status`` is null and ``error`` says why). Knobs: ``forge`` signs
  with a wrong secret; ``timestamp_offset_s`` dates the signature that many seconds in the past
  (Slack's verifiers refuse anything older than 300 s); ``reserialise`` sends, after signing, the
  payload JSON re-serialised with other spacing and key order (same data, so the signature no
  longer matches the bytes); ``retry_num`` adds ``X-Slack-Retry-Num`` and ``X-Slack-Retry-Reason:
  http_timeout``; ``replay`` resends the account's previous click request byte for byte (same
  body, timestamp, signature and headers, to the same URL) and ignores the other fields.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

import httpx
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from slack_sdk.signature import SignatureVerifier

from onward.sandbox.common import Account, IdempotencyKey
from onward.sandbox.ledger import Ledger, get_ledger

router = APIRouter(prefix="/slack", tags=["slack"])
admin_router = APIRouter(prefix="/_admin/slack", tags=["admin"])

#: Requests under this path are the response_url: served without auth and without faults.
RESPONSE_URL_PREFIX = "/slack/response/"
API_APP_ID = "A0SANDBOX"
CLICK_TIMEOUT_S = 10.0


class PostMessageIn(BaseModel):
    channel: str = Field(min_length=1)
    text: str = ""
    blocks: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class SlackApp:
    """One workspace's Slack app: where interactions are sent, and the secret that signs them."""

    interactivity_url: str
    signing_secret: str


@dataclass(frozen=True)
class SentRequest:
    """An interaction request exactly as it was sent, so that it can be replayed byte for byte."""

    url: str
    headers: dict[str, str]
    body: str

    @property
    def timestamp(self) -> str:
        return self.headers["X-Slack-Request-Timestamp"]

    @property
    def signature(self) -> str:
        return self.headers["X-Slack-Signature"]

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "timestamp": self.timestamp,
            "signature": self.signature,
            "body": self.body,
            "headers": dict(self.headers),
        }


class SlackStore:
    """Posted messages (with their response_url updates), apps and last clicks, per account."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []  # oldest first
        self.by_ts: dict[str, dict[str, Any]] = {}
        self.apps: dict[str, SlackApp] = {}
        self.last_click: dict[str, SentRequest] = {}  # account -> its previous click request
        self._counter = itertools.count(1)

    def next_ts(self) -> str:
        # Slack's ts is "<unix seconds>.<6 digits>"; the counter keeps it unique within a second.
        return f"{int(time.time())}.{next(self._counter) % 1_000_000:06d}"

    def record(self, account: str, channel: str, ts: str, text: str, blocks: Any) -> None:
        message = {
            "account": account,
            "channel": channel,
            "ts": ts,
            "text": text,
            "blocks": blocks,
            "updates": [],
        }
        self.messages.append(message)
        self.by_ts[ts] = message

    def reset(self) -> None:
        self.messages.clear()
        self.by_ts.clear()
        self.apps.clear()
        self.last_click.clear()
        self._counter = itertools.count(1)


def get_store(request: Request) -> SlackStore:
    store: SlackStore = request.app.state.world.slack
    return store


Store = Annotated[SlackStore, Depends(get_store)]
LedgerDep = Annotated[Ledger, Depends(get_ledger)]


# --- provider ----------------------------------------------------------------------------------


@router.post("/chat.postMessage")
async def post_message(
    payload: PostMessageIn,
    account: Account,
    store: Store,
    ledger: LedgerDep,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    ts = store.next_ts()
    message = {"type": "message", "ts": ts, "text": payload.text, "blocks": payload.blocks}
    store.record(account, payload.channel, ts, payload.text, payload.blocks)
    ledger.append(
        provider="slack",
        account=account,
        op="chat.postMessage",
        idempotency_key=idempotency_key,  # recorded for tracing only
        metadata={"channel": payload.channel},
        request=payload.model_dump(),
        response_id=ts,
    )
    return {"ok": True, "channel": payload.channel, "ts": ts, "message": message}


@router.post("/response/{ts}")
async def response_url(ts: str, request: Request, store: Store) -> JSONResponse:
    message = store.by_ts.get(ts)
    if message is None:
        return JSONResponse({"ok": False, "error": "expired_url"}, status_code=404)
    try:
        update = json.loads(await request.body())
    except ValueError:
        return JSONResponse({"ok": False, "error": "invalid_payload"}, status_code=400)
    if not isinstance(update, dict):
        return JSONResponse({"ok": False, "error": "invalid_payload"}, status_code=400)
    message["updates"].append(update)
    return JSONResponse({"ok": True})


# --- admin -------------------------------------------------------------------------------------


class SlackAppIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    account: str = Field(min_length=1)
    interactivity_url: str = Field(min_length=1)
    signing_secret: str = Field(min_length=1)


class ClickIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ts: str | None = None
    action_id: str | None = None
    user: str | None = None
    user_name: str | None = None
    account: str | None = None
    forge: bool = False
    timestamp_offset_s: int = 0
    reserialise: bool = False
    retry_num: int | None = Field(default=None, ge=0)
    replay: bool = False

    @model_validator(mode="after")
    def _a_click_names_its_button(self) -> ClickIn:
        if not self.replay:
            missing = [f for f in ("ts", "action_id", "user") if not getattr(self, f)]
            if missing:
                raise ValueError(f"a click needs {', '.join(missing)} (unless replay is true)")
        return self


@admin_router.post("/app")
async def register_app(app: SlackAppIn, store: Store) -> dict[str, Any]:
    store.apps[app.account] = SlackApp(app.interactivity_url, app.signing_secret)
    return {"account": app.account, "interactivity_url": app.interactivity_url}


@admin_router.get("/messages")
async def list_messages(
    store: Store, channel: str | None = None, account: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    found = [
        m
        for m in store.messages
        if (channel is None or m["channel"] == channel)
        and (account is None or m["account"] == account)
    ]
    return {"data": found}


@admin_router.post("/click")
async def click(knobs: ClickIn, request: Request, store: Store) -> dict[str, Any]:
    if knobs.replay:
        sent = _previous_click(knobs, store)
    else:
        sent = _new_click(knobs, str(request.base_url), store)
    return await _deliver(sent)


def _previous_click(knobs: ClickIn, store: SlackStore) -> SentRequest:
    account = knobs.account
    if account is None and knobs.ts is not None:
        account = _message(knobs.ts, store)["account"]
    if account is None:
        raise HTTPException(422, detail={"error": "replay needs an account or a ts"})
    previous = store.last_click.get(account)
    if previous is None:
        raise HTTPException(
            404, detail={"error": "nothing_to_replay", "message": f"no click of {account} yet"}
        )
    return previous


def _message(ts: str, store: SlackStore) -> dict[str, Any]:
    message = store.by_ts.get(ts)
    if message is None:
        raise HTTPException(
            404, detail={"error": "message_not_found", "message": f"no message with ts {ts!r}"}
        )
    return message


def _button(message: dict[str, Any], action_id: str) -> tuple[str | None, dict[str, Any]]:
    """The ``(block_id, element)`` of the button ``action_id`` in ``message``'s blocks."""
    for block in message["blocks"] or []:
        if block.get("type") != "actions":
            continue
        for element in block.get("elements") or []:
            if element.get("action_id") == action_id:
                return block.get("block_id"), element
    raise HTTPException(
        422,
        detail={
            "error": "unknown_action",
            "message": f"message {message['ts']} has no button with action_id {action_id!r}",
        },
    )


def _new_click(knobs: ClickIn, base_url: str, store: SlackStore) -> SentRequest:
    assert knobs.ts is not None and knobs.action_id is not None and knobs.user is not None
    message = _message(knobs.ts, store)
    block_id, button = _button(message, knobs.action_id)
    account = knobs.account or message["account"]
    app = store.apps.get(account)
    if app is None:
        raise HTTPException(
            422,
            detail={
                "error": "no_slack_app",
                "message": f"no Slack app registered for account {account!r}: "
                "POST /_admin/slack/app first",
            },
        )
    now = time.time()
    payload = {
        "type": "block_actions",
        "user": {"id": knobs.user, "username": knobs.user_name or knobs.user, "team_id": account},
        "team": {"id": account},
        "api_app_id": API_APP_ID,
        "container": {
            "type": "message",
            "message_ts": message["ts"],
            "channel_id": message["channel"],
            "is_ephemeral": False,
        },
        "channel": {"id": message["channel"], "name": message["channel"]},
        "message": {
            "type": "message",
            "ts": message["ts"],
            "text": message["text"],
            "blocks": message["blocks"],
        },
        "response_url": f"{base_url.rstrip('/')}{RESPONSE_URL_PREFIX}{message['ts']}",
        "trigger_id": f"{int(now)}.{secrets.randbelow(10**10)}.{secrets.token_hex(16)}",
        "actions": [
            {
                "type": button.get("type", "button"),
                "action_id": knobs.action_id,
                "block_id": block_id,
                "value": button.get("value"),
                "action_ts": f"{now:.6f}",
            }
        ],
    }
    # Slack sends compact JSON, form-encoded as the single field `payload`.
    body = urlencode({"payload": json.dumps(payload, separators=(",", ":"))})
    timestamp = str(int(now) - knobs.timestamp_offset_s)
    secret = f"forged-{app.signing_secret}" if knobs.forge else app.signing_secret
    signature = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
    assert signature is not None
    if knobs.reserialise:
        # The same data, other bytes: as if a proxy parsed and re-encoded the JSON.
        body = urlencode({"payload": json.dumps(payload, sort_keys=True, indent=1)})
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": signature,
    }
    if knobs.retry_num is not None:
        headers["X-Slack-Retry-Num"] = str(knobs.retry_num)
        headers["X-Slack-Retry-Reason"] = "http_timeout"
    sent = SentRequest(app.interactivity_url, headers, body)
    store.last_click[account] = sent
    return sent


async def _deliver(sent: SentRequest) -> dict[str, Any]:
    """POST ``sent`` to the engine (on the event loop, never blocking it) and report its answer."""
    result: dict[str, Any] = {"status": None, "body": None, "request": sent.to_json()}
    try:
        async with httpx.AsyncClient(timeout=CLICK_TIMEOUT_S) as client:
            response = await client.post(sent.url, content=sent.body.encode(), headers=sent.headers)
    except httpx.HTTPError as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        return result
    result["status"] = response.status_code
    result["body"] = answer_body(response)
    return result


def answer_body(response: httpx.Response) -> Any:
    """The engine's answer: its JSON when it is JSON, else its text."""
    try:
        return response.json()
    except ValueError:
        return response.text
