"""Sandbox email provider: send messages, with Stripe-style idempotency keys and metadata search.

``POST /email/messages`` sends (records) a message. With an ``Idempotency-Key`` header, a repeat
from the same account returns the first response and sends nothing; reusing a key with a
different request is refused (422), as real providers do, because it is almost always a bug.
``GET /email/messages?metadata_key=K&metadata_value=V`` finds sent messages by a metadata field,
which is how the engine reconciles an effect whose response it never saw.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from onward.sandbox.common import Account, IdempotencyKey, new_id, now_iso
from onward.sandbox.ledger import Ledger, get_ledger

router = APIRouter(prefix="/email", tags=["email"])


class EmailIn(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    sender: str = Field(alias="from", min_length=1)
    to: str | list[str]
    subject: str = ""
    body: str = ""
    metadata: dict[str, str] = Field(default_factory=dict)


class EmailStore:
    """Sent messages and remembered idempotent responses, per account."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []  # (account, message)
        # (account, key) -> (request fingerprint, response)
        self.idempotent: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}

    def reset(self) -> None:
        self.messages.clear()
        self.idempotent.clear()


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
    store.messages.append((account, message))
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
