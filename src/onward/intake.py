"""Signed intake (issue 14, B3): what the webhook route ``POST /v1/hooks/{automation_id}``
checks before it starts anything.

**Signatures.** An automation's webhook endpoint may require the Standard Webhooks signature
(headers ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``), verified by the
``standardwebhooks`` package -- never by hand. The endpoint has a secret per automation
(``hook_secrets``); several at once are all valid (rotation: add the new one, move the sender,
remove the old one). The timestamp tolerance is the library's (5 minutes either way). A request
to an endpoint with at least one secret whose signature holds under none of them is refused
with :class:`~onward.errors.SignatureRefused` (401, with no detail about which part failed);
its ``webhook-id`` is then the run's event id, so a replayed delivery starts nothing new. An
endpoint with no secret takes unsigned requests, as before.

Secrets are read and written in exactly one place each, :func:`_store_secret` and
:func:`_load_secrets`, so encryption at rest can wrap those two functions. A secret is answered
once, when it is added; lists show only its id.

**Rate.** Every intake request counts in its organisation's fixed window (``intake_windows``,
database time, ``Settings.intake_window_seconds``); over ``Settings.intake_limit`` requests in
a window it is refused with :class:`~onward.errors.IntakeLimited` (429, ``Retry-After``: the
seconds left in the window). ``onward.limits`` does not fit: its slots and bookings pace steps'
outside calls by run, step and attempt, and a refused HTTP request has none of those. A fixed
window in PostgreSQL is one upsert and is shared by every API process; a process counts its
concurrent requests together (:class:`Admitter`: one upsert for all that wait while the last
one runs, each admitted or refused in its order).
"""

from __future__ import annotations

import base64
import math
import secrets as token
from collections.abc import Mapping
from typing import Any

from standardwebhooks import Webhook

from onward import cache, vault
from onward.batching import Coalescer
from onward.cache import Recent
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import IntakeLimited, InvalidInput, SignatureRefused
from onward.inputs import check_text

Q = Queries(__package__, "intake.sql")
SECRET = "hook_secrets.secret"  # the purpose in the associated data (onward.vault)

SIGNATURE_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")
MIN_SECRET_BYTES = 24


def new_secret() -> str:
    """A fresh Standard Webhooks secret: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(token.token_bytes(32)).decode()


def check_secret(secret: str) -> str:
    """A ``whsec_<base64>`` secret of at least ``MIN_SECRET_BYTES`` bytes, else InvalidInput."""
    check_text(secret, "secret")
    try:
        raw = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except ValueError:
        raw = b""
    if not secret.startswith("whsec_") or len(raw) < MIN_SECRET_BYTES:
        raise InvalidInput(
            f"secret: whsec_ followed by at least {MIN_SECRET_BYTES} bytes in base64"
        )
    return secret


# -- the one place secrets are read and written (encryption at rest wraps these two) --------


async def _store_secret(
    conn: Conn, org_id: str, automation_id: str, secret_id: str, secret: str
) -> dict[str, Any]:
    cur = await conn.execute(
        Q.store_secret,
        {
            "org_id": org_id,
            "automation_id": automation_id,
            "secret_id": secret_id,
            "secret": await vault.seal(conn, org_id, SECRET, secret),
        },
    )
    row = await cur.fetchone()
    assert row is not None
    return dict(row)


async def _load_secrets(conn: Conn, org_id: str, automation_id: str) -> list[str]:
    cur = await conn.execute(Q.load_secrets, {"org_id": org_id, "automation_id": automation_id})
    return [await vault.unseal(conn, org_id, SECRET, row["secret"]) for row in await cur.fetchall()]


#: an endpoint's secrets (none, usually), as every request reads them: trusted for
#: ONWARD_AUTH_CACHE_SECONDS (onward.cache); adding or removing one here forgets at once
_endpoint_secrets: Recent[tuple[str, str], list[str]] = cache.trusted()


async def _secrets_of(pool: Pool, org_id: str, automation_id: str) -> list[str]:
    async def load() -> list[str]:
        async with pool.connection() as conn:
            return await _load_secrets(conn, org_id, automation_id)

    secrets = await _endpoint_secrets.fetch((org_id, automation_id), load)  # one load at a time
    assert secrets is not None  # a list, empty for an endpoint without secrets
    return secrets


def _changed(org_id: str, automation_id: str) -> None:
    _endpoint_secrets.forget(lambda k, _v: k == (org_id, automation_id))


async def rotate_batch(conn: Conn, after: Any, limit: int) -> tuple[int, int, Any]:
    """``onward keys rotate-secrets``: re-encrypt the next ``limit`` webhook secrets after the
    cursor ``after`` (``(org_id, automation_id, secret_id)``) under the current key, in the
    caller's transaction. Returns (scanned, re-encrypted, the cursor or None when done)."""
    last = after or ("", "", "")
    rows = await (
        await conn.execute(
            Q.secrets_batch,
            {
                "after_org": last[0],
                "after_automation": last[1],
                "after_id": last[2],
                "limit": limit,
            },
        )
    ).fetchall()
    changed = 0
    for row in rows:
        sealed = await vault.reseal(conn, row["org_id"], SECRET, row["secret"])
        if sealed is not None:
            await conn.execute(
                Q.update_secret,
                {**{k: row[k] for k in ("org_id", "automation_id", "secret_id")}, "secret": sealed},
            )
            changed += 1
    if len(rows) < limit:
        return len(rows), changed, None
    return (
        len(rows),
        changed,
        (rows[-1]["org_id"], rows[-1]["automation_id"], rows[-1]["secret_id"]),
    )


