"""Signals (R9): answers from outside -- a reply, an unsubscribe, any event a run waits on.

* **Identity.** A signal is stored under the sender's event id (``signal_id``): a transport
  duplicate is the same row (``deliveries`` counts it) and is answered as it was stored.
* **Routing.** It names its run directly, or carries a *correlation key* recorded when the
  answered thing was created (:func:`correlate`: the email step records ``email:<message id>``).
  A signal whose key nobody recorded yet is kept (``run_id`` NULL, visible in ``onward doctor``)
  and adopted by the run when the key is recorded -- there is no window that expires.
* **Consumption.** A step that waits on signals (``wait_signal``) takes the oldest pending one
  it names. The claim (``status = 'pending'`` -> ``consumed``), the step's wake, the outbox row
  and the closing of its deadline timer commit in one statement (``signals.sql consume``).
* **Order.** Intake and a step starting to wait both take the run's transition lock first
  (``signals.sql lock_run``), so whichever comes second sees the other: a signal that came
  before its step waits is consumed by the settle that makes the step wait (:func:`consume`
  from :mod:`onward.settle`), one that comes after by its own intake.
* **The deadline race.** The signal and the deadline timer of the waiting step race; the
  first to commit wins. Intake locks the unfired deadline timer before consuming
  (``signals.sql lock_deadline``): a fire holding it makes intake wait and then find the step
  awake (the deadline won: the signal is recorded ``late``); holding it, intake closes the
  timer as lost (``fired_by = 'signal'``) -- fire skips locked timers.
* A signal for a finished or cancelled run is refused and recorded (``refused``, with a
  history row), never dropped.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from onward import ids
from onward.crashpoints import crash_point
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import InvalidInput, SignalRefused, UnknownRun
from onward.inputs import check_storable, check_text
from onward.queue.base import Queue, Wake

Q = Queries(__package__, "signals.sql")

MAX_NAME = 64
MAX_ID = 320  # a sender's event id (256) with its source's prefix (ids.signal_id)


@dataclass(frozen=True)
class Delivered:
    """What intake did with a signal: ``status`` is ``consumed`` (a waiting step took it),
    ``pending`` (kept until a step of its run waits on it), ``unrouted`` (kept: no run is known
    for its correlation key yet), ``late`` (the deadline won) or ``refused`` (the run had
    finished). ``duplicate``: this identity was stored before."""

    signal_id: str
    name: str
    status: str
    run_id: str | None
    seq: int | None
    duplicate: bool
    reason: str | None = None
    deliveries: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "signal_id": self.signal_id,
            "name": self.name,
            "status": self.status,
            "run_id": self.run_id,
            "seq": self.seq,
            "duplicate": self.duplicate,
            "reason": self.reason,
            "deliveries": self.deliveries,
        }


def _check(signal_id: str, name: str, payload: Any) -> None:
    for what, value, most in (("signal_id", signal_id, MAX_ID), ("name", name, MAX_NAME)):
        if not isinstance(value, str) or not value.strip():
            raise InvalidInput(f"{what}: required, a non-empty string")
        if len(value) > most:
            raise InvalidInput(f"{what}: at most {most} characters")
        check_text(value, what)
    if not isinstance(payload, dict):
        raise InvalidInput("payload: must be a JSON object")
    check_storable(payload, "payload")


async def correlate(
    conn: Conn, org_id: str, key: str, *, run_id: str, seq: int, step_id: str
) -> list[str]:
    """Record that ``key`` answers this run's step (idempotent). Returns the ids of the
    signals that had come with this key before it was known, now the run's."""
    cur = await conn.execute(
        Q.correlate,
        {"org_id": org_id, "key": key, "run_id": run_id, "seq": seq, "step_id": step_id},
    )
    return [r["signal_id"] for r in await cur.fetchall()]


async def deliver(
    pool: Pool,
    org_id: str,
    *,
    signal_id: str,
    name: str,
    run_id: str | None = None,
    correlation_key: str | None = None,
    payload: dict[str, Any] | None = None,
    worker: str = "intake",
    queue: Queue | None = None,
) -> Delivered:
    """Store a signal durably and apply it, in one transaction: routed to ``run_id`` or by
    ``correlation_key``; consumed at once if a step of its run waits on it. Raises
    ``SignalRefused`` (after recording it) when its run has finished or was cancelled,
    ``UnknownRun`` for a ``run_id`` that does not exist, ``InvalidInput`` for bad input.

    ``queue``: the woken step's wake is also published on it at once -- inside the transaction
    where the queue can (PostgreSQL's NOTIFY: delivered if and only if it commits), else just
    after the commit -- under the outbox row's job id, so a worker claims it without waiting for
    the relay's next poll; the outbox row stays the guarantee."""
    payload = payload if payload is not None else {}
    _check(signal_id, name, payload)
    if (run_id is None) == (correlation_key is None):
        raise InvalidInput("give run_id or correlation_key (one of them)")
    if correlation_key is not None:
        if len(correlation_key) > MAX_ID:
            raise InvalidInput(f"correlation_key: at most {MAX_ID} characters")
        check_text(correlation_key, "correlation_key")
    async with pool.connection() as conn, conn.transaction():
        if correlation_key is not None:
            routed = await (
                await conn.execute(Q.route, {"org_id": org_id, "key": correlation_key})
            ).fetchone()
            run_id = routed["run_id"] if routed else None
        else:
            run = await (
                await conn.execute(Q.lock_run, {"org_id": org_id, "run_id": run_id})
            ).fetchone()
            if run is None:
                raise UnknownRun(org_id, run_id or "")
        stored = await (
            await conn.execute(
                Q.store,
                {
                    "org_id": org_id,
                    "signal_id": signal_id,
                    "name": name,
                    "correlation_key": correlation_key,
                    "run_id": run_id,
                    "payload": Jsonb(payload),
                },
            )
        ).fetchone()
        assert stored is not None
        answer, woke = await _apply(conn, org_id, stored, worker)
        hint = _wake_of(org_id, answer, woke)
        publish_tx = getattr(queue, "publish_tx", None)
        if hint is not None and publish_tx is not None:
            await publish_tx(conn, [hint])
            hint = None
    if hint is not None and queue is not None:
        with contextlib.suppress(Exception):  # a hint only: the outbox row is the guarantee
            await queue.publish([hint])
    if answer.status == "refused":
        raise SignalRefused(answer.signal_id, answer.run_id or "", answer.reason or "")
    return answer


