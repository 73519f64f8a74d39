"""Notifications that arrive (R15): per-organisation destinations and the delivery relay.

A transition that must tell the customer something ("reconnect the email account acct_1")
writes a ``notifications`` row and, **in the same statement**, one delivery intent
(``notification_deliveries``) per destination the organisation has (``fragments.sql notify``).
The intent is the durable promise; it carries its own delivery state (``attempts``,
``next_attempt_at``, ``last_error``), like a step carries its lease.

:class:`DeliveryRelay` runs in every process that runs the outbox relay. It claims due intents
with ``FOR UPDATE SKIP LOCKED`` and **commits the claim at once** (the attempt counted as a
fencing token, the intent pushed one lease ahead), sends with no transaction open, then writes
the outcome fenced by that attempt: ``delivered`` (and ``notifications.delivered_at`` once every
destination has it), or due again after exponential backoff with full jitter
(:func:`onward.backoff.full_jitter`), or ``failed`` after ``MAX_ATTEMPTS``. A relay that dies
between the receiver's 2xx and that write (crash point ``notify.after_send``) leaves the intent
due when its lease lapses: the receiver gets it once more **with the same id** and deduplicates.

Destinations:

* ``webhook``: a JSON POST signed as Standard Webhooks sign (``webhook-id``: the notification's
  stable id ``ntf_<n>``, ``webhook-timestamp``, ``webhook-signature: v1,<base64 HMAC-SHA256 of
  "id.timestamp.body">`` with the destination's ``whsec_`` secret, made by the
  ``standardwebhooks`` package). Through the organisation's
  checked client (:mod:`onward.outbound`: a destination that is not public and not on the
  allow-list is refused at connect time and the delivery fails at once with that reason), with
  a timeout shorter than the lease, no redirects followed, and at most ``MAX_RESPONSE_BYTES``
  of the answer read.
* ``slack``: a message to a channel through a Slack connection (not idempotent: a crash after
  the post repeats the message once).
* ``email``: a message to an address through an email connection, with the notification id
  as idempotency key (the provider returns its first answer for a repeat).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx
import psycopg
from standardwebhooks import Webhook

from onward import audit, vault
from onward.backoff import full_jitter
from onward.crashpoints import crash_point
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import InvalidInput, OutboundRefused, SecretUnreadable, StepError
from onward.inputs import check_text

if TYPE_CHECKING:
    from onward.connections import Integrations

Q = Queries(__package__, "notify.sql")
log = logging.getLogger("onward.notify")

KINDS = ("webhook", "slack", "email")
MAX_ATTEMPTS = 12  # per round; `retry` starts a new round
BACKOFF_BASE = 1.0  # seconds: full jitter in [0, min(cap, base * 2**(attempt-1)))
BACKOFF_CAP = 600.0
MAX_RESPONSE_BYTES = 64 * 1024  # of a receiver's answer: read no more (kept: 200 characters)
MAX_URL = 2048
ID_PATTERN_TEXT = "letters, digits, '_', '.', '-' (at most 64, starting with a letter or digit)"
SENDER = "notifications@onward.invalid"  # the From of notification emails
SECRET = "notification_destinations.secret"  # the purpose the vault binds the secret to


def webhook_id(notification_id: int) -> str:
    """The stable id a receiver deduplicates by: the same for every attempt and destination."""
    return f"ntf_{notification_id}"


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks signature header value (``v1,<base64>``), made by the
    ``standardwebhooks`` package (never by hand). ``body`` is UTF-8 JSON."""
    when = datetime.fromtimestamp(timestamp, UTC)
    return Webhook(secret).sign(msg_id, when, body.decode("utf-8"))


# -- destinations ---------------------------------------------------------------------------


def check_destination_id(value: str) -> str:
    check_text(value, "destination_id")
    ok = 0 < len(value) <= 64 and value[0].isalnum() and value.isascii()
    if not ok or not all(c.isalnum() or c in "_.-" for c in value):
        raise InvalidInput(f"destination_id {value[:80]!r}: {ID_PATTERN_TEXT}")
    return value


