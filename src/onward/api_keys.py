"""API keys (issue 14, Build 1): who may call the HTTP API, for which organisation, and what
they may do there.

A key is ``onw_<key_id>_<secret>``: ``key_id`` (16 hex digits) names it in the clear -- in
lists, in the audit (``key:<key_id>`` is the actor of what it does), in a revocation -- and the
secret is 256 random bits. The key is shown once, by :func:`create`; only its SHA-256 is
stored (``api_keys.secret_hash``), so a copy of the database lets nobody call the API. With
that much entropy a plain hash is right: there is nothing to guess, so a slow password hash
would only cost every request.

Scopes (:data:`SCOPES`): ``runs:read`` (read runs, signals, approvals, operations, the flow
settings), ``runs:write`` (start, signal, decide, cancel, operator actions), ``automations:write``
(publish, schedules, migrations, hook secrets), ``admin`` (everything, including keys,
connections, outbound, retention, erasure and the audit). Which route needs which scope is one
table: ``onward.api.scopes``.

Authenticating (:func:`authenticate`) is the one read that crosses organisations: a request
names no organisation before its key is known. It is a lookup by ``key_id`` (a unique index)
and a constant-time comparison of hashes; a wrong, unknown, malformed or revoked key are one
answer, ``None`` (the API's 401 says no more). Creating and revoking each write their audit row
in the same transaction (``key_create``, ``key_revoke``). A key a process verified is trusted
there for ``ONWARD_AUTH_CACHE_SECONDS`` (1 s; ``onward.cache``) without a lookup: a revoked key
authenticates nothing in the revoking process from that commit on, and nothing anywhere once
that second has passed (0: no cache, every request looks its key up).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from onward import audit, cache
from onward.cache import Recent
from onward.db import Pool
from onward.db.sql import Queries
from onward.errors import InvalidInput
from onward.inputs import check_text

Q = Queries(__package__, "api_keys.sql")

SCOPES = ("runs:read", "runs:write", "automations:write", "admin")
PREFIX = "onw_"
_TOKEN = re.compile(r"onw_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
MAX_NAME = 200
TOUCH_EVERY_S = 60.0  # last_used_at is written at most this often per key and process


@dataclass(frozen=True)
class Principal:
    """Who a request is: a live key of one organisation, with its scopes."""

    org_id: str
    key_id: str
    scopes: frozenset[str]

    @property
    def actor(self) -> str:
        """The audit's name for what this key does."""
        return f"key:{self.key_id}"

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes


def _hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def check_scopes(scopes: Iterable[str]) -> list[str]:
    """The scopes, each known, at least one, in :data:`SCOPES` order; else ``InvalidInput``."""
    given = list(scopes)
    unknown = [s for s in given if s not in SCOPES]
    if unknown or not given:
        raise InvalidInput(
            f"scopes: one or more of {', '.join(SCOPES)}"
            + (f" (not {', '.join(repr(s) for s in unknown)})" if unknown else "")
        )
    return [s for s in SCOPES if s in given]


async def create(
    pool: Pool, org_id: str, *, name: str, scopes: Iterable[str], by: str | None = None
) -> tuple[dict[str, Any], str]:
    """A new key of ``org_id``: its row (as :func:`list_keys` shows it) and the key itself --
    the only time anyone sees it."""
    name = check_text(name, "name")
    if not name.strip() or len(name) > MAX_NAME:
        raise InvalidInput(f"name: 1 to {MAX_NAME} characters, not blank")
    ordered = check_scopes(scopes)
    key_id = secrets.token_hex(8)
    token = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    assert _TOKEN.fullmatch(token), "a key always parses"
    who = audit.actor(by)
    async with pool.connection() as conn, conn.transaction():
        row = await (
            await conn.execute(
                Q.insert,
                {
                    "org_id": org_id,
                    "key_id": key_id,
                    "name": name,
                    "scopes": ordered,
                    "secret_hash": _hash(token),
                    "created_by": who,
                },
            )
        ).fetchone()
        assert row is not None
        await audit.record(
            conn,
            org_id,
            actor=who,
            action="key_create",
            target=key_id,
            detail={"name": name, "scopes": ordered},
        )
    view = dict(row)
    view.pop("org_id")
    return view, token


async def list_keys(pool: Pool, org_id: str) -> list[dict[str, Any]]:
    """The organisation's keys (live and revoked), newest first; never a secret."""
    async with pool.connection() as conn:
        return list(await (await conn.execute(Q.list, {"org_id": org_id})).fetchall())


async def revoke(
    pool: Pool, org_id: str, key_id: str, *, by: str | None = None
) -> dict[str, Any] | None:
    """Revoke a live key of ``org_id``: its row, or ``None`` when it has no such live key (a
    key of another organisation is, here, a key that does not exist)."""
    who = audit.actor(by)
    async with pool.connection() as conn, conn.transaction():
        row = await (
            await conn.execute(Q.revoke, {"org_id": org_id, "key_id": key_id, "by": who})
        ).fetchone()
        if row is None:
            return None
        await audit.record(conn, org_id, actor=who, action="key_revoke", target=key_id)
    _touched.pop(key_id, None)
    _verified.forget(lambda _digest, p: p.key_id == key_id)
    return dict(row)


async def is_live(pool: Pool, key_id: str) -> bool:
    """Whether ``key_id`` names a key that is not revoked (a console session's check)."""
    async with pool.connection() as conn:
        row = await (await conn.execute(Q.lookup, {"key_id": key_id})).fetchone()
    return row is not None and row["revoked_at"] is None


def with_key(url: str, key: str, *, user: str = "onward") -> str:
    """``url`` carrying ``key`` as its HTTP Basic user info (``http://onward:onw_...@host/...``):
    the API key of a provider that can only be given a URL to call (an inbound-mail webhook)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{key}@{host}"))


_touched: dict[str, float] = {}  # key_id -> when this process last wrote its last_used_at

#: keys this process verified, by the SHA-256 of the whole token: trusted for
#: ONWARD_AUTH_CACHE_SECONDS without a lookup (onward.cache); a revoke here forgets at once
_verified: Recent[bytes, Principal] = cache.trusted()


async def authenticate(pool: Pool, token: str | None) -> Principal | None:
    """The live key ``token`` is, or ``None`` (missing, malformed, unknown, wrong or revoked:
    one answer). ``pool`` must see every organisation's keys (the engine's own)."""
    m = _TOKEN.fullmatch(token or "")
    if m is None:
        return None
    key_id, digest = m.group(1), _hash(m.group(0))

    async def look_up() -> Principal | None:
        async with pool.connection() as conn:
            row = await (await conn.execute(Q.lookup, {"key_id": key_id})).fetchone()
            if row is None or not hmac.compare_digest(bytes(row["secret_hash"]), digest):
                return None
            if row["revoked_at"] is not None:
                return None
            now = time.monotonic()
            if now - _touched.get(key_id, -TOUCH_EVERY_S) >= TOUCH_EVERY_S:
                _touched[key_id] = now
                await conn.execute(Q.touch, {"org_id": row["org_id"], "key_id": key_id})
        return Principal(row["org_id"], key_id, frozenset(row["scopes"]))

    return await _verified.fetch(digest, look_up)  # one lookup at a time per key
