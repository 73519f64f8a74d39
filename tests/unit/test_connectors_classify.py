"""classify(): HTTP responses and transport exceptions → the engine's StepError family.

Pure logic: responses and exceptions are built in-process, no network involved (one test
runs classify in a real process whose clock runs five minutes fast).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from onward.connectors import Connection, classify, parse_retry_after
from onward.errors import (
    AuthorizationError,
    OutcomeUnknown,
    PermanentError,
    RateLimited,
    RetryableError,
    StepError,
)
from onward.testing import run_python

CONN = Connection(
    id="conn_1", provider="email", base_url="http://mail.test", account="acct_1", token="t0k3n"
)
REQUEST = httpx.Request("POST", "http://mail.test/email/messages")


def response(status: int, **kwargs: Any) -> httpx.Response:
    return httpx.Response(status, request=REQUEST, **kwargs)


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_ask_for_a_reconnect(status: int) -> None:
    error = classify(response(status, json={"error": "invalid_auth"}), connection=CONN)

    assert type(error) is AuthorizationError
    assert error.connection == "conn_1"
    assert str(error).startswith("reconnect the email account acct_1")
    assert not error.retryable
    assert error.detail["status"] == status


def test_authorization_error_without_a_connection_still_classifies() -> None:
    error = classify(response(401))

    assert isinstance(error, AuthorizationError)
    assert error.connection is None


def test_429_with_seconds_sets_retry_after() -> None:
    error = classify(response(429, headers={"Retry-After": "7"}), connection=CONN)

    assert isinstance(error, RateLimited)
    assert error.retry_after == 7.0
    assert error.retryable


def test_429_with_an_http_date_sets_retry_at_not_a_delay() -> None:
    when = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    error = classify(response(429, headers={"Retry-After": format_datetime(when, usegmt=True)}))

    assert isinstance(error, RateLimited)
    assert error.retry_at == when and error.retry_at.tzinfo is not None
    assert error.retry_after is None  # the worker turns the instant into a delay, in SQL
    assert "retry at 2031-05-06T07:08:09+00:00" in str(error)


def test_an_http_date_in_the_past_by_this_clock_is_kept_as_it_is() -> None:
    """The local clock may run fast: "five minutes ago" here may be "in a minute" for the
    database. classify reads no clock, so the instant reaches the worker unchanged."""
    when = (datetime.now(UTC) - timedelta(minutes=5)).replace(microsecond=0)
    error = classify(response(429, headers={"Retry-After": format_datetime(when, usegmt=True)}))

    assert isinstance(error, RateLimited)
    assert error.retry_at == when
    assert error.retry_after is None


def test_a_429_under_a_clock_five_minutes_fast_still_waits_for_the_date() -> None:
    """A real process whose clock runs 300 s fast (libfaketime) classifies a 429 whose date is
    60 s ahead of the true time: the date is passed on, not turned into "retry now"."""
    when = (datetime.now(UTC) + timedelta(seconds=60)).replace(microsecond=0)
    code = (
        "import sys, time, httpx\n"
        "from onward.connectors import classify\n"
        "r = httpx.Response(429, headers={'Retry-After': sys.argv[1]})\n"
        "e = classify(r)\n"
        "print(time.time(), e.retry_at.isoformat(), e.retry_after)\n"
    )
    out = run_python(code, format_datetime(when, usegmt=True), clock_offset="+300")
    clock, retry_at, retry_after = out.split()
    assert float(clock) - time.time() > 290  # the process's clock really ran fast
    assert datetime.fromisoformat(retry_at) == when
    assert retry_after == "None"


@pytest.mark.parametrize("header", [None, "soon", ""])
def test_429_without_a_usable_retry_after_leaves_it_to_backoff(header: str | None) -> None:
    headers = {} if header is None else {"Retry-After": header}
    error = classify(response(429, headers=headers))

    assert isinstance(error, RateLimited)
    assert error.retry_after is None


def test_parse_retry_after() -> None:
    at = datetime(2025, 1, 1, 12, 0, 30, tzinfo=UTC)
    assert parse_retry_after("0") == 0.0
    assert parse_retry_after(" 2.5 ") == 2.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("nan") is None
    assert parse_retry_after("inf") is None
    assert parse_retry_after("Wed, 01 Jan 2025 12:00:30 GMT") == at  # IMF-fixdate
    assert parse_retry_after("Wednesday, 01-Jan-25 12:00:30 GMT") == at  # RFC 850
    assert parse_retry_after("Wed Jan  1 12:00:30 2025") == at  # asctime: GMT, no zone given
    offset = parse_retry_after("Wed, 01 Jan 2025 14:00:30 +0200")
    assert offset == at and isinstance(offset, datetime) and offset.utcoffset() == timedelta(0)
    assert parse_retry_after("Wed, 32 Jan 2025 12:00:30 GMT") is None
    assert parse_retry_after("not a date") is None
    assert parse_retry_after("") is None
    assert parse_retry_after(None) is None


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 425])
def test_server_errors_are_retryable(status: int) -> None:
    error = classify(response(status), connection=CONN)

    assert type(error) is RetryableError
    assert error.detail["status"] == status
    assert error.detail["provider"] == "email"


@pytest.mark.parametrize("status", [400, 404, 409, 422, 302])
def test_other_client_errors_are_permanent(status: int) -> None:
    error = classify(
        response(status, json={"error": "bad_request", "message": "no"}), connection=CONN
    )

    assert type(error) is PermanentError
    assert not error.retryable
    assert "bad_request" in str(error)


def test_permanent_error_detail_keeps_a_body_excerpt() -> None:
    error = classify(response(422, text="x" * 5000))

    assert isinstance(error, PermanentError)
    assert len(error.detail["body"]) == 500
    assert error.detail["url"] == "http://mail.test/email/messages"


def test_a_response_without_a_request_still_classifies() -> None:
    assert isinstance(classify(httpx.Response(503)), RetryableError)


def test_success_is_not_a_failure() -> None:
    with pytest.raises(ValueError, match="success"):
        classify(response(200))


def test_http_status_error_is_classified_by_its_response() -> None:
    exc = httpx.HTTPStatusError("boom", request=REQUEST, response=response(401))

    assert isinstance(classify(exc, connection=CONN), AuthorizationError)


@pytest.mark.parametrize(
    "exc_type", [httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError]
)
def test_failures_before_sending_are_plain_retries(exc_type: type[httpx.RequestError]) -> None:
    error = classify(exc_type("nope", request=REQUEST), connection=CONN)

    assert type(error) is RetryableError
    assert error.detail["exception"] == exc_type.__name__


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ReadTimeout("timed out", request=REQUEST),
        httpx.ReadError("reset", request=REQUEST),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.WriteError("broken pipe", request=REQUEST),
        httpx.WriteTimeout("timed out", request=REQUEST),
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError(),
    ],
    ids=lambda e: type(e).__name__,
)
def test_lost_responses_after_sending_are_outcome_unknown(exc: BaseException) -> None:
    error = classify(exc, connection=CONN)

    assert type(error) is OutcomeUnknown
    assert "may have happened" in str(error)


def test_lost_response_of_a_read_is_just_retryable() -> None:
    error = classify(httpx.ReadTimeout("timed out", request=REQUEST), connection=CONN, safe=True)

    assert type(error) is RetryableError


@pytest.mark.parametrize(
    "exc",
    [httpx.UnsupportedProtocol("ftp://?"), httpx.InvalidURL("bad"), httpx.TooManyRedirects("loop")],
    ids=lambda e: type(e).__name__,
)
def test_malformed_requests_are_permanent(exc: Exception) -> None:
    assert type(classify(exc)) is PermanentError


def test_unknown_exceptions_are_retryable() -> None:
    assert type(classify(KeyError("surprise"))) is RetryableError


def test_step_errors_pass_through_unchanged() -> None:
    original: StepError = PermanentError("already classified")

    assert classify(original) is original
