"""Timers (R6, R7): written by a waiting step (leases.sql ``settle_wait_timer``), fired here.

A timer fires exactly once: ``fired_at IS NULL`` is the claim, whoever comes first -- the
delayed wake job (fast path, ``by='wake'``) or the due sweep (backstop, ``by='sweep'``).
Firing makes the waiting step ready, with ``wake`` saying what woke it, and writes the outbox
row that wakes a worker of its lane, all in one statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from onward.db import Conn
from onward.db.sql import Queries

Q = Queries(__package__, "timers.sql")


async def fire(conn: Conn, timers: Sequence[tuple[str, int]], *, by: str) -> list[dict[str, Any]]:
    """Fire these (org_id, timer_id) if still unfired; returns the ones this call fired."""
    if not timers:
        return []
    cur = await conn.execute(
        Q.fire,
        {"org_ids": [t[0] for t in timers], "timer_ids": [t[1] for t in timers], "by": by},
    )
    return list(await cur.fetchall())
