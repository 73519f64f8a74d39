"""Circuit breakers (R5): stop calling a provider (or one connection) that keeps failing, and
park the steps that need it instead of burning their retries.

One row per key (``provider:<name>``, ``connection:<id>``) in PostgreSQL, so every process
sees the same state. A key has a breaker once it is configured (:func:`configure`, ``onward
circuits set``, ``PUT /v1/circuits/{key}``): failures under other keys are not counted, so a
provider's occasional 5xx never parks runs unless someone asked for a breaker there.

* **closed** -- calls go through; a failure that says the provider is unwell (a 5xx, a
  timeout, a dropped connection: ``RetryableError`` but not ``RateLimited``, or
  ``OutcomeUnknown``) is counted in a window (``threshold`` failures in ``window_seconds``,
  5 in 30 s by default). The failure that reaches the threshold opens the circuit
  (``circuits.sql fail``, history ``circuit_opened``), and its step parks with it.
* **open** -- a call is not made: its step parks (``CircuitOpen`` -> ``wait_kind =
  'circuit'``) with no attempt spent, until ``retry_at`` (``cooldown_seconds`` later).
* **half_open** -- the elected sweeper makes the longest-parked step ready as the one probe
  (``circuits.sql half_open_due``, history ``circuit_half_open``). Its success closes the
  circuit and resumes every parked step from the same step (``circuits.sql close``, history
  ``circuit_closed`` per run); its failure opens the circuit again for another cool-down.
  A step that read its circuit open and parked just after the close (two statements apart)
  is resumed by the sweeper's next tick (``circuits.sql resume_stranded``).
"""

from __future__ import annotations

from typing import Any

from onward import audit
from onward.crashpoints import crash_point
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import CircuitOpen, InvalidInput, OutcomeUnknown, RateLimited, RetryableError

Q = Queries(__package__, "circuits.sql")


def keys_for(connection: str, provider: str) -> list[str]:
    """The circuits an outside call through ``connection`` (of ``provider``) goes through."""
    return [f"connection:{connection}", f"provider:{provider}"]


def counts_as_failure(exc: BaseException) -> bool:
    """A failure that says the provider is unwell (not a refusal of this one request)."""
    if isinstance(exc, RateLimited):
        return False  # the provider is well; it asks us to slow down (limits, Retry-After)
    return isinstance(exc, RetryableError | OutcomeUnknown)


async def admit(pool: Pool, org_id: str, keys: list[str], *, run_id: str, seq: int) -> bool:
    """Let the call through, or raise ``CircuitOpen`` when a circuit of ``keys`` is open, or
    half-open with another step as its probe. A half-open circuit without a probe takes this
    step as its probe. Returns whether this call is a probe (its success closes the circuit)."""
    probe = False
    async with pool.connection() as conn:
        rows = await (await conn.execute(Q.not_closed, {"org_id": org_id, "keys": keys})).fetchall()
        for row in rows:
            if row["state"] == "half_open":
                taken = await (
                    await conn.execute(
                        Q.take_probe,
                        {
                            "org_id": org_id,
                            "key": row["key"],
                            "run_id": run_id,
                            "seq": seq,
                            "steal": probe,
                        },
                    )
                ).fetchone()
                if taken is not None:
                    probe = True
                    continue
                raise CircuitOpen(
                    row["key"], f"circuit {row['key']} is half-open: one probe at a time"
                )
            raise CircuitOpen(
                row["key"],
                f"circuit {row['key']} is open until {row['retry_at']:%H:%M:%S} UTC: "
                "the step waits for it to close",
            )
    return probe


async def failed(
    pool: Pool, org_id: str, keys: list[str], *, run_id: str, seq: int, worker: str
) -> list[str]:
    """Count a failure under the configured circuits of ``keys``; returns the keys whose
    circuit this failure opened."""
    opened: list[str] = []
    async with pool.connection() as conn:
        for key in keys:
            args = {"org_id": org_id, "key": key}
            row = await (
                await conn.execute(Q.fail, {**args, "run_id": run_id, "seq": seq, "worker": worker})
            ).fetchone()
            if row is not None and row["opened"]:
                opened.append(key)
    if opened:
        crash_point("circuit.after_open")
    return opened


async def succeeded(
    pool: Pool, org_id: str, keys: list[str], *, run_id: str, seq: int, worker: str
) -> list[str]:
    """The call of this step under ``keys`` succeeded: a half-open circuit among them whose
    probe it is closes and every step parked on it resumes. Returns the keys closed."""
    async with pool.connection() as conn:
        rows = await (
            await conn.execute(
                Q.close,
                {"org_id": org_id, "keys": keys, "run_id": run_id, "seq": seq, "worker": worker},
            )
        ).fetchall()
    return [r["key"] for r in rows]


async def resume_stranded(conn: Conn, *, worker: str, limit: int = 100) -> int:
    """The sweeper's backstop: steps parked on a circuit that is closed (their park raced the
    probe's close) are made ready from the same step. Returns how many."""
    cur = await conn.execute(Q.resume_stranded, {"worker": worker, "limit": limit})
    return len(await cur.fetchall())


async def half_open_due(conn: Conn, *, worker: str, limit: int = 100) -> list[dict[str, Any]]:
    """The sweeper's part: open circuits past their cool-down become half-open, each with one
    parked step made ready as its probe."""
    rows = list(
        await (await conn.execute(Q.half_open_due, {"worker": worker, "limit": limit})).fetchall()
    )
    if rows:
        crash_point("circuit.after_half_open")
    return rows


async def configure(
    pool: Pool,
    org_id: str,
    key: str,
    *,
    threshold: int = 5,
    window_seconds: float = 30.0,
    cooldown_seconds: float = 30.0,
    actor: str | None = None,
) -> dict[str, Any]:
    if key.partition(":")[0] not in ("connection", "provider") or not key.partition(":")[2]:
        raise InvalidInput(f"circuit key {key!r}: connection:<id> or provider:<name>")
    if threshold < 1 or window_seconds <= 0 or cooldown_seconds <= 0:
        raise InvalidInput("threshold at least 1; window and cool-down more than 0 seconds")
    wanted = {
        "threshold": threshold,
        "window_seconds": window_seconds,
        "cooldown_seconds": cooldown_seconds,
    }
    async with pool.connection() as conn, conn.transaction():
        row = await (
            await conn.execute(Q.configure, {"org_id": org_id, "key": key, **wanted})
        ).fetchone()
        assert row is not None
        await audit.record(
            conn, org_id, actor=audit.actor(actor), action="circuit_set", target=key, detail=wanted
        )
    return dict(row)


async def list_circuits(pool: Pool, org_id: str) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        return list(await (await conn.execute(Q.list, {"org_id": org_id})).fetchall())


async def not_closed_everywhere(conn: Conn, *, limit: int = 50) -> list[dict[str, Any]]:
    """Circuits not closed in any organisation (``onward doctor``)."""
    return list(await (await conn.execute(Q.open_everywhere, {"limit": limit})).fetchall())


async def not_closed(conn: Conn, org_id: str, keys: list[str]) -> list[dict[str, Any]]:
    """The circuits of ``keys`` that are not closed (open or half-open), with ``retry_at``."""
    cur = await conn.execute(Q.not_closed, {"org_id": org_id, "keys": keys})
    return list(await cur.fetchall())
