"""Connected accounts (R15) and consent at send time (R14), as step kinds see them.

``Integrations`` is what a step kind reaches through ``step.integrations``: the connector of a
connection (one object per connected account, sharing one HTTP client), the effect store, and
the consent check. It owns the ``connections``, ``suppressions`` and ``notifications`` tables.

Revoked credentials: a provider's 401/403 becomes ``AuthorizationError``; the step kind marks
the connection broken (writing the customer's notification in the same statement) and the
worker parks the run with the reason ("reconnect the email account ..."). A step that needs a
connection already known broken parks without calling the provider. ``restore`` makes the
connection usable and resumes every run parked on it from the same step, in one transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from onward import audit, outbound, pseudonyms, vault
from onward.connectors import Connection, Connector, get_connector_class
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.effects import Effects
from onward.errors import (
    AuthorizationError,
    PermanentError,
    RetryableError,
    SecretUnreadable,
    StepError,
    UnknownConnection,
)

Q = Queries(__package__, "connections.sql")

SECRET = "connections.secret"  # the purposes the vault binds each column's values to
SIGNING_SECRET = "connections.signing_secret"

NotifyHook = Callable[[str, dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Suppressed:
    reason: str
    pseudonymous: bool = False  # matched by an erased contact's pseudonym, not the address


class Integrations:
    def __init__(
        self,
        pool: Pool,
        *,
        effects: Effects | None = None,
        client: httpx.AsyncClient | None = None,
        timeout: float = 10.0,
        notify: NotifyHook | None = None,
    ) -> None:
        self.pool = pool
        self.effects = effects or Effects(pool)
        # Outbound safety (onward.outbound): a client per allow-list, checking each address at
        # connect time. A client given here is used as it is, for every organisation.
        # Each client is made when a request first needs it (``http_client``): making one
        # builds a TLS context (tens of milliseconds), and most processes that open an engine
        # -- a CLI command, the API, a starter -- never send a request.
        self.outbound = outbound.Clients(timeout=timeout)
        self._given_client = client
        self.timeout = timeout
        self.notify = notify
        self.token_secret: str | None = None  # signs approval tokens (Settings.signing_secret)
        self.budget_lease = 120.0  # a cost reservation's lease (Settings.budget_lease_seconds)
        self._pseudonym_keys: dict[str, str] = {}  # per organisation; a key never changes
        self._retired: list[outbound.Clients] = []

    def set_outbound(
        self, engine_allow: tuple[str, ...], *, max_response_bytes: int, max_seconds: float
    ) -> None:
        """The engine's outbound allow-list and caps (Settings), before any request is made."""
        old = self.outbound
        self.outbound = outbound.Clients(
            engine_allow,
            timeout=self.timeout,
            max_response_bytes=max_response_bytes,
            max_seconds=max_seconds,
        )
        self._retired.append(old)

    async def http_client(self, org_id: str) -> httpx.AsyncClient:
        """The client for requests to destinations ``org_id`` configured: checked against the
        engine's allow-list plus the organisation's."""
        if self._given_client is not None:
            return self._given_client
        async with self.pool.connection() as conn:
            org_entries = await outbound.entries(conn, org_id)
        return self.outbound.client(org_entries)

    async def aclose(self) -> None:
        if self._given_client is not None:
            await self._given_client.aclose()
        for clients in (*self._retired, self.outbound):
            await clients.aclose()

    async def _one(self, query: str, args: dict[str, Any]) -> dict[str, Any] | None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(query, args)
            row: dict[str, Any] | None = await cur.fetchone()
            return row

    # -- connections -----------------------------------------------------------------------
    async def add_connection(
        self,
        org_id: str,
        connection_id: str,
        *,
        provider: str,
        base_url: str,
        account: str,
        secret: str,
        signing_secret: str | None = None,
        actor: str | None = None,
    ) -> None:
        """Connect an account (or replace its credentials). ``signing_secret``: what the
        provider signs its callbacks to us with (Slack's interactivity requests). Audited
        (``connection_add``, never a secret) in the same transaction."""
        get_connector_class(provider)  # refuse an unknown provider before storing anything
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(
                Q.upsert,
                {
                    "org_id": org_id,
                    "connection_id": connection_id,
                    "provider": provider,
                    "base_url": base_url,
                    "account": account,
                    "secret": await vault.seal(conn, org_id, SECRET, secret),
                    "signing_secret": await vault.seal_opt(
                        conn, org_id, SIGNING_SECRET, signing_secret
                    ),
                },
            )
            await audit.record(
                conn,
                org_id,
                actor=audit.actor(actor),
                action="connection_add",
                target=connection_id,
                detail={"provider": provider, "base_url": base_url, "account": account},
            )

    async def _get(self, org_id: str, connection_id: str) -> dict[str, Any] | None:
        """One connection with its secrets decrypted (``SecretUnreadable`` if they cannot be)."""
        async with self.pool.connection() as conn:
            args = {"org_id": org_id, "connection_id": connection_id}
            row: dict[str, Any] | None = await (await conn.execute(Q.get, args)).fetchone()
            if row is None:
                return None
            return row | {
                "secret": await vault.unseal(conn, org_id, SECRET, row["secret"]),
                "signing_secret": await vault.unseal_opt(
                    conn, org_id, SIGNING_SECRET, row["signing_secret"]
                ),
            }

    async def signing_secret(self, org_id: str, connection_id: str) -> str | None:
        """The secret a connection's provider signs its callbacks with (None: none stored)."""
        row = await self._get(org_id, connection_id)
        if row is None:
            raise UnknownConnection(org_id, connection_id)
        secret: str | None = row["signing_secret"]
        return secret

    async def connector(self, org_id: str, connection_id: str) -> Connector:
        """The connector for a usable connection; parks the step if it is known broken. A
        secret this process cannot decrypt (its key not configured here) is retried: another
        process may hold the key."""
        connector, _ = await self.connector_as_read(org_id, connection_id)
        return connector

    async def connector_as_read(
        self, org_id: str, connection_id: str
    ) -> tuple[Connector, datetime]:
        """``connector``, and the connection's ``updated_at`` it was made from: a refusal of
        its credentials marks the connection broken only if it is still that state
        (``mark_broken(seen_at=...)``), not once the customer restored it meanwhile."""
        try:
            row = await self._get(org_id, connection_id)
        except SecretUnreadable as exc:
            raise RetryableError(str(exc)) from None
        if row is None:
            raise PermanentError(f"no connection {connection_id!r} in organisation {org_id!r}")
        connector = self._connector(connection_id, row, await self.http_client(org_id))
        return connector, row["updated_at"]

    def _connector(
        self, connection_id: str, row: dict[str, Any], client: httpx.AsyncClient
    ) -> Connector:
        if row["status"] == "broken":
            raise AuthorizationError(
                f"reconnect the {row['provider']} account {row['account']}: "
                f"{row['broken_reason'] or 'its credentials were refused'}",
                connection=connection_id,
            )
        conn = Connection(
            connection_id, row["provider"], row["base_url"], row["account"], row["secret"]
        )
        try:
            connector_class = get_connector_class(conn.provider)
        except KeyError as exc:  # stored by a process that registered a connector this one lacks
            raise PermanentError(str(exc).strip("'\"")) from None
        return connector_class(conn, client=client, timeout=self.timeout)

    async def mark_broken(
        self, org_id: str, connection_id: str, reason: str, *, seen_at: datetime | None = None
    ) -> None:
        """The provider refused the connection's credentials: mark it broken (and notify),
        if it is usable. ``seen_at``: the connection's ``updated_at`` when the refused call
        read it -- a restore (or new credentials) committed since then is newer than the
        refusal, which then changes nothing (else a call that began before the restore would
        break the restored connection again, and the runs parking on it would wait for a
        second restore nobody knows to make)."""
        row = await self._one(
            Q.mark_broken,
            {
                "org_id": org_id,
                "connection_id": connection_id,
                "reason": reason,
                "seen_at": seen_at,
            },
        )
        if row is not None and self.notify is not None:
            await self.notify(row["subject"], {"connection_id": connection_id, "reason": reason})

    async def restore(
        self, org_id: str, connection_id: str, *, actor: str | None = None
    ) -> list[dict[str, Any]]:
        """Mark usable and resume every run parked on it; returns the resumed (run_id, seq).
        ``UnknownConnection`` if there is no such connection (nothing is changed)."""
        args = {"org_id": org_id, "connection_id": connection_id}
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(Q.get, args)
            if await cur.fetchone() is None:
                raise UnknownConnection(org_id, connection_id)
            await conn.execute(Q.restore, args)
            cur = await conn.execute(Q.resume_parked, args)
            resumed = list(await cur.fetchall())
            await audit.record(
                conn,
                org_id,
                actor=audit.actor(actor),
                action="connection_restore",
                target=connection_id,
                detail={"resumed": len(resumed)},
            )
            return resumed

    async def probe(self, org_id: str, connection_id: str) -> str | None:
        """Check a connection ahead of time. Returns None when healthy, else the reason (and
        marks it broken, so the customer is told before a run needs it).
        ``UnknownConnection`` if there is no such connection."""
        row = await self._get(org_id, connection_id)
        if row is None:
            raise UnknownConnection(org_id, connection_id)
        try:
            client = await self.http_client(org_id)
            await self._connector(connection_id, row, client).probe()
        except AuthorizationError as exc:
            await self.mark_broken(org_id, connection_id, str(exc), seen_at=row["updated_at"])
            return str(exc)
        except StepError as exc:
            return str(exc)
        await self._one(
            Q.mark_checked,
            {"org_id": org_id, "connection_id": connection_id},
        )
        return None

    # -- consent -----------------------------------------------------------------------------
    async def suppress(
        self, org_id: str, contact: str, reason: str, channel: str = "email"
    ) -> None:
        await self._one(
            Q.suppress,
            {"org_id": org_id, "contact": contact, "channel": channel, "reason": reason},
        )

    async def suppression(
        self, org_id: str, contact: str, channel: str = "email"
    ) -> Suppressed | None:
        """Why ``contact`` must not be contacted on ``channel`` (None: it may be): listed in
        clear text, or by the pseudonym an erasure left (``onward.erasure``)."""
        row = await self._one(
            Q.suppression,
            {
                "org_id": org_id,
                "contact": contact,
                "pseudonym": await self._pseudonym(org_id, contact),
                "channel": channel,
            },
        )
        return Suppressed(row["reason"], row["pseudonymous"]) if row else None

    async def _pseudonym(self, org_id: str, contact: str) -> str:
        key = self._pseudonym_keys.get(org_id)
        if key is None:
            async with self.pool.connection() as conn:
                key = self._pseudonym_keys[org_id] = await pseudonyms.key(conn, org_id)
        return pseudonyms.digest(key, contact)


