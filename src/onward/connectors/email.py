"""Email connector: idempotent sends, reconciled by a metadata tag.

The effect key travels twice: as the ``Idempotency-Key`` header (the provider returns the first
result for a repeat) and as metadata ``effect_key`` on the message (so :meth:`reconcile` can find
a message whose response was lost). Params: ``from``, ``to``, ``subject``, ``body``, optional
``metadata``.
"""

from __future__ import annotations

from typing import Any

from onward.connectors.base import Connector

EFFECT_KEY_FIELD = "effect_key"


class EmailConnector(Connector):
    provider = "email"
    supports_idempotency = True
    supports_reconcile = True

    async def perform(self, idempotency_key: str, params: dict[str, Any]) -> dict[str, Any]:
        metadata = {**(params.get("metadata") or {}), EFFECT_KEY_FIELD: idempotency_key}
        response = await self.request(
            "POST",
            "/email/messages",
            json={**params, "metadata": metadata},
            idempotency_key=idempotency_key,
        )
        return self.json_object(response)

    async def reconcile(self, idempotency_key: str) -> dict[str, Any] | None:
        response = await self.request(
            "GET",
            "/email/messages",
            params={"metadata_key": EFFECT_KEY_FIELD, "metadata_value": idempotency_key},
        )
        found = self.json_object(response).get("data") or []
        return dict(found[0]) if found else None
