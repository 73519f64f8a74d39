"""Limits by key (R5): concurrency caps and rates that protect a provider, a connection or an
organisation from the rest of the engine, shared by every process through PostgreSQL.

Keys: ``connection:<id>``, ``provider:<name>`` and ``org``. A key may have a concurrency cap
(``max_concurrent``: calls in progress at once), a rate (``calls`` per ``per_seconds``, spaced
evenly: one call every ``per_seconds / calls``, so the provider never sees a burst), or both. ``onward.run_effect`` asks before every outside call
(:func:`acquire`): under an advisory lock per key, in key order, it takes a slot and counts the
call, or -- when a cap is full or the rate's next instant has not come -- takes nothing and raises
:class:`~onward.errors.Deferred` with how long to wait. The worker then makes the step ready
again at that instant (``leases.sql settle_defer``) with no attempt spent: a step never waits
for a limit while it holds a lease.

A step held back by the rate books the rate's next instant (``limit_bookings``) and comes back
then to take it: first come, first served, and the waiting steps do not all wake at every free
instant. A slot counts while its step is still running at the attempt that took it with a live
lease:
a worker that dies frees its slots when its lease lapses, with nothing to clean up first. A
call that finishes gives its slots back at once (:func:`release`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from onward import audit
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import Deferred, InvalidInput

Q = Queries(__package__, "limits.sql")

#: How long a step held back by a full concurrency cap waits before it is tried again (a
#: random point in this range, so the waiting steps do not come back in one burst).
CAP_RETRY_S = (0.2, 1.0)


def keys_for(connection: str, provider: str) -> list[str]:
    """The keys an outside call through ``connection`` (of ``provider``) is limited by."""
    return [f"connection:{connection}", f"provider:{provider}", "org"]


@dataclass(frozen=True)
class Limit:
    key: str
    max_concurrent: int | None
    calls: int | None
    per_seconds: float | None


def check_key(key: str) -> str:
    if key == "org" or (
        key.partition(":")[0] in ("connection", "provider") and len(key.partition(":")[2]) > 0
    ):
        return key
    raise InvalidInput(f"limit key {key!r}: connection:<id>, provider:<name> or org")


async def acquire(
    pool: Pool, org_id: str, keys: list[str], *, run_id: str, seq: int, attempt: int
) -> bool:
    """Take a slot and count a call under every limit of ``keys`` -- all of them, or none and
    ``Deferred``. Returns whether any limit applied (then :func:`release` gives slots back)."""
    async with pool.connection() as conn:
        rows = await (await conn.execute(Q.of_keys, {"org_id": org_id, "keys": keys})).fetchall()
        if not rows:
            return False
        deferred: Deferred | None = None
        async with conn.transaction():
            for row in rows:  # key order: every process locks keys in the same order
                await conn.execute(Q.lock_key, {"org_id": org_id, "key": row["key"]})
            # rates first: a step held back by one books its instant, and that booking must
            # commit; no slot is taken before every rate has let the call go
            for row in rows:
                if row["calls"] is not None and deferred is None:
                    try:
                        await _rate(
                            conn, {"org_id": org_id, "key": row["key"]}, row, run_id=run_id, seq=seq
                        )
                    except Deferred as exc:
                        deferred = exc
            if deferred is None:
                for row in rows:
                    if row["max_concurrent"] is not None:
                        await _slot(conn, org_id, row, run_id=run_id, seq=seq, attempt=attempt)
        if deferred is not None:
            raise deferred
    return True


async def _slot(
    conn: Conn, org_id: str, row: dict[str, Any], *, run_id: str, seq: int, attempt: int
) -> None:
    """Take a slot under the cap, or ``Deferred`` -- which rolls back the whole transaction:
    the slots taken for other keys, and the rate's instants this call used (a booking it used
    is back, so the step goes at once when a slot frees)."""
    got = await (
        await conn.execute(
            Q.take_slot,
            {
                "org_id": org_id,
                "key": row["key"],
                "run_id": run_id,
                "seq": seq,
                "attempt": attempt,
                "max": row["max_concurrent"],
            },
        )
    ).fetchone()
    if not (got and got["taken"]):
        raise Deferred(
            random.uniform(*CAP_RETRY_S),
            f"{row['key']}: {row['max_concurrent']} call(s) in progress already",
            key=row["key"],
        )


#: A booked instant this close is taken now (the claim that brought the step back was that late).
BOOKING_SLACK_S = 0.005


async def _rate(
    conn: Conn, args: dict[str, Any], row: dict[str, Any], *, run_id: str, seq: int
) -> None:
    """The call goes now if the rate allows it, or if its booked instant has come and no call
    went less than an interval ago; else the step books the rate's next instant (or keeps its
    booking) and is deferred until then."""
    step = {**args, "run_id": run_id, "seq": seq, "slack": BOOKING_SLACK_S}
    booked = await (await conn.execute(Q.booking, step)).fetchone()
    if booked is not None and booked["wait_s"] > BOOKING_SLACK_S:
        wait = float(booked["wait_s"])
    elif booked is not None:
        got = await (await conn.execute(Q.use_booking, step)).fetchone()
        if got is None or got["went"]:
            return
        wait = max(float(got["wait_s"] or 0.0), BOOKING_SLACK_S)
    else:
        got = await (await conn.execute(Q.take_call, {**args, "slack": BOOKING_SLACK_S})).fetchone()
        if got is None or got["wait_s"] <= BOOKING_SLACK_S:
            return
        await conn.execute(Q.book, {**step, "slot_at": got["slot_at"]})
        wait = float(got["wait_s"])
    raise Deferred(
        wait,
        f"{row['key']}: {row['calls']} call(s) per {row['per_seconds']:g}s: "
        f"its turn in {wait:.3f}s",
        key=row["key"],
    )


async def release(pool: Pool, org_id: str, *, run_id: str, seq: int, attempt: int) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            Q.release_slots, {"org_id": org_id, "run_id": run_id, "seq": seq, "attempt": attempt}
        )


async def set_limit(
    pool: Pool,
    org_id: str,
    key: str,
    *,
    max_concurrent: int | None = None,
    calls: int | None = None,
    per_seconds: float | None = None,
    actor: str | None = None,
) -> dict[str, Any]:
    """Set a key's limits (``calls`` and ``per_seconds`` together); raises ``InvalidInput``."""
    check_key(key)
    if (calls is None) != (per_seconds is None):
        raise InvalidInput("a rate needs both calls and per_seconds")
    if max_concurrent is None and calls is None:
        raise InvalidInput("give max_concurrent, or calls with per_seconds (or remove the limit)")
    if max_concurrent is not None and max_concurrent < 1:
        raise InvalidInput("max_concurrent: at least 1")
    if calls is not None and (calls < 1 or per_seconds is None or per_seconds <= 0):
        raise InvalidInput("calls: at least 1, per_seconds: more than 0")
    wanted = {"max_concurrent": max_concurrent, "calls": calls, "per_seconds": per_seconds}
    async with pool.connection() as conn, conn.transaction():
        row = await (
            await conn.execute(Q.set_limit, {"org_id": org_id, "key": key, **wanted})
        ).fetchone()
        assert row is not None
        await audit.record(
            conn, org_id, actor=audit.actor(actor), action="limit_set", target=key, detail=wanted
        )
    return dict(row)


async def remove_limit(pool: Pool, org_id: str, key: str, *, actor: str | None = None) -> bool:
    async with pool.connection() as conn, conn.transaction():
        row = await (await conn.execute(Q.remove_limit, {"org_id": org_id, "key": key})).fetchone()
        if row is not None:
            await audit.record(
                conn, org_id, actor=audit.actor(actor), action="limit_remove", target=key
            )
    return row is not None


async def list_limits(pool: Pool, org_id: str) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        return list(await (await conn.execute(Q.list, {"org_id": org_id})).fetchall())