def _wake_of(org_id: str, answer: Delivered, woke: dict[str, Any] | None) -> Wake | None:
    if woke is None or answer.run_id is None:
        return None
    return Wake(
        job_id=ids.step_wake_id(answer.run_id, woke["seq"], woke["attempt"] + 1),
        topic="step",
        lane=woke["lane"],
        org_id=org_id,
        payload={"run_id": answer.run_id, "seq": woke["seq"]},
    )


async def _apply(
    conn: Conn, org_id: str, stored: dict[str, Any], worker: str
) -> tuple[Delivered, dict[str, Any] | None]:
    """Consume a pending signal if a step of its run waits on it; else settle it as refused or
    late when that is what it is. Runs in the caller's transaction."""
    run_id, status, seq, reason = (
        stored["run_id"],
        stored["status"],
        stored["seq"],
        stored["reason"],
    )
    taken: dict[str, Any] | None = None
    if run_id is not None and status == "pending":
        await conn.execute(Q.lock_run, {"org_id": org_id, "run_id": run_id})
        taken = await consume(conn, org_id, run_id, worker=worker, signal_id=stored["signal_id"])
        if taken is not None:
            status, seq = "consumed", taken["seq"]
        else:
            verdict = await (
                await conn.execute(
                    Q.settle_unconsumed,
                    {
                        "org_id": org_id,
                        "run_id": run_id,
                        "signal_id": stored["signal_id"],
                        "name": stored["name"],
                        "worker": worker,
                    },
                )
            ).fetchone()
            if verdict is not None:
                status, reason = verdict["status"], verdict["reason"]
    shown = "unrouted" if run_id is None and status == "pending" else status
    answer = Delivered(
        signal_id=stored["signal_id"],
        name=stored["name"],
        status=shown,
        run_id=run_id,
        seq=seq,
        duplicate=not stored["created"],
        reason=reason,
        deliveries=stored["deliveries"],
    )
    return answer, taken


async def consume(
    conn: Conn, org_id: str, run_id: str, *, worker: str, signal_id: str | None = None
) -> dict[str, Any] | None:
    """In the caller's transaction, with the run's transition lock held: if a step of the run waits on
    signals and one it names is pending, consume the oldest and wake the step (closing its
    deadline as lost). Returns the consumed signal (``signal_id``, ``name``, ``seq``) or None.
    ``signal_id`` is only for the crash point's reporting."""
    held = await (
        await conn.execute(Q.lock_deadline, {"org_id": org_id, "run_id": run_id})
    ).fetchone()
    if held is None:  # no step waits on signals, or its deadline fired first
        return None
    row = await (
        await conn.execute(Q.consume, {"org_id": org_id, "run_id": run_id, "worker": worker})
    ).fetchone()
    if row is not None:
        crash_point("signal.after_claim")
    return row


async def lock_run(conn: Conn, org_id: str, run_id: str) -> None:
    """Take the run's transition lock (an advisory lock keyed by the run) for the rest of the
    transaction: intake, a decision and a settle that makes a step wait are ordered by it."""
    await conn.execute(Q.lock_run, {"org_id": org_id, "run_id": run_id})


async def read(pool: Pool, org_id: str, signal_id: str) -> dict[str, Any] | None:
    async with pool.connection() as conn:
        row: dict[str, Any] | None = await (
            await conn.execute(Q.read, {"org_id": org_id, "signal_id": signal_id})
        ).fetchone()
        return row


async def list_signals(
    pool: Pool,
    org_id: str,
    *,
    run_id: str | None = None,
    status: str | None = None,
    unrouted: bool = False,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """An organisation's signals, newest first; ``unrouted``: only those nobody can route."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            Q.list,
            {
                "org_id": org_id,
                "run_id": run_id,
                "status": status,
                "unrouted": unrouted,
                "limit": limit,
            },
        )
        return list(await cur.fetchall())


async def unrouted(conn: Conn, *, grace: float) -> dict[str, Any]:
    """Signals nobody could route, older than ``grace`` seconds (``onward doctor``)."""
    row = await (await conn.execute(Q.unrouted, {"grace": grace})).fetchone()
    assert row is not None
    return dict(row)
