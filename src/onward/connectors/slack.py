"""Slack connector: ``chat.postMessage``. Not idempotent, nothing to reconcile.

Slack reports many failures as HTTP 200 with ``{"ok": false, "error": ...}``; those are mapped
onto the same StepErrors as HTTP failures. The result gets an ``id`` (the message ``ts``, Slack's
message id within the channel). Params: ``channel``, ``text``, optional ``blocks``.
"""

from __future__ import annotations

from typing import Any

from onward.connectors.base import Connector
from onward.errors import AuthorizationError, PermanentError, RateLimited

# Slack error codes that mean "the token no longer works": reconnecting is the only fix.
_AUTH_ERRORS = frozenset(
    {"not_authed", "invalid_auth", "account_inactive", "token_revoked", "token_expired"}
)


class SlackConnector(Connector):
    provider = "slack"
    supports_idempotency = False
    supports_reconcile = False

    async def perform(self, idempotency_key: str, params: dict[str, Any]) -> dict[str, Any]:
        response = await self.request(
            "POST", "/slack/chat.postMessage", json=params, idempotency_key=idempotency_key
        )
        result = self.json_object(response)
        if not result.get("ok", False):
            self._raise_slack_error(str(result.get("error", "unknown_error")), result)
        return {**result, "id": result.get("ts")}

    def _raise_slack_error(self, error: str, result: dict[str, Any]) -> None:
        detail = {"provider": self.provider, "connection": self.connection.id, "body": result}
        if error in _AUTH_ERRORS:
            raise AuthorizationError(
                f"reconnect the slack account {self.connection.account}: {error}",
                connection=self.connection.id,
                detail=detail,
            )
        if error == "ratelimited":
            raise RateLimited("slack rate-limited the request", detail=detail)
        raise PermanentError(f"slack refused the message: {error}", detail=detail)
