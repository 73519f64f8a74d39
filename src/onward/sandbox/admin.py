"""A small synchronous client for the sandbox's ``/_admin`` endpoints.

Used by tests and by the chaos runner to set faults, revoke accounts and read the ledger.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Self

import httpx


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
        """Forget everything: ledger, provider state, faults, revocations."""
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
