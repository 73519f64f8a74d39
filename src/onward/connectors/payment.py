"""Payment connector for a provider with neither idempotency keys nor search.

Both flags are False, so when an attempt's outcome is unknown the engine must not charge again
and cannot look the charge up: it parks the step for a person. The key is still sent as a header
(ignored by the provider) so a person can match it against the provider's logs.
Params: ``amount`` (minor units), ``currency``, ``customer``, ``description``.
"""

from __future__ import annotations

from typing import Any

from onward.connectors.base import Connector


class PaymentConnector(Connector):
    provider = "payment"
    supports_idempotency = False
    supports_reconcile = False

    async def perform(self, idempotency_key: str, params: dict[str, Any]) -> dict[str, Any]:
        response = await self.request(
            "POST", "/payment/charges", json=params, idempotency_key=idempotency_key
        )
        return self.json_object(response)
