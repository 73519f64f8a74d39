"""Connectors: how the engine talks to outside providers, one connected account at a time.

``get_connector_class(provider)`` finds the connector for a connection's provider::

    connector = get_connector_class(conn.provider)(conn, client=shared_httpx_client)
    result = await connector.perform(effect_key, params)

Failures are raised as :class:`~onward.errors.StepError` subclasses (see :mod:`.classify`).

Your own provider: subclass :class:`Connector` and register it (import the module with
``onward --app MODULE`` so every process knows it)::

    @register_connector
    class Announcements(Connector):
        provider = "announce"
        supports_idempotency = True  # the provider answers a repeated key with the first result

        async def perform(self, idempotency_key: str, params: dict) -> dict:
            response = await self.request(
                "POST", "/messages", json=params, idempotency_key=idempotency_key
            )
            return self.json_object(response)

A connection whose ``provider`` is ``"announce"`` then uses it, and a step kind calls it through
the effect protocol with ``await onward.run_effect(step, connection_id, params)``.
"""

from typing import TypeVar

from onward.connectors.base import Connection, Connector
from onward.connectors.classify import classify, parse_retry_after
from onward.connectors.crm import CrmConnector
from onward.connectors.email import EmailConnector
from onward.connectors.http import HttpConnector
from onward.connectors.model import ModelConnector
from onward.connectors.payment import PaymentConnector
from onward.connectors.slack import SlackConnector

_REGISTRY: dict[str, type[Connector]] = {
    cls.provider: cls
    for cls in (
        EmailConnector,
        CrmConnector,
        ModelConnector,
        PaymentConnector,
        SlackConnector,
        HttpConnector,
    )
}


def get_connector_class(provider: str) -> type[Connector]:
    """The connector class for ``provider``; KeyError naming the known providers otherwise."""
    try:
        return _REGISTRY[provider]
    except KeyError:
        raise KeyError(
            f"no connector for provider {provider!r}; known: {sorted(_REGISTRY)}"
        ) from None


C = TypeVar("C", bound=type[Connector])


def known_providers() -> list[str]:
    """The providers a connection may name: every registered connector's, sorted."""
    return sorted(_REGISTRY)


def register_connector(cls: C) -> C:
    """Add (or replace) the connector for ``cls.provider``; usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, Connector)):
        raise TypeError(f"register_connector takes a Connector subclass, not {cls!r}")
    provider = getattr(cls, "provider", None)
    if not isinstance(provider, str) or not provider:
        raise TypeError(f"{cls.__name__}.provider must name the provider (a non-empty string)")
    _REGISTRY[provider] = cls
    return cls


__all__ = [
    "Connection",
    "Connector",
    "CrmConnector",
    "EmailConnector",
    "HttpConnector",
    "ModelConnector",
    "PaymentConnector",
    "SlackConnector",
    "classify",
    "get_connector_class",
    "known_providers",
    "parse_retry_after",
    "register_connector",
]
