"""Cancellation (R12): cancel one run, or every run an automation, a version or a filter names.

* **Nothing executing** (the run's step is ``ready``, ``waiting`` or ``parked``): the run is
  cancelled at once. In one transaction the step and the run become ``cancelled``, the run's
  pending timers close (``fired_by = 'cancelled'``: a late wake fires nothing), its pending
  approval becomes ``cancelled`` (a later click is refused as cancelled) and a later signal is
  refused because the run is cancelled (``signals.sql settle_unconsumed``).
* **A step in flight** (``running``): the run is marked cancel-requested
  (``runs.cancel_requested_at``, history ``cancel_requested``) and stops at its next safe point:
  the next claim of its step reads the mark and ends the step and run ``cancelled``
  (``policy.stop_check``). The call already in flight may finish; an interrupted one becomes
  ``outcome_unknown`` and is reconciled -- never claimed undone. The effect claim reads the
  mark in its own statement (``effects.sql claim``), so no call starts after the cancel commits;
  a step that would wait, retry, be deferred or park ends cancelled instead
  (``leases.sql settle_cancel_requested``). A ``ready`` step whose earlier attempt was
  interrupted mid-call is handled the same way (marked, made claimable now), so its next claim
  reconciles the effect before the step ends.
* **Finished**: nothing changes; the answer says so.

Cancel is idempotent and says what it did per run (``outcome``: ``cancelled``,
``cancel_requested``, ``already_requested``, ``already_cancelled``, ``already_finished``).

Lock order, the same as a timer's fire and a signal's intake: the run's transition lock
(``signals.lock_run``), its timers (``timers.lock_pending_of_run``), its step, its run row.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from onward import approvals, audit, effects, metrics, operations, signals, timers
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import InvalidInput, UnknownRun

Q = Queries(__package__, "cancel.sql")

OUTCOMES = (
    "cancelled",
    "cancel_requested",
    "already_requested",
    "already_cancelled",
    "already_finished",
)
FILTERS = ("automation_id", "version", "status", "contact_id", "created_before", "created_after")


async def cancel_in_tx(
    conn: Conn,
    org_id: str,
    run_id: str,
    *,
    by: str,
    reason: str | None = None,
    worker: str = "api",
) -> dict[str, Any]:
    """Cancel one run inside the caller's transaction. Raises ``UnknownRun``."""
    reason = reason or f"cancelled by {by}"
    args = {"org_id": org_id, "run_id": run_id}
    await signals.lock_run(conn, org_id, run_id)
    await timers.lock_pending_of_run(conn, org_id, run_id)
    step = await (await conn.execute(Q.lock_step, args)).fetchone()
    run = await (await conn.execute(Q.lock_run, args)).fetchone()
    if run is None:
        raise UnknownRun(org_id, run_id)
    answer: dict[str, Any] = {"run_id": run_id, "status": run["status"]}
    if run["finished_at"] is not None:
        done = "already_cancelled" if run["status"] == "cancelled" else "already_finished"
        return {**answer, "outcome": done}
    if step is None or step["status"] == "running" or await _interrupted_effect(conn, step, args):
        got = await (
            await conn.execute(
                Q.request,
                {
                    **args,
                    "by": by,
                    "reason": reason,
                    "worker": worker,
                    "seq": step["seq"] if step else None,
                    "step_id": step["step_id"] if step else None,
                },
            )
        ).fetchone()
        fresh = bool(got and got["requested"])
        return {**answer, "outcome": "cancel_requested" if fresh else "already_requested"}
    was = step["status"] + (f":{step['wait_kind']}" if step["wait_kind"] else "")
    await conn.execute(
        Q.cancel_now,
        {**args, "seq": step["seq"], "by": by, "reason": reason, "worker": worker, "was": was},
    )
    await timers.close_for_run(conn, org_id, run_id, fired_by="cancelled")
    await approvals.cancel_pending(conn, org_id, run_id)
    metrics.run_finished("cancelled")
    return {**answer, "status": "cancelled", "outcome": "cancelled", "was": was}


async def _interrupted_effect(conn: Conn, step: dict[str, Any], args: dict[str, Any]) -> bool:
    """A ready step whose earlier attempt was interrupted mid-call (an effect ``in_flight`` or
    ``outcome_unknown``) is not cancelled at once: its next claim reconciles the effect (never
    calls it again) and then ends it cancelled. The request makes it claimable now."""
    if step["status"] != "ready":
        return False
    return await effects.unsettled_of_step(conn, args["org_id"], args["run_id"], step["seq"])


async def cancel_run(
    pool: Pool, org_id: str, run_id: str, *, by: str, reason: str | None = None
) -> dict[str, Any]:
    """Cancel one run (its own transaction, with its audit row when it changed the run)."""
    async with pool.connection() as conn, conn.transaction():
        got = await cancel_in_tx(conn, org_id, run_id, by=by, reason=reason)
        if got["outcome"] in ("cancelled", "cancel_requested"):
            await audit.record(
                conn,
                org_id,
                actor=by,
                action="cancel",
                target=run_id,
                detail={"outcome": got["outcome"]},
            )
        return got


def check_filter(params: dict[str, Any]) -> dict[str, Any]:
    """A bulk cancel's filter: only the known fields, at least one of them."""
    unknown = sorted(set(params) - set(FILTERS) - {"by", "reason"})
    if unknown:
        raise InvalidInput(f"unknown cancel filter field(s): {', '.join(unknown)}")
    if not any(params.get(f) is not None for f in FILTERS):
        raise InvalidInput("a bulk cancel names at least one of: " + ", ".join(FILTERS))
    for f in ("created_before", "created_after"):
        v = params.get(f)
        if isinstance(v, str):
            try:
                v = datetime.fromisoformat(v)
            except ValueError:
                raise InvalidInput(f"{f}: not an ISO 8601 instant: {v!r}") from None
        if isinstance(v, datetime):
            try:  # in UTC (a naive instant is taken as UTC): what PostgreSQL stores
                v = v.astimezone(UTC) if v.tzinfo else v.replace(tzinfo=UTC)
            except (OverflowError, ValueError):
                raise InvalidInput(f"{f}: out of range: {v!r}") from None
            params[f] = v.isoformat()
    return params


async def cancel_batch(
    conn: Conn, org_id: str, params: dict[str, Any], after_run_id: str, limit: int
) -> list[dict[str, Any]]:
    """One batch of a bulk cancel (``operations`` kind ``cancel``), in the operation's
    transaction: the next ``limit`` unfinished runs the filter names, each cancelled."""
    rows = await (
        await conn.execute(
            Q.batch_runs,
            {
                "org_id": org_id,
                "after": after_run_id,
                "limit": limit,
                **{f: params.get(f) for f in FILTERS},
            },
        )
    ).fetchall()
    out = []
    for row in rows:
        out.append(
            await cancel_in_tx(
                conn,
                org_id,
                row["run_id"],
                by=params.get("by") or "operator",
                reason=params.get("reason"),
                worker="operation",
            )
        )
    return out


async def cancel_many(
    pool: Pool,
    org_id: str,
    *,
    by: str,
    reason: str | None = None,
    batch: int = operations.BATCH,
    on_batch: Any = None,
    **filters: Any,
) -> dict[str, Any]:
    """Cancel every unfinished run the filter names, in batches (an ``operations`` row with
    its progress); returns the operation's final row."""
    params = check_filter({**{k: v for k, v in filters.items() if v is not None}})
    params.update(by=by, reason=reason)
    return await operations.run(
        pool, org_id, "cancel", params, requested_by=by, batch=batch, on_batch=on_batch
    )
