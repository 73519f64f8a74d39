"""Claim, heartbeat, fence and settle (R3): every write a lease holder makes to its step.

* ``claim`` increments ``attempt`` and returns it: the worker's fencing token.
* ``heartbeat`` extends the lease only while the token holds; a step missing from its result
  was taken over, and its task must stop.
* every ``settle_*`` writes only ``WHERE attempt = token AND status = 'running'``: a worker
  whose lease was taken over writes nothing (0 rows) and drops its result.
* ``holds`` tells whether a token still holds its step, locking the row for the caller's
  transaction (a write of another module fenced like a settle: a budget reservation).
* ``release`` hands steps back at once at graceful shutdown; ``rescue_expired`` (the
  sweeper) makes steps whose lease lapsed ready again.

Every transition that makes a step ready writes the step row, its outbox wake and its history
row through the shared fragment ``make_ready``/``announce_ready`` (``db/fragments.sql``).

Each function is one statement (one round trip, one commit in autocommit mode); the SQL is in
``leases.sql``. Times are always the database's ``now()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from psycopg.types.json import Jsonb

from onward.db import Conn
from onward.db.sql import Queries
from onward.policy import NextStep

Q = Queries(__package__, "leases.sql")


class Token(NamedTuple):
    """Identifies one claim of one step: the fencing token is ``attempt``. A named tuple, as
    the other values a step's settle makes (``AdvanceSettle``, ``policy.Proceed`` and
    ``policy.NextStep``): each is made once or more a step, and a frozen dataclass took 1 us to
    make where a named tuple takes 0.4."""

    org_id: str
    run_id: str
    seq: int
    attempt: int

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.org_id, self.run_id, self.seq)

    def args(self) -> dict[str, Any]:
        return {
            "org_id": self.org_id,
            "run_id": self.run_id,
            "seq": self.seq,
            "attempt": self.attempt,
        }


async def claim(
    conn: Conn, lane: str, limit: int, worker: str, lease: float
) -> list[dict[str, Any]]:
    cur = await conn.execute(
        Q.claim, {"lane": lane, "limit": limit, "worker": worker, "lease": lease}
    )
    return list(await cur.fetchall())


async def holds(conn: Conn, token: Token) -> bool:
    """Whether ``token`` still holds its step. Inside a transaction the step row stays locked
    until it ends, so nothing the transaction writes outlives a takeover it raced."""
    cur = await conn.execute(Q.hold, token.args())
    return await cur.fetchone() is not None


async def heartbeat(
    conn: Conn, tokens: Sequence[Token], leases: Sequence[float]
) -> set[tuple[str, str, int]]:
    """Extend every lease still held, each by its own length (its lane's); returns the keys
    still held."""
    if not tokens:
        return set()
    cur = await conn.execute(
        Q.heartbeat,
        {
            "leases": list(leases),
            "org_ids": [t.org_id for t in tokens],
            "run_ids": [t.run_id for t in tokens],
            "seqs": [t.seq for t in tokens],
            "attempts": [t.attempt for t in tokens],
        },
    )
    return {(r["org_id"], r["run_id"], r["seq"]) for r in await cur.fetchall()}


class AdvanceSettle(NamedTuple):
    """One step's settle for ``settle_advance_many``: done (or skipped) and the next step."""

    token: Token
    output: Any
    vars: dict[str, Any] | None
    next_step: NextStep | None
    eager: bool
    detail: dict[str, Any] | None = None
    skipped: bool = False
    lease: float | None = None  # the eager successor's lease (its lane's); None: the batch's
    keep_output: bool = True  # copied into the run's ctx.steps (policy.outputs_read)


async def settle_advance_many(
    conn: Conn, items: Sequence[AdvanceSettle], *, worker: str, lease: float
) -> dict[tuple[str, str], dict[str, Any]]:
    """Settle several steps (of different runs) in one statement and one commit. Returns the
    run row per (org_id, run_id) that settled; a missing key means that step's lease was lost."""
    if not items:
        return {}
    batch = []
    for i in items:
        t, n = i.token, i.next_step
        row: dict[str, Any] = {
            "org_id": t.org_id,
            "run_id": t.run_id,
            "seq": t.seq,
            "attempt": t.attempt,
            "vars": i.vars or {},
            "eager": bool(i.eager and n),
            "done_status": "skipped" if i.skipped else "done",
            "lease": i.lease if i.lease is not None else lease,
            "keep": i.keep_output,
        }
        if i.vars and i.output is i.vars:
            # a step whose output is its variables (one dict, as `set` returns): sent and
            # stored once, as the variables (`steps.output` NULL on a settled step reads as
            # its `vars`: onward_step_output, migration 0032)
            row["same"] = True
        else:
            row["output"] = i.output
        if n is not None:
            row["next_step_id"] = n.step_id
            row["next_kind"] = n.kind
            row["next_lane"] = n.lane
            row["next_iteration"] = n.iteration
        if i.detail:
            row["detail"] = i.detail
        batch.append(row)
    cur = await conn.execute(Q.settle_advance, {"worker": worker, "items": Jsonb(batch)})
    return {(r["org_id"], r["run_id"]): r for r in await cur.fetchall()}


async def settle_advance(
    conn: Conn,
    token: Token,
    *,
    worker: str,
    output: Any,
    vars: dict[str, Any] | None,
    next_step: NextStep | None,
    eager: bool,
    lease: float,
    detail: dict[str, Any] | None = None,
    skipped: bool = False,
) -> dict[str, Any] | None:
    """Done (or skipped, e.g. consent refused) + enter the next step (or complete the run).
    None: the lease was lost."""
    rows = await settle_advance_many(
        conn,
        [AdvanceSettle(token, output, vars, next_step, eager, detail, skipped)],
        worker=worker,
        lease=lease,
    )
    return rows.get((token.org_id, token.run_id))


async def settle_wait_timer(
    conn: Conn,
    token: Token,
    *,
    worker: str,
    due_in: float,
    intent: dict[str, Any],
    due_at: datetime | None = None,
    wait_kind: str = "timer",
    signals: Sequence[str] | None = None,
) -> dict[str, Any] | None:
    """The step waits on a timer due ``due_in`` seconds from the database's now, or at the
    instant ``due_at`` -- or, for ``wait_kind`` ``signal`` / ``approval``, on ``signals`` or a
    person with that timer as its deadline; None: the lease was lost."""
    cur = await conn.execute(
        Q.settle_wait_timer,
        {
            **token.args(),
            "worker": worker,
            "due_in": due_in,
            "intent": Jsonb(intent),
            "due_at": due_at,
            "wait_kind": wait_kind,
            "signals": list(signals) if signals else None,
        },
    )
    return await cur.fetchone()


async def settle_retry(
    conn: Conn,
    token: Token,
    *,
    worker: str,
    delay: float,
    error: dict[str, Any],
    retry_at: datetime | None = None,
) -> bool:
    """Ready again after ``delay`` seconds, or at ``retry_at`` if later (by the database's
    clock: a provider's HTTP-date is never compared with this process's clock)."""
    cur = await conn.execute(
        Q.settle_retry,
        {
            **token.args(),
            "worker": worker,
            "delay": delay,
            "error": Jsonb(error),
            "retry_at": retry_at,
        },
    )
    return await cur.fetchone() is not None


async def settle_defer(
    conn: Conn,
    token: Token,
    *,
    worker: str,
    delay: float,
    detail: dict[str, Any],
) -> bool:
    """A limit held the step's call back: ready again after ``delay`` seconds (by the database's
    clock), no attempt spent."""
    cur = await conn.execute(
        Q.settle_defer,
        {**token.args(), "worker": worker, "delay": delay, "detail": Jsonb(detail)},
    )
    return await cur.fetchone() is not None


async def settle_stop(
    conn: Conn,
    token: Token,
    *,
    worker: str,
    step_status: str,
    run_status: str,
    reason: str,
    error: dict[str, Any] | None = None,
    wait_kind: str | None = None,
) -> bool:
    """End the step and its run (failed / exceeded / cancelled) or park both for a person."""
    cur = await conn.execute(
        Q.settle_stop,
        {
            **token.args(),
            "worker": worker,
            "step_status": step_status,
            "run_status": run_status,
            "reason": reason,
            "error": Jsonb(error or {"message": reason}),
            "wait_kind": wait_kind,
        },
    )
    row = await cur.fetchone()
    return bool(row and row["settled"])


async def settle_cancel_requested(
    conn: Conn, token: Token, *, worker: str, instead_of: str
) -> bool:
    """If the run was asked to cancel while this step ran, end the step and run cancelled
    (instead of ``instead_of``: a wait, a retry, a deferral, a park). Call it in a transaction
    after the run's transition lock; False: no cancel was requested, settle as decided."""
    cur = await conn.execute(
        Q.settle_cancel_requested, {**token.args(), "worker": worker, "instead_of": instead_of}
    )
    row = await cur.fetchone()
    return bool(row and row["cancelled"])


async def release(conn: Conn, tokens: Sequence[Token], worker: str) -> int:
    if not tokens:
        return 0
    cur = await conn.execute(
        Q.release,
        {
            "worker": worker,
            "org_ids": [t.org_id for t in tokens],
            "run_ids": [t.run_id for t in tokens],
            "seqs": [t.seq for t in tokens],
            "attempts": [t.attempt for t in tokens],
        },
    )
    return len(await cur.fetchall())


async def rescue_expired(conn: Conn, *, limit: int, worker: str) -> int:
    """Make steps whose lease lapsed ready again (the sweeper's backstop); returns how many."""
    cur = await conn.execute(Q.rescue_expired, {"limit": limit, "worker": worker})
    row = await cur.fetchone()
    return int(row["rescued"]) if row else 0
