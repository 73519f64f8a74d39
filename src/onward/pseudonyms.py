"""Pseudonyms of contact identifiers (R14): what onward keeps instead of an erased address.

An erased contact must stay suppressed, yet the suppression list must not keep the address.
It keeps ``hmac-sha256:<hex>``: HMAC-SHA256 of the normalised identifier (NFC, trimmed, lower
case) under a key of the organisation's own, made once and kept in ``engine_secrets`` (row
``org_id = <organisation>``, ``name = 'pseudonym_key'``). At send time the recipient is
digested the same way and compared (``Integrations.suppression``).

Why keyed rather than a plain SHA-256: an email address has little entropy, so a plain digest
is reversed by hashing a list of candidate addresses, and the same address has the same digest
in every installation (anyone holding a list could check whether a person was a customer).
Under a key, a digest alone -- the suppression list exported, a log line, a backup of one
table -- says nothing. The key lives in the same database, so someone holding the whole
database can still test a guess; that is the limit of what this protects.

The key is kept encrypted (:mod:`onward.vault`, rotated with ``onward keys rotate-secrets``
like every stored secret: the same key, re-encrypted). The key itself is never taken from the
environment and never replaced: a different key would make
every stored pseudonym stop matching, and erased people would be contacted again.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import unicodedata

from onward import vault
from onward.db import Conn
from onward.db.sql import Queries

Q = Queries(__package__, "pseudonyms.sql")

PREFIX = "hmac-sha256:"
KEY_NAME = "pseudonym_key"
PURPOSE = "engine_secrets.pseudonym_key"  # kept encrypted (onward.vault)


def normalise(identifier: str) -> str:
    """The form identifiers are compared in: NFC, trimmed, lower case."""
    return unicodedata.normalize("NFC", identifier).strip().lower()


def digest(key: str, identifier: str) -> str:
    """The pseudonym of ``identifier`` under ``key``."""
    mac = hmac.new(key.encode(), normalise(identifier).encode(), hashlib.sha256)
    return PREFIX + mac.hexdigest()


def is_pseudonym(text: str) -> bool:
    return text.startswith(PREFIX)


async def key(conn: Conn, org_id: str) -> str:
    """The organisation's pseudonym key, made on first use."""
    args = {"org_id": org_id, "name": KEY_NAME}
    for _ in range(3):
        row = await (await conn.execute(Q.read_key, args)).fetchone()
        if row is None:
            sealed = await vault.seal(conn, org_id, PURPOSE, secrets.token_urlsafe(32))
            row = await (await conn.execute(Q.make_key, {**args, "secret": sealed})).fetchone()
        if row is not None:
            return await vault.unseal(conn, org_id, PURPOSE, row["secret"])
    raise RuntimeError(f"the pseudonym key of organisation {org_id!r} could not be read")
