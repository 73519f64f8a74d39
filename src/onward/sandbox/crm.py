"""Sandbox CRM provider: contacts upserted by an external id, so creates are idempotent.

``PUT /crm/contacts/{external_id}`` creates the contact or merges the body's fields into it
(``created`` tells which). ``GET /crm/contacts/{external_id}`` reads one (404 if absent) and
``GET /crm/contacts?property=K&value=V`` searches by a property, like a CRM's custom-field search.
External ids may contain slashes (engine effect keys do), hence the ``:path`` converter.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse

from onward.sandbox.common import Account, IdempotencyKey, new_id, now_iso
from onward.sandbox.ledger import Ledger, get_ledger

router = APIRouter(prefix="/crm", tags=["crm"])


class CrmStore:
    """Contacts per (account, external_id)."""

    def __init__(self) -> None:
        self.contacts: dict[tuple[str, str], dict[str, Any]] = {}

    def reset(self) -> None:
        self.contacts.clear()


def get_store(request: Request) -> CrmStore:
    store: CrmStore = request.app.state.world.crm
    return store


Store = Annotated[CrmStore, Depends(get_store)]
LedgerDep = Annotated[Ledger, Depends(get_ledger)]


@router.put("/contacts/{external_id:path}")
async def upsert_contact(
    external_id: str,
    fields: Annotated[dict[str, Any], Body()],
    account: Account,
    store: Store,
    ledger: LedgerDep,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    now = now_iso()
    contact = store.contacts.get((account, external_id))
    created = contact is None
    if contact is None:
        contact = {
            "id": new_id("ct"),
            "external_id": external_id,
            "properties": {},
            "created_at": now,
        }
        store.contacts[(account, external_id)] = contact
    contact["properties"].update(fields)
    contact["updated_at"] = now
    ledger.append(
        provider="crm",
        account=account,
        op="contact.create" if created else "contact.update",
        idempotency_key=idempotency_key,
        metadata=fields,
        request={"external_id": external_id, **fields},
        response_id=contact["id"],
    )
    return {**contact, "created": created}


@router.get("/contacts/{external_id:path}")
async def get_contact(external_id: str, account: Account, store: Store) -> Any:
    contact = store.contacts.get((account, external_id))
    if contact is None:
        return JSONResponse(
            {"error": "not_found", "message": f"no contact {external_id!r}"}, status_code=404
        )
    return contact


@router.get("/contacts")
async def search_contacts(
    account: Account, store: Store, property: str | None = None, value: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    found = [
        contact
        for (owner, _), contact in store.contacts.items()
        if owner == account
        and (property is None or str(contact["properties"].get(property)) == value)
    ]
    return {"data": found}
