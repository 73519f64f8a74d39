"""A small synchronous client for the sandbox's ``/_admin`` endpoints.

Used by tests and by the chaos runner to set faults, revoke accounts, read the ledger and the
peak concurrency per account (:meth:`SandboxAdmin.concurrency`), and to play the people on the
other side: click a button in a Slack approval message (:meth:`SandboxAdmin.click`), answer an
email (:meth:`SandboxAdmin.reply`); and to steer a customer's notification receiver
(:meth:`SandboxAdmin.hook_inbox`, :meth:`SandboxAdmin.hook_received`). The endpoints behind
these are documented in :mod:`onward.sandbox.slack`, :mod:`onward.sandbox.email` and
:mod:`onward.sandbox.hooks`.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Self

import httpx

# How long the sandbox waits for the engine to answer one click or one email delivery.
_DELIVERY_TIMEOUT_S = 10.0


class SandboxAdminError(RuntimeError):
    """An admin call was refused (bad knob, unknown provider, ...)."""


class SandboxAdmin:
    """Steers a running sandbox at ``url`` (e.g. ``http://127.0.0.1:8099``)."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.Client(base_url=self.url, timeout=timeout)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._client.request(method, path, **kwargs)
        if response.is_error:
            raise SandboxAdminError(
                f"{method} {path} answered {response.status_code}: {response.text}"
            )
        return response.json()

    def health(self) -> bool:
        """True if the sandbox answers its health check right now."""
        try:
            return self._client.get("/_admin/health", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    def reset(self) -> None:
        """Forget everything: ledger, provider state, faults, revocations, concurrency peaks."""
        self._call("POST", "/_admin/reset")

    def faults(self, provider: str, **knobs: Any) -> dict[str, Any]:
        """Replace ``provider``'s fault knobs; knobs not given return to their defaults.

        Knobs: ``latency_ms``, ``error_rate``, ``rate_limit_rate``, ``retry_after_s``,
        ``drop_after_work_rate``, ``hang_s``, ``script`` (list of ``"ok"``, ``"503"``,
        ``"429"``, ``"drop_after_work"``, ``"hang_after_work"``...), ``seed``.
        """
        result: dict[str, Any] = self._call("POST", f"/_admin/faults/{provider}", json=knobs)
        return result

    def fault_state(self) -> dict[str, Any]:
        """Every provider's knobs, remaining script, and the revoked accounts."""
        result: dict[str, Any] = self._call("GET", "/_admin/faults")
        return result

    def concurrency(self) -> dict[str, dict[str, dict[str, int]]]:
        """Requests in progress per provider and account, now and at most since the last
        reset (counted from arrival, injected latency included, to the answer):
        ``{provider: {account: {"peak": n, "now": m}}}``."""
        result: dict[str, dict[str, dict[str, int]]] = self._call("GET", "/_admin/concurrency")
        return result

    def revoke(self, provider: str, account: str) -> None:
        """Make ``provider`` answer 401 to ``account`` until :meth:`restore`."""
        self._call("POST", f"/_admin/accounts/{provider}/{account}/revoke")

    def restore(self, provider: str, account: str) -> None:
        self._call("POST", f"/_admin/accounts/{provider}/{account}/restore")

    def ledger(
        self,
        provider: str | None = None,
        *,
        account: str | None = None,
        idempotency_key: str | None = None,
    ) -> list[dict[str, Any]]:
        """Ledger entries, oldest first, optionally filtered."""
        query = {
            k: v
            for k, v in {
                "provider": provider,
                "account": account,
                "idempotency_key": idempotency_key,
            }.items()
            if v is not None
        }
        entries: list[dict[str, Any]] = self._call("GET", "/_admin/ledger", params=query)["entries"]
        return entries

    def wait_for_ledger(
        self, provider: str | None, count: int, *, timeout: float = 10.0, **filters: Any
    ) -> list[dict[str, Any]]:
        """Poll until the ledger holds at least ``count`` matching entries; return them."""
        deadline = time.monotonic() + timeout
        while True:
            entries = self.ledger(provider, **filters)
            if len(entries) >= count:
                return entries
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"ledger has {len(entries)} {provider or ''} entries after {timeout}s, "
                    f"expected at least {count}"
                )
            time.sleep(0.02)

    # --- Slack ---------------------------------------------------------------------------------

    def slack_app(self, account: str, interactivity_url: str, signing_secret: str) -> None:
        """Register workspace ``account``'s Slack app: where its clicks go, what signs them."""
        self._call(
            "POST",
            "/_admin/slack/app",
            json={
                "account": account,
                "interactivity_url": interactivity_url,
                "signing_secret": signing_secret,
            },
        )

    def slack_messages(
        self, channel: str | None = None, account: str | None = None
    ) -> list[dict[str, Any]]:
        """Posted messages, oldest first: ``account, channel, ts, text, blocks, updates``."""
        query = {k: v for k, v in {"channel": channel, "account": account}.items() if v is not None}
        messages: list[dict[str, Any]] = self._call("GET", "/_admin/slack/messages", params=query)[
            "data"
        ]
        return messages

    def click(
        self,
        ts: str | None = None,
        action_id: str | None = None,
        user: str | None = None,
        *,
        account: str | None = None,
        user_name: str | None = None,
        forge: bool = False,
        timestamp_offset_s: int = 0,
        reserialise: bool = False,
        retry_num: int | None = None,
        replay: bool = False,
    ) -> dict[str, Any]:
        """``user`` clicks button ``action_id`` of message ``ts``; the signed interaction is
        POSTed to the engine. Returns ``{"status", "body", "request": {"url", "timestamp",
        "signature", "body", "headers"}}`` (``status`` None and an ``error`` if the engine was
        unreachable). Knobs: ``forge`` (wrong secret), ``timestamp_offset_s`` (signature that
        old), ``reserialise`` (body re-encoded after signing), ``retry_num`` (Slack retry
        headers), ``replay`` (resend the account's previous click byte for byte; the account is
        ``account``, else the account of message ``ts``)."""
        body: dict[str, Any] = {
            "forge": forge,
            "timestamp_offset_s": timestamp_offset_s,
            "reserialise": reserialise,
            "retry_num": retry_num,
            "replay": replay,
        }
        optional = {
            "ts": ts,
            "action_id": action_id,
            "user": user,
            "account": account,
            "user_name": user_name,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        # The sandbox waits up to 10 s for the engine's answer: wait a little longer than that.
        result: dict[str, Any] = self._call(
            "POST", "/_admin/slack/click", json=body, timeout=_DELIVERY_TIMEOUT_S + 5
        )
        return result

    # --- email ---------------------------------------------------------------------------------

    def email_inbound(self, account: str, inbound_url: str) -> None:
        """Deliver replies to ``account``'s messages to ``inbound_url``."""
        self._call(
            "POST", "/_admin/email/inbound", json={"account": account, "inbound_url": inbound_url}
        )

    def email_messages(self, account: str | None = None) -> list[dict[str, Any]]:
        """Every email, sent and received, oldest first, with ``account`` and ``direction``
        (``"outbound"`` or ``"inbound"``)."""
        query = {"account": account} if account is not None else {}
        messages: list[dict[str, Any]] = self._call("GET", "/_admin/email/messages", params=query)[
            "data"
        ]
        return messages

    def reply(
        self,
        message_id: str,
        text: str = "",
        *,
        sender: str | None = None,
        event_id: str | None = None,
        deliveries: int = 1,
        kind: str = "reply",
    ) -> dict[str, Any]:
        """The recipient of sent email ``message_id`` answers it (``kind="unsubscribe"``:
        unsubscribes); the event is POSTed to the account's inbound URL ``deliveries`` times.
        ``sender`` is the reply's ``from`` (default: the original recipient). Returns
        ``{"event_id", "message_id", "event", "deliveries": [{"status", "body"}, ...]}``."""
        body: dict[str, Any] = {
            "message_id": message_id,
            "text": text,
            "deliveries": deliveries,
            "kind": kind,
        }
        if sender is not None:
            body["from"] = sender
        if event_id is not None:
            body["event_id"] = event_id
        result: dict[str, Any] = self._call(
            "POST", "/_admin/email/reply", json=body, timeout=_DELIVERY_TIMEOUT_S * deliveries + 5
        )
        return result

    # --- a customer's notification receiver ----------------------------------------------------

    def hook_url(self, inbox: str) -> str:
        """Where a webhook destination points to reach ``inbox``."""
        return f"{self.url}/hooks/{inbox}"

    def hook_inbox(
        self,
        inbox: str,
        *,
        fail_next: int = 0,
        secret: str | None = None,
        redirect_to: str | None = None,
        pad_bytes: int = 0,
    ) -> dict[str, Any]:
        """Configure ``inbox``: answer the next ``fail_next`` attempts 503; with ``secret``
        (``whsec_...``) record whether each attempt's signature holds; ``redirect_to``: answer
        307 to that URL; ``pad_bytes``: answer 200 with a body that large."""
        body: dict[str, Any] = {
            "fail_next": fail_next,
            "secret": secret,
            "redirect_to": redirect_to,
            "pad_bytes": pad_bytes,
        }
        result: dict[str, Any] = self._call("POST", f"/_admin/hooks/{inbox}", json=body)
        return result

    def hook_received(self, inbox: str) -> dict[str, Any]:
        """``{"attempts": n, "distinct": m, "received": [...], "log": [...]}``: every attempt
        (503s and duplicates included) and the notifications received once per id."""
        result: dict[str, Any] = self._call("GET", f"/_admin/hooks/{inbox}")
        return result

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
