"""CRM connector: contacts upserted by external id, which makes a repeat harmless.

Params: ``external_id`` (defaults to the effect key) plus the contact's fields. The effect key is
also written to the contact's ``effect_key`` property, so :meth:`reconcile` can find the contact
from the key alone even when the external id is a business id such as an email address. Another
effect that later upserts the same contact overwrites that tag; reconcile then finds nothing,
which is fine: the upsert is safe to repeat (``supports_idempotency``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from onward.connectors.base import Connector

EFFECT_KEY_FIELD = "effect_key"


class CrmConnector(Connector):
    provider = "crm"
    supports_idempotency = True  # upsert by external id: the same call twice is one contact
    supports_reconcile = True

    async def perform(self, idempotency_key: str, params: dict[str, Any]) -> dict[str, Any]:
        fields = dict(params)
        external_id = str(fields.pop("external_id", None) or idempotency_key)
        fields[EFFECT_KEY_FIELD] = idempotency_key
        response = await self.request(
            "PUT", self._contact_path(external_id), json=fields, idempotency_key=idempotency_key
        )
        return self.json_object(response)

    async def reconcile(self, idempotency_key: str) -> dict[str, Any] | None:
        response = await self.request(
            "GET", "/crm/contacts", params={"property": EFFECT_KEY_FIELD, "value": idempotency_key}
        )
        found = self.json_object(response).get("data") or []
        return dict(found[0]) if found else None

    async def get_contact(self, external_id: str) -> dict[str, Any] | None:
        """The contact with this external id, or None."""
        response = await self.request("GET", self._contact_path(external_id), accept=(404,))
        return None if response.status_code == 404 else self.json_object(response)

    @staticmethod
    def _contact_path(external_id: str) -> str:
        # Effect keys contain slashes; encode them so the id stays one path segment on the wire.
        return "/crm/contacts/" + quote(external_id, safe="")
