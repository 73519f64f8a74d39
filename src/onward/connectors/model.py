"""Model connector: text generation. Every call is new work that costs money.

No idempotency and nothing to reconcile: an uncertain generation is simply generated again
(a duplicate costs money but harms nobody). Params: ``prompt``, optional ``max_tokens``.

Costs, for the budgets (``onward.budgets``): the most a call can cost is its prompt's tokens
(four characters a token, as the sandbox counts them) plus ``max_tokens``, at the
connector's prices (the sandbox model's: ``usd_per_input_token``, ``usd_per_output_token``);
what it did cost is in its result (``cost_usd``, ``tokens_in``, ``tokens_out``).
"""

from __future__ import annotations

import math
from typing import Any

from onward.connectors.base import Connector


class ModelConnector(Connector):
    provider = "model"
    supports_idempotency = False
    supports_reconcile = False
    repeat_is_harmless = True  # a second generation costs money; it reaches no person
    usd_per_input_token = 3e-6
    usd_per_output_token = 15e-6
    default_max_tokens = 256

    def cost_estimate(self, params: dict[str, Any]) -> dict[str, float] | None:
        tokens_in = max(1, math.ceil(len(str(params.get("prompt", ""))) / 4))
        tokens_out = int(params.get("max_tokens") or self.default_max_tokens)
        usd = tokens_in * self.usd_per_input_token + tokens_out * self.usd_per_output_token
        return {"usd": round(usd, 8), "tokens": float(tokens_in + tokens_out)}

    def cost_of(self, result: dict[str, Any]) -> dict[str, float]:
        tokens = float(result.get("tokens_in", 0) or 0) + float(result.get("tokens_out", 0) or 0)
        return {"usd": float(result.get("cost_usd", 0) or 0), "tokens": tokens}

    async def perform(self, idempotency_key: str, params: dict[str, Any]) -> dict[str, Any]:
        response = await self.request(
            "POST", "/model/generate", json=params, idempotency_key=idempotency_key
        )
        return self.json_object(response)
