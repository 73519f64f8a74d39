"""Audit (issue 14, Build 6): who changed what in an organisation, and when.

Every change a person (or an API caller) makes to an organisation's automations, runs or
configuration is an ``audit`` row -- who (``actor``), what (``action``), on what (``target``),
when (``at``) and a small ``detail`` without secrets -- written by :func:`record` in the *same
transaction* as the change: a process stopped at any line leaves both or neither. Each call
site calls :func:`record`; none copies its SQL.

The actions (:data:`ACTIONS`): ``publish``, ``cancel`` (one run), ``cancel_many`` (a bulk
cancel's operation), ``erase``, ``resolve_review``, ``resume``, ``fork``, ``migrate`` (a
migration's operation), ``retention_set``, ``notify_destination_set``,
``notify_destination_remove``, ``connection_add``, ``connection_restore``, ``approver_grant``,
``approver_revoke``, ``limit_set``, ``limit_remove``, ``circuit_set``, ``budget_set``,
``key_create``, ``key_revoke`` (API keys: the key id and its scopes, never the key).

Who: the ``by`` the call carries (operator actions, cancel, erase, migrate), otherwise the
``actor`` the CLI passes (``ONWARD_OPERATOR`` or the login name) or the HTTP layer's
(``key:<key_id>``, the API key of the request). A refused action (bad input, ``ActionRefused``) changes
nothing and so writes no row.

Not run data: retention deletes nothing here. An erasure's row names the contact's pseudonym,
never its id or identifiers, and no ``detail`` holds a contact's identifiers.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from psycopg.pq import TransactionStatus

from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import InvalidInput

Q = Queries(__package__, "audit.sql")

ACTIONS = (
    "publish",
    "cancel",
    "cancel_many",
    "erase",
    "resolve_review",
    "resume",
    "fork",
    "migrate",
    "retention_set",
    "notify_destination_set",
    "notify_destination_remove",
    "connection_add",
    "connection_restore",
    "approver_grant",
    "approver_revoke",
    "limit_set",
    "limit_remove",
    "circuit_set",
    "budget_set",
    "key_create",
    "key_revoke",
)
DEFAULT_ACTOR = "operator"
MAX_LIMIT = 500
_FOREVER = 2**63 - 1

# Who acts when a call names nobody: the CLI sets it once (``ONWARD_OPERATOR`` or the login
# name), the HTTP layer per request (``key:<key_id>``, the request's API key).
ACTOR: ContextVar[str] = ContextVar("onward_audit_actor", default=DEFAULT_ACTOR)


def actor(given: str | None = None) -> str:
    """``given``, else the actor of the current context (:data:`ACTOR`)."""
    return given or ACTOR.get()


def act_as(who: str) -> None:
    """Make ``who`` the actor of calls in this context that name nobody."""
    ACTOR.set(who)


async def record(
    conn: Conn,
    org_id: str,
    *,
    actor: str,
    action: str,
    target: str,
    detail: dict[str, Any] | None = None,
) -> int:
    """Write one audit row in the caller's transaction (the caller holds one); its id."""
    assert action in ACTIONS, action
    assert not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE, (
        "audit.record runs in the transaction of the change it records"
    )
    row = await (
        await conn.execute(
            Q.record,
            {
                "org_id": org_id,
                "actor": actor or ACTOR.get(),
                "action": action,
                "target": target,
                "detail": json.dumps(detail or {}, default=str),
            },
        )
    ).fetchone()
    assert row is not None
    return int(row["audit_id"])


async def page(
    pool: Pool,
    org_id: str,
    *,
    limit: int = 50,
    action: str | None = None,
    since: datetime | str | None = None,
    before: int | None = None,
) -> list[dict[str, Any]]:
    """The organisation's audit rows, newest first; ``before`` (an ``audit_id``) pages on."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit: between 1 and {MAX_LIMIT}")
    if action is not None and action not in ACTIONS:
        raise InvalidInput(f"action: one of {', '.join(ACTIONS)}, not {action!r}")
    if isinstance(since, str):
        try:
            since = datetime.fromisoformat(since)
        except ValueError:
            raise InvalidInput(f"since: not an ISO 8601 instant: {since!r}") from None
    if before is not None and (isinstance(before, bool) or before < 1):
        raise InvalidInput("before: an audit id (at least 1)")
    async with pool.connection() as conn:
        rows = await (
            await conn.execute(
                Q.page,
                {
                    "org_id": org_id,
                    "limit": limit,
                    "action": action,
                    "since": since,
                    "before": before if before is not None else _FOREVER,
                },
            )
        ).fetchall()
    return [dict(r) for r in rows]
