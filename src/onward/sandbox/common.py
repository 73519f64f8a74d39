"""Small pieces every sandbox provider shares: the provider list, bearer auth, ids, clocks.

Auth in the sandbox is deliberately simple: any non-empty bearer token is accepted and *is*
the account name (``Authorization: Bearer acct_1`` acts as account ``acct_1``). Revocation is
decided earlier, by the fault layer (:mod:`onward.sandbox.faults`), so the routes only need
to know who is calling.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Annotated, Final

from fastapi import Depends, Header, HTTPException, Request

PROVIDERS: Final[tuple[str, ...]] = ("email", "crm", "model", "payment", "slack")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None if absent/malformed."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


async def current_account(request: Request) -> str:
    """FastAPI dependency: the calling account (the bearer token's owner)."""
    account = bearer_token(request.headers.get("authorization"))
    if account is None:
        # The fault layer answers 401 before a route runs; this guards routes mounted without it.
        raise HTTPException(status_code=401, detail={"error": "not_authed"})
    return account


Account = Annotated[str, Depends(current_account)]
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]


def new_id(prefix: str) -> str:
    """A provider-style opaque id such as ``msg_9f2c4e1a0b3d5c7e``."""
    return f"{prefix}_{secrets.token_hex(8)}"


def now_iso() -> str:
    """The current UTC time as ISO 8601 with milliseconds and a ``Z`` suffix."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
