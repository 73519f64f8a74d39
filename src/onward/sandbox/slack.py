"""Sandbox Slack provider: ``POST /slack/chat.postMessage``, answered the way Slack answers.

Each post is new work (Slack has no idempotency keys). The response carries ``ok`` and ``ts``,
the message's id within its channel.

Signed interaction callbacks (a button click in an approval message, posted back to the engine
and signed with the app's signing secret) will be added to this module.
"""

from __future__ import annotations

import itertools
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from onward.sandbox.common import Account, IdempotencyKey
from onward.sandbox.ledger import Ledger, get_ledger

router = APIRouter(prefix="/slack", tags=["slack"])


class PostMessageIn(BaseModel):
    channel: str = Field(min_length=1)
    text: str = ""
    blocks: list[dict[str, Any]] | None = None


class SlackStore:
    """Posted messages per (account, channel); ``ts`` values are unique and increasing."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self._counter = itertools.count(1)

    def next_ts(self) -> str:
        # Slack's ts is "<unix seconds>.<6 digits>"; the counter keeps it unique within a second.
        return f"{int(time.time())}.{next(self._counter) % 1_000_000:06d}"

    def reset(self) -> None:
        self.messages.clear()
        self._counter = itertools.count(1)


def get_store(request: Request) -> SlackStore:
    store: SlackStore = request.app.state.world.slack
    return store


Store = Annotated[SlackStore, Depends(get_store)]
LedgerDep = Annotated[Ledger, Depends(get_ledger)]


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
    store.messages.append((account, {"channel": payload.channel, **message}))
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