def check_url(url: str) -> str:
    """An absolute http(s) URL with a host, no credentials, no fragment; else ``InvalidInput``."""
    check_text(url, "url")
    if len(url) > MAX_URL:
        raise InvalidInput(f"url: at most {MAX_URL} characters")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise InvalidInput("url: no spaces or control characters")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise InvalidInput(f"url {url[:200]!r} is not a URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidInput(f"url {url[:200]!r}: an absolute http:// or https:// URL with a host")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise InvalidInput(f"url {url[:200]!r}: port {parsed.port} out of range")
    if parsed.userinfo or parsed.fragment:
        raise InvalidInput("url: no user:password@ and no #fragment (use the signing secret)")
    return url


def _destination(
    kind: str,
    *,
    url: str | None,
    secret: str | None,
    connection_id: str | None,
    target: str | None,
) -> dict[str, Any]:
    if kind not in KINDS:
        raise InvalidInput(f"kind {kind[:40]!r}: one of {', '.join(KINDS)}")
    if kind == "webhook":
        if not url or connection_id or target:
            raise InvalidInput("a webhook destination takes a url (and optionally a secret)")
        if secret is not None:
            check_text(secret, "secret")
            try:
                ok = (
                    secret.startswith("whsec_")
                    and len(base64.b64decode(secret[6:], validate=True)) >= 16
                )
            except ValueError:
                ok = False
            if not ok:
                raise InvalidInput("secret: whsec_ followed by at least 16 bytes in base64")
        return {"url": check_url(url), "secret": secret or new_secret()}
    what = "a channel" if kind == "slack" else "an address"
    if not connection_id or not target or url or secret:
        raise InvalidInput(f"a {kind} destination takes a connection and {what}")
    check_text(connection_id, "connection")
    check_text(target, "target")
    if len(target) > 320 or len(connection_id) > 256:
        raise InvalidInput("connection or target too long")
    if kind == "email" and "@" not in target:
        raise InvalidInput(f"to {target[:80]!r}: an email address")
    return {"connection_id": connection_id, "target": target}


async def set_destination(
    pool: Pool,
    org_id: str,
    destination_id: str,
    kind: str = "webhook",
    *,
    url: str | None = None,
    secret: str | None = None,
    connection_id: str | None = None,
    target: str | None = None,
    actor: str | None = None,
) -> dict[str, Any]:
    """Create or replace a destination (checked first: ``InvalidInput``, nothing stored).
    A webhook without a secret gets a new one, returned here (and only here; a secret given is
    not returned). ``backlog``:
    notifications still undelivered that it will now receive."""
    fields = {"url": None, "secret": None, "connection_id": None, "target": None}
    fields |= _destination(kind, url=url, secret=secret, connection_id=connection_id, target=target)
    args = {
        "org_id": org_id,
        "destination_id": (destination_id := check_destination_id(destination_id)),
        "kind": kind,
        **fields,
    }
    async with pool.connection() as conn, conn.transaction():
        args["secret"] = await vault.seal_opt(conn, org_id, SECRET, fields["secret"])
        row = await (await conn.execute(Q.set_destination, args)).fetchone()
        assert row is not None
        await audit.record(  # never its secret
            conn,
            org_id,
            actor=audit.actor(actor),
            action="notify_destination_set",
            target=destination_id,
            detail={k: v for k, v in {"kind": kind, **fields}.items() if k != "secret" and v},
        )
    # A secret onward made is answered this once; one the caller gave is not echoed back.
    return dict(row) | {"secret": fields["secret"] if secret is None else None}


async def destinations(pool: Pool, org_id: str) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        return list(await (await conn.execute(Q.destinations, {"org_id": org_id})).fetchall())


async def remove_destination(
    pool: Pool, org_id: str, destination_id: str, *, actor: str | None = None
) -> bool:
    """Remove it and the intents it had not received; False if there was none."""
    args = {"org_id": org_id, "destination_id": destination_id}
    async with pool.connection() as conn, conn.transaction():
        row = await (await conn.execute(Q.remove_destination, args)).fetchone()
        assert row is not None
        ids = list(row["notification_ids"])
        if ids:
            await _complete(conn, org_id, ids)
        if row["removed"]:
            await audit.record(
                conn,
                org_id,
                actor=audit.actor(actor),
                action="notify_destination_remove",
                target=destination_id,
                detail={"undelivered_dropped": len(ids)},
            )
    return bool(row["removed"])


async def _complete(conn: Conn, org_id: str, notification_ids: list[int]) -> None:
    args = {"org_id": org_id, "notification_ids": notification_ids}
    await conn.execute(Q.lock_notifications, args)
    await conn.execute(Q.complete, args)


async def rotate_batch(conn: Conn, after: Any, limit: int) -> tuple[int, int, Any]:
    """``onward keys rotate-secrets``: re-encrypt the next ``limit`` destinations' secrets after
    the cursor ``after`` (``(org_id, destination_id)``) under the current key, in the caller's
    transaction. Returns (scanned, re-encrypted, the cursor or None when done)."""
    last_org, last_id = after or ("", "")
    rows = await (
        await conn.execute(
            Q.secrets_batch, {"after_org": last_org, "after_id": last_id, "limit": limit}
        )
    ).fetchall()
    changed = 0
    for row in rows:
        new = await vault.reseal(conn, row["org_id"], SECRET, row["secret"])
        if new is not None:
            args = {"org_id": row["org_id"], "destination_id": row["destination_id"]}
            await conn.execute(Q.update_secret, args | {"secret": new})
            changed += 1
    last = (rows[-1]["org_id"], rows[-1]["destination_id"]) if len(rows) == limit else None
    return len(rows), changed, last


# -- reading and retrying -----------------------------------------------------------------------


async def list_notifications(
    pool: Pool, org_id: str, *, undelivered: bool = False, limit: int = 50
) -> list[dict[str, Any]]:
    """Newest first, each with ``webhook_id`` and its ``deliveries`` (destination, status,
    attempts, next attempt, last answer)."""
    args = {"org_id": org_id, "undelivered": undelivered, "limit": max(1, min(limit, 1000))}
    async with pool.connection() as conn:
        rows = await (await conn.execute(Q.list, args)).fetchall()
    return [{**r, "webhook_id": webhook_id(r["notification_id"])} for r in rows]


async def retry(
    pool: Pool, org_id: str, notification_id: int | None = None
) -> list[dict[str, Any]]:
    """Make failed intents (and pending ones waiting out a backoff) due now, with a new round
    of attempts: of one notification, or of every undelivered one. ``InvalidInput`` for a
    notification that does not exist. Returns the intents retried."""
    async with pool.connection() as conn:
        if notification_id is not None:
            found = await conn.execute(
                Q.exists, {"org_id": org_id, "notification_id": notification_id}
            )
            if await found.fetchone() is None:
                raise InvalidInput(f"no notification {notification_id} in {org_id!r}")
        cur = await conn.execute(Q.retry, {"org_id": org_id, "notification_id": notification_id})
        return list(await cur.fetchall())


async def undelivered(conn: Conn, *, grace: float) -> dict[str, Any]:
    """Notifications undelivered ``grace`` seconds after they were written (``onward doctor``)."""
    row = await (await conn.execute(Q.undelivered, {"grace": grace})).fetchone()
    assert row is not None
    return dict(row)


KEEP_DELIVERED_SECONDS = 30 * 86400.0


async def prune_delivered(
    conn: Conn, *, keep_seconds: float = KEEP_DELIVERED_SECONDS, limit: int = 5000
) -> int:
    """Remove notifications delivered more than ``keep_seconds`` ago (and their intents), at
    most ``limit``; returns how many."""
    cur = await conn.execute(Q.prune_delivered, {"keep": keep_seconds, "limit": limit})
    return cur.rowcount or 0


# -- the delivery relay -------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    http_status: int | None = None
    error: str | None = None
    final: bool = False  # never deliverable as configured (refused by the outbound check)


def payload(row: dict[str, Any]) -> dict[str, Any]:
    """What a webhook receives (the Standard Webhooks envelope: type, timestamp, data)."""
    return {
        "type": row["kind"],
        "timestamp": row["created_at"].isoformat(),
        "data": {
            "id": webhook_id(row["notification_id"]),
            "notification_id": row["notification_id"],
            "org_id": row["org_id"],
            "kind": row["kind"],
            "subject": row["subject"],
            **(row["body"] or {}),
        },
    }


class DeliveryRelay:
    """Claims due intents, delivers them, writes the outcome. Several relays share the work."""

    def __init__(
        self,
        pool: Pool,
        integrations: Integrations,
        *,
        worker_id: str,
        lease_seconds: float = 30.0,
        poll_seconds: float = 2.0,
        batch: int = 20,
        kick: asyncio.Event | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        backoff: tuple[float, float] = (BACKOFF_BASE, BACKOFF_CAP),
    ) -> None:
        self.pool, self.integrations, self.worker_id = pool, integrations, worker_id
        self.lease, self.poll_seconds, self.batch = lease_seconds, poll_seconds, batch
        self.max_attempts, self.backoff = max_attempts, backoff
        self.kick = kick or asyncio.Event()
        # The answer must come well within the lease, or another relay sends it again.
        self.timeout = max(0.5, min(10.0, lease_seconds / 2))
        self.delivered = 0
        self.failed_attempts = 0

    async def aclose(self) -> None:
        """Nothing of its own to close: webhooks go through the integrations' clients."""

    async def run_once(self) -> int:
        """Claim and deliver one batch; returns how many intents it tried."""
        args = {"limit": self.batch, "lease": self.lease, "worker": self.worker_id}
        async with self.pool.connection() as conn:  # autocommit: the claim commits here
            rows = list(await (await conn.execute(Q.claim, args)).fetchall())
            for row in rows:
                if row["secret"] is not None:
                    try:
                        row["secret"] = await vault.unseal(
                            conn, row["org_id"], SECRET, row["secret"]
                        )
                    except SecretUnreadable as exc:  # the attempt fails with the reason
                        row["secret"], row["secret_error"] = None, str(exc)
        if rows:
            await asyncio.gather(*(self._deliver(row) for row in rows))
        return len(rows)

    async def _deliver(self, row: dict[str, Any]) -> None:
        try:
            outcome = await self.send(row)
        except Exception as exc:  # a bug here must not end the relay: the intent retries
            log.exception(
                "notify: delivering %s failed unexpectedly", webhook_id(row["notification_id"])
            )
            outcome = Outcome(False, error=f"{type(exc).__name__}: {exc}"[:500])
        if outcome.delivered:
            crash_point("notify.after_send")
        await self._settle(row, outcome)

    async def send(self, row: dict[str, Any]) -> Outcome:
        """One attempt to one destination; never holds a database transaction."""
        if row["via"] == "webhook":
            return await self._post(row)
        key = f"{webhook_id(row['notification_id'])}/{row['destination_id']}"
        if row["via"] == "slack":
            params = {"channel": row["target"], "text": f"{row['subject']} ({key})"}
        else:
            body = json.dumps(payload(row)["data"], indent=2, default=str)
            params = {"from": SENDER, "to": row["target"], "subject": row["subject"], "body": body}
        try:
            connector = await self.integrations.connector(row["org_id"], row["connection_id"])
            await connector.perform(key, params)
        except StepError as exc:
            return Outcome(False, error=str(exc)[:500], final=isinstance(exc, OutboundRefused))
        return Outcome(True)

    async def _post(self, row: dict[str, Any]) -> Outcome:
        if row["secret"] is None:
            return Outcome(False, error=row.get("secret_error", "no signing secret")[:500])
        msg_id = webhook_id(row["notification_id"])
        body = json.dumps(payload(row), separators=(",", ":"), default=str).encode()
        timestamp = int(row["now_epoch"])  # the database's clock
        headers = {
            "content-type": "application/json",
            "user-agent": "onward-notify",
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(row["secret"], msg_id, timestamp, body),
        }
        # The organisation's checked client (onward.outbound): a destination that is not
        # public and not allowed is refused at connect time, and the intent fails at once.
        client = await self.integrations.http_client(row["org_id"])
        try:
            async with client.stream(
                "POST", row["url"], content=body, headers=headers, timeout=self.timeout
            ) as r:
                answer = b""
                async for chunk in r.aiter_raw():
                    answer += chunk
                    if len(answer) >= MAX_RESPONSE_BYTES:
                        break  # a receiver's answer is only read this far
        except OutboundRefused as exc:
            return Outcome(False, error=str(exc)[:500], final=True)
        except httpx.HTTPError as exc:
            return Outcome(False, error=f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__)
        if 200 <= r.status_code < 300:
            return Outcome(True, r.status_code)
        text = answer[:200].decode("utf-8", "replace")
        return Outcome(False, r.status_code, f"HTTP {r.status_code}: {text}".strip())

    async def _settle(self, row: dict[str, Any], outcome: Outcome) -> None:
        args = {
            "org_id": row["org_id"],
            "notification_id": row["notification_id"],
            "destination_id": row["destination_id"],
            "attempt": row["attempts"],
            "http_status": outcome.http_status,
        }
        async with self.pool.connection() as conn, conn.transaction():
            if outcome.delivered:
                ids = [row["notification_id"]]
                await conn.execute(
                    Q.lock_notifications, {"org_id": row["org_id"], "notification_ids": ids}
                )
                done = await (await conn.execute(Q.delivered, args)).fetchone()
                if done is None:
                    log.info("notify: %s delivered, but its claim had lapsed", args)
                    return
                await conn.execute(Q.complete, {"org_id": row["org_id"], "notification_ids": ids})
                self.delivered += 1
                return
            base, cap = self.backoff
            delay = full_jitter(int(row["attempts_in_round"]), base, cap, jitter=random.uniform)
            await conn.execute(
                Q.attempt_failed,
                {
                    **args,
                    "delay": delay,
                    "error": outcome.error,
                    "max_attempts": 0 if outcome.final else self.max_attempts,
                },
            )
            self.failed_attempts += 1

    async def run(self, stop: asyncio.Event) -> None:
        from onward.outbox import sleep_or

        try:
            while not stop.is_set():
                try:
                    n = await self.run_once()
                except (psycopg.OperationalError, OSError) as exc:
                    log.warning("notify: database unavailable (%s); retrying", exc)
                    n = 0
                except Exception:
                    log.exception("notify: unexpected error; intents stay due and are retried")
                    n = 0
                if n >= self.batch:
                    continue
                self.kick.clear()
                await sleep_or(stop, self.poll_seconds, self.kick)
        finally:
            await self.aclose()
