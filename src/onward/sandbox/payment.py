"""Sandbox payment provider WITHOUT idempotency or search: the dangerous kind.

``POST /payment/charges`` charges every time it is called. An ``Idempotency-Key`` header is
ignored (only recorded in the ledger, so tests can see two charges for one effect key) and there
is no way to look a charge up by anything the caller chose. When the engine cannot tell whether
a charge happened, the only safe move is to park the step for a person.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from onward.sandbox.common import Account, IdempotencyKey, new_id, now_iso
from onward.sandbox.ledger import Ledger, get_ledger

router = APIRouter(prefix="/payment", tags=["payment"])


class ChargeIn(BaseModel):
    amount: int = Field(gt=0, description="in minor units (cents)")
    currency: str = Field(min_length=3, max_length=3)
    customer: str = Field(min_length=1)
    description: str = ""


LedgerDep = Annotated[Ledger, Depends(get_ledger)]


@router.post("/charges")
async def create_charge(
    payload: ChargeIn,
    account: Account,
    ledger: LedgerDep,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    charge = {
        "id": new_id("ch"),
        "object": "charge",
        "status": "succeeded",
        **payload.model_dump(),
        "currency": payload.currency.lower(),
        "created_at": now_iso(),
    }
    ledger.append(
        provider="payment",
        account=account,
        op="charge.create",
        idempotency_key=idempotency_key,  # NOT honoured: that is the point of this provider
        metadata={"customer": payload.customer},
        request=payload.model_dump(),
        response_id=charge["id"],
    )
    return charge
