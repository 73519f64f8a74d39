"""Who may see the console: an API key pasted once on ``/login`` becomes a signed session cookie.

* :func:`authenticate` turns a pasted API key (``onward.api_keys``) into a :class:`Principal`
  (organisation, key id, scopes) or ``None``; every page checks that the key is still live
  (:func:`still_live`: one indexed read), so revoking a key ends its console sessions at once.
* The session cookie holds the principal and a random nonce, signed with itsdangerous under the
  engine's signing key (``ONWARD_SIGNING_SECRET``, else the one the database keeps, see
  ``approvals.token_secret``) and its own salt; ``HttpOnly`` (no script reads it),
  ``SameSite=Strict`` (no other site's page sends it), ``Secure`` over HTTPS; it lasts
  :data:`SESSION_SECONDS`.
* Every form that changes something carries a CSRF token: an HMAC of the session's nonce under
  the same key. SameSite alone would stop a cross-site POST in today's browsers; the token also
  stops it in one that ignores SameSite, and a POST whose ``Origin`` names another site is
  refused before either is read.
* Scopes: ``runs:read`` to read, ``runs:write`` for actions; ``admin`` implies both.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from itsdangerous import BadSignature, URLSafeTimedSerializer

from onward import api_keys
from onward.db import Pool, read

if TYPE_CHECKING:
    from onward.engine import Engine

COOKIE = "onward_session"
SESSION_SECONDS = 8 * 3600
SALT = "onward.console.session"
READ, WRITE, ADMIN = "runs:read", "runs:write", "admin"


@dataclass(frozen=True)
class Principal:
    org_id: str
    key_id: str
    scopes: frozenset[str]

    def can(self, scope: str) -> bool:
        return ADMIN in self.scopes or scope in self.scopes


@dataclass(frozen=True)
class Session:
    principal: Principal
    nonce: str


async def authenticate(pool: Pool, token: str) -> Principal | None:
    """The principal a pasted API key stands for (``onward.api_keys``), or ``None``."""
    found = await api_keys.authenticate(pool, token)
    return Principal(found.org_id, found.key_id, found.scopes) if found is not None else None


async def still_live(engine: Engine, principal: Principal) -> bool:
    """Whether the session's key is still live: a revoked key ends its sessions at once."""
    return await read(engine.pool, lambda: api_keys.is_live(engine.pool, principal.key_id))


class Sessions:
    """Signs and reads session cookies and CSRF tokens with one key."""

    def __init__(self, key: str) -> None:
        self._serializer = URLSafeTimedSerializer(key, salt=SALT)
        self._key = key.encode()

    def issue(self, principal: Principal) -> str:
        return self._serializer.dumps(
            {
                "org": principal.org_id,
                "key": principal.key_id,
                "scopes": sorted(principal.scopes),
                "nonce": secrets.token_urlsafe(16),
            }
        )

    def read(self, cookie: str | None) -> Session | None:
        if not cookie:
            return None
        try:
            data = self._serializer.loads(cookie, max_age=SESSION_SECONDS)
            principal = Principal(data["org"], data["key"], frozenset(data["scopes"]))
            return Session(principal, str(data["nonce"]))
        except (BadSignature, KeyError, TypeError, ValueError):
            return None

    def csrf(self, session: Session) -> str:
        return hmac.new(self._key, b"csrf:" + session.nonce.encode(), "sha256").hexdigest()

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf(session), token or "")
