"""Turning what an HTTP call produced into the engine's StepError vocabulary.

The one rule that matters most: once a request may have reached the provider, a lost response
is not "failed", it is :class:`~onward.errors.OutcomeUnknown` — the work may have happened, so the
engine must reconcile, repeat the same idempotency key, or park for a person. Only failures that
provably happened before the request left (connect errors, pool timeouts) are plain retries.
Reads (``safe=True``) can't create anything, so for them a lost response is simply retryable.

============================================  =================================================
outcome                                       StepError
============================================  =================================================
401, 403                                      AuthorizationError (never retried; reconnect)
429                                           RateLimited(``Retry-After``: seconds -> retry_after,
                                              an HTTP-date -> retry_at)
408, 425, 5xx                                 RetryableError
other 4xx, unexpected 3xx                     PermanentError
connect error / connect or pool timeout       RetryableError (nothing was sent)
read timeout, reset, dropped connection       OutcomeUnknown (RetryableError if ``safe``)
any other exception                           RetryableError
============================================  =================================================

Nothing here reads the local clock. A ``Retry-After`` HTTP-date stays an absolute instant
(``RateLimited.retry_at``): the worker compares it with the database's ``now()``, so a worker
whose clock runs fast or slow still waits as long as the provider asked.
"""

from __future__ import annotations

import contextlib
import email.utils
import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx

from onward.errors import (
    AuthorizationError,
    OutcomeUnknown,
    PermanentError,
    RateLimited,
    RetryableError,
    StepError,
)

if TYPE_CHECKING:
    from onward.connectors.base import Connection

_BODY_EXCERPT = 500

# Raised before a single byte of the request left this process: repeating is always safe.
_NOT_SENT: tuple[type[Exception], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.ProxyError,
)
# Our own request is wrong; sending it again will not help.
_OUR_MISTAKE: tuple[type[Exception], ...] = (
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
    httpx.InvalidURL,
    httpx.TooManyRedirects,
)


def parse_retry_after(value: str | None) -> float | datetime | None:
    """What a ``Retry-After`` value asks for, without reading any clock.

    Delta-seconds give a float (negative ones 0.0); an HTTP-date gives the instant as an aware
    UTC datetime, even one in the past (only the database's clock may say what is past). None
    when absent or unreadable.
    """
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # HTTP-dates are GMT by definition (asctime carries no zone)
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC)


def classify(
    outcome: httpx.Response | BaseException,
    *,
    connection: Connection | None = None,
    safe: bool = False,
) -> StepError:
    """The StepError an unsuccessful response or a raised exception stands for.

    ``connection`` names the provider and account in messages (and sets
    ``AuthorizationError.connection``). ``safe`` says the request was a read, which can be
    repeated even if its response was lost. A 2xx response is not a failure: ValueError.
    """
    if isinstance(outcome, StepError):
        return outcome
    if isinstance(outcome, httpx.HTTPStatusError):
        return classify(outcome.response, connection=connection, safe=safe)
    if isinstance(outcome, httpx.Response):
        return _classify_response(outcome, connection)
    return _classify_exception(outcome, connection, safe)


def _who(connection: Connection | None) -> str:
    return connection.provider if connection is not None else "the provider"


def _classify_response(response: httpx.Response, connection: Connection | None) -> StepError:
    status = response.status_code
    if response.is_success:
        raise ValueError(f"HTTP {status} is a success, not a failure to classify")
    detail = _response_detail(response, connection)
    who = _who(connection)
    if status in (401, 403):
        if connection is not None:
            message = f"reconnect the {connection.provider} account {connection.account}"
        else:
            message = "reconnect the account"
        return AuthorizationError(
            f"{message}: the provider refused its credentials (HTTP {status})",
            connection=connection.id if connection is not None else None,
            detail=detail,
        )
    if status == 429:
        asked = parse_retry_after(response.headers.get("Retry-After"))
        message = f"{who} rate-limited the request (HTTP 429)"
        if isinstance(asked, datetime):
            return RateLimited(
                f"{message}; retry at {asked.isoformat()}", retry_at=asked, detail=detail
            )
        wait = f"; retry after {asked:g}s" if asked is not None else ""
        return RateLimited(message + wait, retry_after=asked, detail=detail)
    # 408/425: the server gave up on (or declined) the request before acting on it.
    if status >= 500 or status in (408, 425):
        return RetryableError(f"{who} answered HTTP {status}", detail=detail)
    reason = _provider_reason(response)
    return PermanentError(
        f"{who} rejected the request (HTTP {status})" + (f": {reason}" if reason else ""),
        detail=detail,
    )


def _provider_reason(response: httpx.Response) -> str:
    """A short human reason from the error body: its ``error``/``message`` fields, or text."""
    try:
        body = response.json()
    except (ValueError, httpx.ResponseNotRead):
        body = None
    if isinstance(body, dict):
        parts = [str(body[k]) for k in ("error", "message", "detail") if body.get(k)]
        if parts:
            return ": ".join(parts)[:200]
    try:
        return response.text[:200]
    except (httpx.ResponseNotRead, UnicodeDecodeError):
        return ""


def _classify_exception(exc: BaseException, connection: Connection | None, safe: bool) -> StepError:
    who = _who(connection)
    detail: dict[str, Any] = {"exception": type(exc).__name__, "error": str(exc)}
    if connection is not None:
        detail |= {"provider": connection.provider, "connection": connection.id}
    if isinstance(exc, httpx.RequestError):
        with contextlib.suppress(RuntimeError):  # an exception built without a request
            detail |= {"method": exc.request.method, "url": str(exc.request.url)}
    if isinstance(exc, _NOT_SENT):
        return RetryableError(f"could not reach {who}: {type(exc).__name__}", detail=detail)
    if isinstance(exc, _OUR_MISTAKE):
        return PermanentError(f"invalid request to {who}: {exc}", detail=detail)
    if isinstance(exc, httpx.TransportError | httpx.DecodingError | OSError | TimeoutError):
        if safe:
            return RetryableError(
                f"lost the response of a read from {who}: {type(exc).__name__}", detail=detail
            )
        return OutcomeUnknown(
            f"lost the connection to {who} after sending the request ({type(exc).__name__}); "
            "the work may have happened",
            detail=detail,
        )
    return RetryableError(f"calling {who} failed: {type(exc).__name__}: {exc}", detail=detail)


def _response_detail(response: httpx.Response, connection: Connection | None) -> dict[str, Any]:
    detail: dict[str, Any] = {"status": response.status_code}
    with contextlib.suppress(RuntimeError):  # a response built without a request (tests)
        detail |= {"method": response.request.method, "url": str(response.request.url)}
    if connection is not None:
        detail |= {"provider": connection.provider, "connection": connection.id}
    try:
        body = response.text
    except (httpx.ResponseNotRead, UnicodeDecodeError):
        body = ""
    if body:
        detail["body"] = body[:_BODY_EXCERPT]
    return detail
