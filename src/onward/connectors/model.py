"""Model connector: text generation. Every call is new work that costs money.

No idempotency and nothing to reconcile: an uncertain generation is simply generated again
(a duplicate costs money but harms nobody). Params: ``prompt``, optional ``max_tokens``.
"""

from __future__ import annotations

from typing import Any

from onward.connectors.base import Connector


class ModelConnector(Connector):
    provider = "model"
    supports_idempotency = False
    supports_reconcile = False
    repeat_is_harmless = True  # a second generation costs money; it reaches no person

    async def perform(self, idempotency_key: str, params: dict[str, Any]) -> dict[str, Any]:
        response = await self.request(
            "POST", "/model/generate", json=params, idempotency_key=idempotency_key
        )
        return self.json_object(response)
