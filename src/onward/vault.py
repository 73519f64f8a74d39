"""Secrets encrypted at rest: connection credentials, signing secrets, notification webhooks'
secrets and the engine's own keys (``engine_secrets``).

A stored secret reads ``enc:v1:<key id>:<base64url(nonce || ciphertext || tag)>``: AES-256-GCM
(``cryptography``'s ``AESGCM``) with a fresh 96-bit nonce per encryption, and as associated
data the organisation's id and the column's purpose (``connections.secret``, ...). A value
copied into another organisation's row, or into another column, fails authentication and is
refused with :class:`~onward.errors.SecretUnreadable` -- never decrypted, never a crash.

Keys. ``ONWARD_SECRET_KEYS=k2:<base64 32 bytes>,k1:<base64 32 bytes>``: the first key encrypts,
every key decrypts (rotation: put the new key first, run ``onward keys rotate-secrets``, then
remove the old one). With no key configured -- the embedded demo, the tests -- onward makes a
key once and keeps it in the database itself (``engine_secrets``, ``_system`` /
``secrets_key``, key id ``local``); ``onward doctor`` warns about it. That protects a dumped
table or a leaked row, not a copy of the whole database: set ``ONWARD_SECRET_KEYS`` in
production. The ``local`` key keeps decrypting after keys are configured, until
``rotate-secrets`` has moved every row to the configured key.

Rows written before encryption existed hold the plain value; anything without the ``enc:v1:``
prefix reads as plain text and ``rotate-secrets`` encrypts it.

Callers never see this module's format: the owning modules (``connections``, ``notify``,
``approvals``, ``pseudonyms``) seal on write and unseal on read.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from onward.crashpoints import crash_point
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import ConfigError, SecretUnreadable

Q = Queries(__package__, "vault.sql")

ENV = "ONWARD_SECRET_KEYS"
PREFIX = "enc:v1:"
LOCAL_KEY_ID = "local"
LOCAL_KEY_NAME = "secrets_key"  # engine_secrets row of org '_system'
KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
NONCE_BYTES = 12


@dataclass(frozen=True)
class Keyring:
    """The keys this process knows, the first one encrypting."""

    keys: tuple[tuple[str, bytes], ...]
    source: str  # "environment" or "database"

    @property
    def current(self) -> str:
        return self.keys[0][0]

    def get(self, key_id: str) -> bytes | None:
        return next((key for kid, key in self.keys if kid == key_id), None)


def new_key() -> str:
    """A fresh key as ``ONWARD_SECRET_KEYS`` takes it (base64url of 32 random bytes)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()


def _key_bytes(text: str, what: str) -> bytes:
    try:
        key = base64.urlsafe_b64decode(text.strip() + "=" * (-len(text.strip()) % 4))
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise ConfigError(f"{what}: the key must be 32 bytes in base64 (onward keys new-key)")
    return key


def parse_keys(spec: str) -> tuple[tuple[str, bytes], ...]:
    """``id:key,id:key``; ``ConfigError`` (naming the id, never the key) for a bad entry."""
    keys: list[tuple[str, bytes]] = []
    for n, part in enumerate(p for p in spec.split(",") if p.strip()):
        kid, sep, text = part.strip().partition(":")
        if not sep or not KEY_ID.match(kid) or kid == LOCAL_KEY_ID:
            raise ConfigError(
                f"{ENV}: entry {n + 1} must read id:key, the id 1-32 letters, digits, '_' or '-' "
                f"(not {LOCAL_KEY_ID!r})"
            )
        if any(kid == seen for seen, _ in keys):
            raise ConfigError(f"{ENV}: key id {kid!r} appears twice")
        keys.append((kid, _key_bytes(text, f"{ENV}: key {kid!r}")))
    return tuple(keys)


def configured_keys() -> tuple[tuple[str, bytes], ...]:
    """The keys of ``ONWARD_SECRET_KEYS`` (empty: none configured)."""
    return parse_keys(os.environ.get(ENV, ""))


def mode() -> str:
    """What ``onward doctor`` reports: where the encrypting key comes from."""
    keys = configured_keys()
    if keys:
        return f"environment ({ENV}: {len(keys)} key(s), encrypting with {keys[0][0]!r})"
    return "database (no ONWARD_SECRET_KEYS: a key kept in engine_secrets encrypts)"


