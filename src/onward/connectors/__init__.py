"""Connectors: how the engine talks to outside providers, one connected account at a time.

``get_connector_class(provider)`` finds the connector for a connection's provider::

    connector = get_connector_class(conn.provider)(conn, client=shared_httpx_client)
    result = await connector.perform(effect_key, params)

Failures are raised as :class:`~onward.errors.StepError` subclasses (see :mod:`.classify`).
"""

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


def register_connector(cls: type[Connector]) -> type[Connector]:
    """Add (or replace) the connector for ``cls.provider``; usable as a class decorator."""
    _REGISTRY[cls.provider] = cls
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
    "parse_retry_after",
    "register_connector",
]
