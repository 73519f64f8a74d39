"""Cost budgets (R5): the slow lane's model calls spend money and tokens; a budget per day
(UTC) for the organisation (scope ``*``) or one automation caps what they may spend.

Before a call, :func:`reserve` reserves the call's maximum cost (the connector's
``cost_estimate``) under every budget that applies -- all of them, or none and
``BudgetExhausted``, which parks the step (``wait_kind = 'budget'``). After the call,
:func:`charge` records the real cost (the connector's ``cost_of`` the result: the sandbox's
model reports it) once per effect key and releases the reservations; :func:`release` gives them
back when no call was made. A reservation has a lease (the step's): a worker that dies between
reserve and charge leaves a reservation that stops counting when its lease lapses, so budget
never leaks for ever. Setting a budget resumes the steps parked on budgets, and the sweeper
resumes those parked before today once the day renews their budget, and those whose call fits
in their budget's room again (:func:`resume_with_room`).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from onward import audit, leases
from onward.crashpoints import crash_point
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import BudgetExhausted, InvalidInput, LeaseLost
from onward.leases import Token

Q = Queries(__package__, "budgets.sql")

UNITS = ("usd", "tokens")


async def reserve(
    pool: Pool,
    org_id: str,
    automation_id: str,
    effect_key: str,
    *,
    cost: dict[str, float],
    lease: float,
    held: Token | None = None,
) -> bool:
    """Reserve ``cost`` (``{"usd": .., "tokens": ..}``) under every budget of this automation
    and of the organisation. Returns whether any budget applied. Raises ``BudgetExhausted``.

    ``held``: the step attempt making the call. A reservation is written only while that
    attempt holds its step (``leases.holds``, in the reservation's transaction), else
    ``LeaseLost``: a stale attempt that reached this line after a newer one had charged and
    freed the effect's reservation would leave one that nothing frees (it lapses, but stays)."""
    async with pool.connection() as conn:
        rows = await (
            await conn.execute(Q.of_scopes, {"org_id": org_id, "automation_id": automation_id})
        ).fetchall()
        rows = [r for r in rows if r["unit"] in cost]
        if not rows:
            return False
        async with conn.transaction():
            if held is not None and not await leases.holds(conn, held):
                raise LeaseLost(
                    f"step {held.run_id}#{held.seq}: attempt {held.attempt} no longer holds it"
                )
            for row in rows:  # scope, unit order: every process locks in the same order
                args = {"org_id": org_id, "scope": row["scope"], "unit": row["unit"]}
                await conn.execute(Q.lock_budget, args)
                got = await (
                    await conn.execute(
                        Q.reserve,
                        {
                            **args,
                            "effect_key": effect_key,
                            "amount": Decimal(str(cost[row["unit"]])),
                            "per_day": row["per_day"],
                            "lease": lease,
                        },
                    )
                ).fetchone()
                if not (got and got["reserved"]):
                    used = (got["charged"] + got["others"]) if got else row["per_day"]
                    raise BudgetExhausted(
                        row["scope"],
                        row["unit"],
                        f"budget {row['scope']} ({row['unit']}): {used} of {row['per_day']} per "
                        f"day used or reserved; this call may cost up to {cost[row['unit']]}",
                        cost=cost[row["unit"]],
                    )
    crash_point("budget.after_reserve")
    return True


async def charge(
    pool: Pool, org_id: str, automation_id: str, effect_key: str, *, cost: dict[str, float]
) -> None:
    """The real cost, once per effect key; the reservations released in the same statement."""
    async with pool.connection() as conn:
        await conn.execute(
            Q.charge,
            {
                "org_id": org_id,
                "automation_id": automation_id,
                "effect_key": effect_key,
                "usd": Decimal(str(cost.get("usd", 0))),
                "tokens": Decimal(str(cost.get("tokens", 0))),
            },
        )


async def release(pool: Pool, org_id: str, effect_key: str) -> None:
    async with pool.connection() as conn:
        await conn.execute(Q.release, {"org_id": org_id, "effect_key": effect_key})


async def set_budget(
    pool: Pool,
    org_id: str,
    scope: str,
    unit: str,
    per_day: float,
    *,
    worker: str,
    actor: str | None = None,
) -> dict[str, Any]:
    """Set a budget per day; the steps parked on budgets are resumed (each checks again)."""
    if unit not in UNITS:
        raise InvalidInput(f"unit: one of {', '.join(UNITS)}")
    if per_day < 0:
        raise InvalidInput("per_day: 0 or more")
    async with pool.connection() as conn:
        async with conn.transaction():  # the budget and its audit row
            row = await (
                await conn.execute(
                    Q.set_budget,
                    {
                        "org_id": org_id,
                        "scope": scope,
                        "unit": unit,
                        "per_day": Decimal(str(per_day)),
                    },
                )
            ).fetchone()
            await audit.record(
                conn,
                org_id,
                actor=audit.actor(actor),
                action="budget_set",
                target=scope,
                detail={"unit": unit, "per_day": per_day},
            )
        await resume_parked(conn, org_id, worker=worker, reason=f"budget {scope} set")
    assert row is not None
    return dict(row)


async def resume_parked(
    conn: Conn,
    org_id: str | None,
    *,
    worker: str,
    reason: str,
    renewed_only: bool = False,
    limit: int = 500,
) -> int:
    """Make steps parked on a budget ready again (of ``org_id``, or every organisation's
    parked before today with ``renewed_only``: the sweeper's daily renewal)."""
    row = await (
        await conn.execute(
            Q.resume_parked,
            {
                "org_id": org_id,
                "renewed_only": renewed_only,
                "worker": worker,
                "reason": reason,
                "limit": limit,
            },
        )
    ).fetchone()
    return int(row["resumed"]) if row else 0


async def resume_with_room(conn: Conn, *, worker: str, limit: int = 500) -> int:
    """The sweeper's backstop: steps parked on a budget that has room for their call now (its
    reservations released or lapsed, a charge below the estimate, or a raise that committed
    between the step's failed reservation and its park) become ready again, oldest first, as
    many as fit together. Each reserves again when it runs."""
    row = await (
        await conn.execute(Q.resume_with_room, {"worker": worker, "limit": limit})
    ).fetchone()
    return int(row["resumed"]) if row else 0


async def list_budgets(pool: Pool, org_id: str) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        return list(await (await conn.execute(Q.list, {"org_id": org_id})).fetchall())