# -- the pure functions --------------------------------------------------------------------------


def _aad(org_id: str, purpose: str) -> bytes:
    return f"onward:{org_id}\x00{purpose}".encode()


def is_sealed(stored: str) -> bool:
    return stored.startswith(PREFIX)


def key_id_of(stored: str) -> str | None:
    """The key id a stored value was encrypted under (None: a legacy plain value)."""
    return stored[len(PREFIX) :].partition(":")[0] if is_sealed(stored) else None


def encrypt(keyring: Keyring, org_id: str, purpose: str, plaintext: str) -> str:
    kid, key = keyring.keys[0]
    nonce = secrets.token_bytes(NONCE_BYTES)
    sealed = AESGCM(key).encrypt(nonce, plaintext.encode(), _aad(org_id, purpose))
    return f"{PREFIX}{kid}:{base64.urlsafe_b64encode(nonce + sealed).decode()}"


def decrypt(keyring: Keyring, org_id: str, purpose: str, stored: str) -> str:
    """The plain value; a legacy plain value is returned as it is."""
    if not is_sealed(stored):
        return stored
    kid, _, body = stored[len(PREFIX) :].partition(":")
    key = keyring.get(kid)
    if key is None:
        raise SecretUnreadable(
            org_id, purpose, f"it was encrypted under key {kid[:32]!r}, which is not configured"
        )
    try:
        raw = base64.urlsafe_b64decode(body)
        plain = AESGCM(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(org_id, purpose))
    except (InvalidTag, binascii.Error, ValueError):
        raise SecretUnreadable(
            org_id, purpose, "it does not belong to this organisation and column, or was altered"
        ) from None
    return plain.decode()


# -- keys from the environment or the database ---------------------------------------------------


# The database's own key, once read, per database: it never changes once made, and reading it
# for every secret would add a round trip to every connection lookup of every effect.
_LOCAL_KEYS: dict[tuple[str, int, str], bytes] = {}


async def _local_key(conn: Conn, *, make: bool) -> bytes | None:
    where = (conn.info.host, conn.info.port, conn.info.dbname)
    cached = _LOCAL_KEYS.get(where)
    if cached is not None:
        return cached
    key = await _read_local_key(conn, make=make)
    if key is not None:
        _LOCAL_KEYS[where] = key
    return key


async def _read_local_key(conn: Conn, *, make: bool) -> bytes | None:
    row = await (await conn.execute(Q.local_key, {"name": LOCAL_KEY_NAME})).fetchone()
    if row is None and make:
        made = {"name": LOCAL_KEY_NAME, "secret": new_key()}
        row = await (await conn.execute(Q.make_local_key, made)).fetchone()
        if row is None:  # a concurrent maker's key won
            row = await (await conn.execute(Q.local_key, {"name": LOCAL_KEY_NAME})).fetchone()
    return _key_bytes(row["secret"], "engine_secrets secrets_key") if row else None


async def warm(conn: Conn) -> None:
    """Read (and, with no configured keys, make) the database's own key into this process's
    cache, on an engine connection: the API's connections (role ``onward_api``) may not read
    ``engine_secrets``, so they find it here."""
    await _local_key(conn, make=not configured_keys())


async def keyring(conn: Conn, *, for_key: str | None = None) -> Keyring:
    """The configured keys; with none, the database's own (made on first use). ``for_key``: a
    key id about to be decrypted -- the database's key is added if that is the one."""
    keys = configured_keys()
    if not keys:
        local = await _local_key(conn, make=True)
        assert local is not None
        return Keyring(((LOCAL_KEY_ID, local),), "database")
    if for_key == LOCAL_KEY_ID:
        local = await _local_key(conn, make=False)
        if local is not None:
            return Keyring((*keys, (LOCAL_KEY_ID, local)), "environment")
    return Keyring(keys, "environment")


async def seal(conn: Conn, org_id: str, purpose: str, plaintext: str) -> str:
    """Encrypt ``plaintext`` for ``org_id``'s ``purpose`` column under the current key."""
    return encrypt(await keyring(conn), org_id, purpose, plaintext)