# -- configuring an endpoint ------------------------------------------------------------------


async def add_secret(
    pool: Pool, org_id: str, automation_id: str, secret: str | None = None
) -> dict[str, Any]:
    """Add a secret to the automation's webhook endpoint (a new one unless given); the others
    stay valid. Answers ``{automation_id, secret_id, secret, created_at}``: the only time the
    secret is shown. The automation must be published (else UnknownAutomation)."""
    from onward.automations.versions import load_version

    secret = check_secret(secret) if secret is not None else new_secret()
    await load_version(pool, org_id, automation_id)  # UnknownAutomation when there is none
    secret_id = "hsec_" + token.token_hex(6)
    async with pool.connection() as conn:
        row = await _store_secret(conn, org_id, automation_id, secret_id, secret)
    _changed(org_id, automation_id)
    return {"automation_id": automation_id, **row, "secret": secret}


async def list_secrets(
    pool: Pool, org_id: str, automation_id: str | None = None
) -> list[dict[str, Any]]:
    """The organisation's webhook secrets (of one automation when given), without the secrets."""
    async with pool.connection() as conn:
        cur = await conn.execute(Q.list_secrets, {"org_id": org_id, "automation_id": automation_id})
        return [dict(row) for row in await cur.fetchall()]


async def remove_secret(pool: Pool, org_id: str, automation_id: str, secret_id: str) -> bool:
    """Remove one secret: requests signed with it are refused from now on. False: no such one."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            Q.remove_secret,
            {"org_id": org_id, "automation_id": automation_id, "secret_id": secret_id},
        )
        removed = await cur.fetchone() is not None
    _changed(org_id, automation_id)
    return removed


# -- checking a request -----------------------------------------------------------------------


def signature_holds(secrets: list[str], headers: Mapping[str, str], body: bytes) -> bool:
    """Whether the Standard Webhooks signature of ``body`` holds under one of ``secrets``
    (``standardwebhooks.Webhook.verify``: headers present, timestamp within the library's
    tolerance, a ``v1`` signature that matches). Any malformed part is simply "does not hold"."""
    wanted = {k.lower(): v for k, v in headers.items() if k.lower() in SIGNATURE_HEADERS}
    for secret in secrets:
        try:
            Webhook(secret).verify(body, wanted, json_parse=False)
        except Exception:  # WebhookVerificationError, and what a malformed header raises
            continue
        return True
    return False


async def verify(
    pool: Pool,
    org_id: str,
    automation_id: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    required: bool = False,
) -> str | None:
    """The verified ``webhook-id`` of a request to an endpoint that requires a signature, or
    None for an endpoint without secrets (unsigned, as before) unless ``required`` (a caller
    with no API key: nothing but a signature can admit it). SignatureRefused otherwise."""
    secrets = await _secrets_of(pool, org_id, automation_id)
    if not secrets and required:
        raise SignatureRefused()
    if not secrets:
        return None
    if not signature_holds(secrets, headers, body):
        raise SignatureRefused()
    return next(v for k, v in headers.items() if k.lower() == "webhook-id")


async def admit(pool: Pool, org_id: str, *, limit: int, window_s: int) -> None:
    """Count one intake request of the organisation; IntakeLimited past ``limit`` in the
    current window (``limit`` 0: no limit, nothing counted)."""
    if limit <= 0:
        return
    (answer,) = await _count(pool, org_id, 1, limit=limit, window_s=window_s)
    if answer is not None:
        raise answer


async def _count(
    pool: Pool, org_id: str, n: int, *, limit: int, window_s: int
) -> list[IntakeLimited | None]:
    """Count ``n`` requests in one statement; answer each, in order: None (admitted) or its
    refusal -- the k-th of them is the window's (count before + k)-th request."""
    args = {"org_id": org_id, "window_s": float(window_s), "n": n}
    async with pool.connection() as conn:
        row = await (await conn.execute(Q.count_request, args)).fetchone()
    assert row is not None
    before = row["requests"] - n
    retry = max(1.0, math.ceil(row["seconds_left"]))
    return [
        IntakeLimited(limit, window_s, retry) if before + k > limit else None
        for k in range(1, n + 1)
    ]


class Admitter:
    """:func:`admit` for the concurrent intake requests of one organisation, counted together
    (``onward.batching.Coalescer``, ``ONWARD_START_BATCHES`` statements in flight): one upsert
    of the window's row for every request waiting, instead of one each queueing on that row's
    lock. Each request is admitted or refused exactly as if counted alone, in arrival order."""

    def __init__(self, pool: Pool, org_id: str, *, limit: int, window_s: int, in_flight: int):
        self.pool, self.org_id, self.limit, self.window_s = pool, org_id, limit, window_s
        self._coalescer: Coalescer[None, None] = Coalescer(
            self._write, in_flight=in_flight, max_items=10_000
        )

    async def admit(self) -> None:
        if self.limit > 0:
            await self._coalescer.submit(None)

    async def _write(self, batch: list[None]) -> list[Exception | None]:
        answers = await _count(
            self.pool, self.org_id, len(batch), limit=self.limit, window_s=self.window_s
        )
        return list(answers)