async def pseudonymise_suppressions(
    conn: Conn, org_id: str, contacts: list[str], digests: list[str], *, reason: str
) -> dict[str, int]:
    """Erasure, in the caller's transaction: ``contacts`` (normalised) leave the suppression
    list and their ``digests`` (pseudonyms) join it, on email and on every channel the clear
    rows named. Returns ``{"forgotten": clear rows removed, "added": pseudonym rows added}``."""
    row = await (
        await conn.execute(
            Q.pseudonymise,
            {"org_id": org_id, "contacts": contacts, "digests": digests, "reason": reason},
        )
    ).fetchone()
    assert row is not None
    return {"forgotten": int(row["forgotten"]), "added": int(row["added"])}


async def rotate_batch(conn: Conn, after: Any, limit: int) -> tuple[int, int, Any]:
    """``onward keys rotate-secrets``: re-encrypt the next ``limit`` connections after the
    cursor ``after`` (``(org_id, connection_id)``) under the current key, in the caller's
    transaction. Returns (scanned, re-encrypted, the cursor or None when done)."""
    last_org, last_id = after or ("", "")
    rows = await (
        await conn.execute(
            Q.secrets_batch, {"after_org": last_org, "after_id": last_id, "limit": limit}
        )
    ).fetchall()
    changed = 0
    for row in rows:
        org_id = row["org_id"]
        secret = await vault.reseal(conn, org_id, SECRET, row["secret"])
        signing = row["signing_secret"] and await vault.reseal(
            conn, org_id, SIGNING_SECRET, row["signing_secret"]
        )
        if secret is not None or signing:
            await conn.execute(
                Q.update_secrets,
                {
                    "org_id": org_id,
                    "connection_id": row["connection_id"],
                    "secret": secret or row["secret"],
                    "signing_secret": signing or row["signing_secret"],
                },
            )
            changed += 1
    last = (rows[-1]["org_id"], rows[-1]["connection_id"]) if len(rows) == limit else None
    return len(rows), changed, last


async def usable_for_park(conn: Conn, org_id: str, connection_id: str) -> bool:
    """In a park's transaction: is the connection usable again (restored meanwhile)? Read
    under a share lock, so a restore is either seen here or waits and resumes the park."""
    cur = await conn.execute(Q.lock_for_park, {"org_id": org_id, "connection_id": connection_id})
    row = await cur.fetchone()
    return row is not None and row["status"] == "ok"


async def status_of(conn: Conn, org_id: str, connection_id: str) -> str | None:
    """The connection's status (``ok``, ``broken``); None: no such connection."""
    cur = await conn.execute(Q.get, {"org_id": org_id, "connection_id": connection_id})
    row = await cur.fetchone()
    return str(row["status"]) if row else None
