"""What a connector is: one connected provider account, spoken to over HTTP.

A :class:`Connection` is the stored fact "account X at provider P, reachable at URL U with token
T". A :class:`Connector` wraps one connection and offers the three operations the effect runner
needs (see the "Side effects" section of the design):

* :meth:`Connector.perform` — do the work, always passing the effect key as the idempotency key;
* :meth:`Connector.reconcile` — after an uncertain attempt, look for work tagged with that key;
* :meth:`Connector.probe` — a cheap authenticated call, to find revoked credentials early.

Every failure leaves a connector as a :class:`~onward.errors.StepError` chosen by
:func:`~onward.connectors.classify.classify`; the class attributes ``supports_idempotency`` and
``supports_reconcile`` tell the engine which recovery is safe when the outcome is unknown.

A custom connector is public API: subclass :class:`Connector`, set ``provider`` (the name a
connection's ``provider`` field uses) and the capability flags, implement :meth:`perform` with
:meth:`Connector.request` and :meth:`Connector.json_object`, and register it with
:func:`onward.connectors.register_connector`. A step kind then calls it through the effect
protocol with :func:`onward.run_effect`.
"""

from __future__ import annotations

import abc
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, Self

import httpx

from onward.connectors.classify import classify
from onward.errors import OutcomeUnknown, RetryableError

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Connection:
    """A connected provider account. ``token`` is kept out of ``repr`` so it never hits a log."""

    id: str
    provider: str
    base_url: str
    account: str
    token: str = field(repr=False)


class Connector(abc.ABC):
    """Base of every provider connector; one instance per connection.

    ``client`` may be shared by many connectors (one connection pool per process); a connector
    that created its own client closes it in :meth:`aclose`.
    """

    provider: ClassVar[str]
    #: The provider returns the first result when it sees a repeated idempotency key, so a
    #: repeat of an uncertain attempt is safe.
    supports_idempotency: ClassVar[bool] = False
    #: :meth:`reconcile` can find earlier work by the idempotency key.
    supports_reconcile: ClassVar[bool] = False
    #: A repeat of the work harms nobody (it only costs, like a model generation): an uncertain
    #: attempt is simply performed again instead of being parked for a person.
    repeat_is_harmless: ClassVar[bool] = False
    #: Header carrying the idempotency key. Sent even to providers that ignore it: the key then
    #: still shows up in their logs (and in the sandbox ledger), which makes duplicates traceable.
    idempotency_header: ClassVar[str] = "Idempotency-Key"

    def __init__(
        self,
        connection: Connection,
        client: httpx.AsyncClient | None = None,
        timeout: float = 10.0,
    ) -> None:
        if connection.provider != self.provider:
            raise ValueError(
                f"{type(self).__name__} speaks to {self.provider!r}, "
                f"not to connection {connection.id!r} of provider {connection.provider!r}"
            )
        self.connection = connection
        self.timeout = timeout
        self._client = client if client is not None else httpx.AsyncClient()
        self._owns_client = client is None

    @abc.abstractmethod
    async def perform(self, idempotency_key: str, params: dict[str, Any]) -> dict[str, Any]:
        """Do the work once (as far as the provider allows) and return its result."""

    async def reconcile(self, idempotency_key: str) -> dict[str, Any] | None:
        """The earlier work tagged with ``idempotency_key``, or None if the provider has none."""
        raise NotImplementedError(f"{self.provider} offers no way to find earlier work by key")

    def cost_estimate(self, params: dict[str, Any]) -> dict[str, float] | None:
        """The most a call with ``params`` can cost (``{"usd": .., "tokens": ..}``), reserved
        against the cost budgets before it is made; None: the call costs nothing budgeted."""
        return None

    def cost_of(self, result: dict[str, Any]) -> dict[str, float]:
        """What a call really cost, from its result (charged once per effect key)."""
        return {}

    async def probe(self) -> None:
        """Raise AuthorizationError if the credentials are refused (other errors as classified)."""
        await self.request("GET", f"/{self.provider}/me")

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _url(self, path_or_url: str) -> str:
        if path_or_url.startswith(("http://", "https://")):
            return path_or_url
        return self.connection.base_url.rstrip("/") + "/" + path_or_url.lstrip("/")

    async def request(
        self,
        method: str,
        path_or_url: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        accept: Container[int] = (),
    ) -> httpx.Response:
        """Send one authenticated request to ``path_or_url`` (relative to the connection's base
        URL), with the connection's token as a bearer token and ``idempotency_key`` in
        :attr:`idempotency_header`. A non-2xx status not in ``accept``, or a transport
        failure, raises the :class:`~onward.errors.StepError` that :func:`classify` chooses."""
        method = method.upper()
        safe = method in _SAFE_METHODS
        all_headers = dict(headers or {})
        if self.connection.token:
            all_headers["Authorization"] = f"Bearer {self.connection.token}"
        if idempotency_key is not None:
            all_headers[self.idempotency_header] = idempotency_key
        try:
            response = await self._client.request(
                method,
                self._url(path_or_url),
                json=json,
                params=params,
                headers=all_headers,
                timeout=self.timeout,
            )
        except httpx.HTTPError as exc:
            raise classify(exc, connection=self.connection, safe=safe) from exc
        if response.is_success or response.status_code in accept:
            return response
        raise classify(response, connection=self.connection, safe=safe)

    def json_object(self, response: httpx.Response) -> dict[str, Any]:
        """The response body as a JSON object.

        A 2xx whose body can't be read still means the provider acted: for a write that is an
        unknown outcome (reconcile to learn the result), for a read a plain retry.
        """
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict):
            return body
        message = (
            f"{self.provider} answered HTTP {response.status_code} with a body that is not a "
            "JSON object"
        )
        detail = {"status": response.status_code, "body": response.text[:500]}
        if response.request.method in _SAFE_METHODS:
            raise RetryableError(message, detail=detail)
        raise OutcomeUnknown(message + "; the work may have happened", detail=detail)
