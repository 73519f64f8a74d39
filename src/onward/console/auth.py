"""Who may see the console: an API key pasted once on ``/login`` becomes a signed session cookie.

* :func:`authenticate` turns a pasted key into a :class:`Principal` (organisation, key id,
  scopes) or ``None``. **Stand-in**: API keys (``onward.api_keys``) are being built on main;
  until they land, keys come from ``ONWARD_CONSOLE_KEYS`` -- comma-separated
  ``ORG/SCOPE+SCOPE/SECRET`` entries, e.g. ``acme/admin/k_3f9a...`` -- compared in constant
  time. Swapping in ``onward.api_keys.authenticate`` changes this one function.
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

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer

from onward.db import Pool

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


def key_id_of(secret: str) -> str:
    """A name for a key that does not reveal it (shown as who acted)."""
    return "key_" + hashlib.sha256(secret.encode()).hexdigest()[:12]


def _configured_keys() -> list[tuple[str, frozenset[str], str]]:
    keys = []
    for entry in (os.environ.get("ONWARD_CONSOLE_KEYS") or "").split(","):
        org, _, rest = entry.strip().partition("/")
        scopes, _, secret = rest.partition("/")
        if org and scopes and secret:
            keys.append((org, frozenset(scopes.split("+")), secret))
    return keys


async def authenticate(pool: Pool, token: str) -> Principal | None:
    """The principal a pasted key stands for, or ``None`` (stand-in: see the module doc)."""
    del pool  # the real one reads the keys table
    found = None
    for org, scopes, secret in _configured_keys():
        # every entry compared, in constant time: no timing says which key was close
        if hmac.compare_digest(secret.encode(), token.encode()):
            found = Principal(org, key_id_of(secret), scopes)
    return found


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