async def seal_opt(conn: Conn, org_id: str, purpose: str, plaintext: str | None) -> str | None:
    return None if plaintext is None else await seal(conn, org_id, purpose, plaintext)


async def unseal(conn: Conn, org_id: str, purpose: str, stored: str) -> str:
    """The plain value of a stored secret (``SecretUnreadable`` if it cannot be decrypted)."""
    if not is_sealed(stored):
        return stored
    return decrypt(await keyring(conn, for_key=key_id_of(stored)), org_id, purpose, stored)


async def unseal_opt(conn: Conn, org_id: str, purpose: str, stored: str | None) -> str | None:
    return None if stored is None else await unseal(conn, org_id, purpose, stored)


async def reseal(conn: Conn, org_id: str, purpose: str, stored: str) -> str | None:
    """``stored`` encrypted under the current key, or None if it already is."""
    current = (await keyring(conn)).current
    if key_id_of(stored) == current:
        return None
    return await seal(conn, org_id, purpose, await unseal(conn, org_id, purpose, stored))


# -- rotation ------------------------------------------------------------------------------------

#: one batch of a table's rotation: (conn, after, limit) -> (rows scanned, rows re-encrypted,
#: the last key scanned or None when the table is done)
RotateBatch = Callable[[Conn, Any, int], Awaitable[tuple[int, int, Any]]]


async def rotate_engine_secrets(conn: Conn, after: Any, limit: int) -> tuple[int, int, Any]:
    """One batch of ``engine_secrets`` (not the database's own key, which is not a secret of an
    organisation but the key itself)."""
    last_org, last_name = after or ("", "")
    rows = await (
        await conn.execute(
            Q.engine_secrets_batch,
            {
                "after_org": last_org,
                "after_name": last_name,
                "limit": limit,
                "skip": LOCAL_KEY_NAME,
            },
        )
    ).fetchall()
    changed = 0
    for row in rows:
        purpose = f"engine_secrets.{row['name']}"
        new = await reseal(conn, row["org_id"], purpose, row["secret"])
        if new is not None:
            await conn.execute(
                Q.update_engine_secret,
                {"org_id": row["org_id"], "name": row["name"], "secret": new},
            )
            changed += 1
    last = (rows[-1]["org_id"], rows[-1]["name"]) if len(rows) == limit else None
    return len(rows), changed, last


async def rotate_secrets(pool: Pool, *, batch: int = 500) -> dict[str, dict[str, int]]:
    """Re-encrypt every stored secret under the current (first) key, ``batch`` rows per
    transaction. Idempotent: a row already under the current key is left as it is, so a run
    stopped half-way is finished by running it again. Returns per table
    ``{"scanned": n, "reencrypted": m}``."""
    from onward import connections, intake, notify  # late: they import this module

    if not 1 <= batch <= 10_000:
        raise ConfigError("--batch: between 1 and 10000 rows")
    tables: dict[str, RotateBatch] = {
        "connections": connections.rotate_batch,
        "notification_destinations": notify.rotate_batch,
        "hook_secrets": intake.rotate_batch,
        "engine_secrets": rotate_engine_secrets,
    }
    report: dict[str, dict[str, int]] = {}
    for table, step in tables.items():
        counts = report[table] = {"scanned": 0, "reencrypted": 0}
        after: Any = None
        while True:
            async with pool.connection() as conn, conn.transaction():
                scanned, changed, after = await step(conn, after, batch)
            counts["scanned"] += scanned
            counts["reencrypted"] += changed
            if after is None:
                break
            crash_point("vault.between_batches")
    return report


async def not_current(pool: Pool) -> int | None:
    """How many stored secrets are not under the current key (None: no key is configured yet
    and nothing was encrypted)."""
    keys = configured_keys()
    current = keys[0][0] if keys else LOCAL_KEY_ID
    async with pool.connection() as conn:
        row = await (
            await conn.execute(
                Q.not_current, {"prefix": f"{PREFIX}{current}:%", "skip": LOCAL_KEY_NAME}
            )
        ).fetchone()
    assert row is not None
    return int(row["n"])
