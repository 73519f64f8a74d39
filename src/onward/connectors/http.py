"""Generic JSON-over-HTTP connector, for providers without a dedicated connector.

Params: ``method`` (default POST), ``path`` (relative to the connection's base URL) or ``url``
(absolute), ``json`` (the body), ``query``, ``headers``, and ``idempotency_header`` (default
``Idempotency-Key``; set it to what the provider expects, e.g. ``X-Request-Id``). The effect key
is always sent in that header; whether the far side dedups on it is the automation author's
promise, which is why ``supports_idempotency`` is True here.

The result is the response's JSON object, or ``{"status_code", "body"}`` for anything else.
"""

from __future__ import annotations

from typing import Any

from onward.connectors.base import Connector

# For a probe, any answer but refused credentials, rate limiting or a server error is healthy.
_PROBE_OK = frozenset(range(300, 500)) - {401, 403, 408, 425, 429}


class HttpConnector(Connector):
    provider = "http"
    supports_idempotency = True
    supports_reconcile = False

    async def perform(self, idempotency_key: str, params: dict[str, Any]) -> dict[str, Any]:
        header = str(params.get("idempotency_header") or self.idempotency_header)
        headers = {**(params.get("headers") or {}), header: idempotency_key}
        response = await self._request(
            str(params.get("method", "POST")),
            str(params.get("url") or params.get("path") or "/"),
            json=params.get("json"),
            params=params.get("query"),
            headers=headers,
        )
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        if isinstance(body, dict):
            return body
        return {"status_code": response.status_code, "body": body}

    async def probe(self) -> None:
        # There is no known "who am I" endpoint, so GET the base URL: a 404 there still proves
        # the credentials were accepted.
        await self._request("GET", "/", accept=_PROBE_OK)
