"""Limits by key (R5): concurrency caps and rates that protect a provider, a connection or an
organisation from the rest of the engine, shared by every process through PostgreSQL.

Keys: ``connection:<id>``, ``provider:<name>`` and ``org``. A key may have a concurrency cap
(``max_concurrent``: calls in progress at once), a rate (``calls`` per ``per_seconds``, a
sliding window), or both. ``onward.run_effect`` asks before every outside call
(:func:`acquire`): under an advisory lock per key, in key order, it takes a slot and counts the
call, or -- when a cap is full or a window is spent -- takes nothing and raises
:class:`~onward.errors.Deferred` with how long to wait. The worker then makes the step ready
again at that instant (``leases.sql settle_defer``) with no attempt spent: a step never waits
for a limit while it holds a lease.

A slot counts while its step is still running at the attempt that took it with a live lease:
a worker that dies frees its slots when its lease lapses, with nothing to clean up first. A
call that finishes gives its slots back at once (:func:`release`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from onward.db import Pool
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
        async with conn.transaction():
            for row in rows:  # key order: every process locks keys in the same order
                args: dict[str, Any] = {"org_id": org_id, "key": row["key"]}
                await conn.execute(Q.lock_key, args)
                if row["max_concurrent"] is not None:
                    got = await (
                        await conn.execute(
                            Q.take_slot,
                            {
                                **args,
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
                if row["calls"] is not None:
                    got = await (
                        await conn.execute(
                            Q.take_call,
                            {**args, "calls": row["calls"], "per": row["per_seconds"]},
                        )
                    ).fetchone()
                    if not (got and got["taken"]):
                        wait = float(got["wait_s"] if got else row["per_seconds"])
                        raise Deferred(
                            wait + 0.001,
                            f"{row['key']}: {row['calls']} call(s) per {row['per_seconds']:g}s "
                            "used up",
                            key=row["key"],
                        )
    return True


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
    async with pool.connection() as conn:
        row = await (
            await conn.execute(
                Q.set_limit,
                {
                    "org_id": org_id,
                    "key": key,
                    "max_concurrent": max_concurrent,
                    "calls": calls,
                    "per_seconds": per_seconds,
                },
            )
        ).fetchone()
    assert row is not None
    return dict(row)


async def remove_limit(pool: Pool, org_id: str, key: str) -> bool:
    async with pool.connection() as conn:
        row = await (await conn.execute(Q.remove_limit, {"org_id": org_id, "key": key})).fetchone()
    return row is not None


async def list_limits(pool: Pool, org_id: str) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        return list(await (await conn.execute(Q.list, {"org_id": org_id})).fetchall())
