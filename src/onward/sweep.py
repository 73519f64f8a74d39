"""The due sweep (R7) and the other backstops, run by one elected process.

Every few seconds the leader:

1. fires due timers, fairly between organisations: a bounded, rotated set of organisations
   with due work, a bounded index scan per organisation, ``SKIP LOCKED``, an overall batch
   limit -- so one tenant's backlog of 200,000 timers cannot starve the others, and the cost of
   a batch does not grow with the backlog;
2. lets organisations whose future timers came due rejoin the candidate set (``rediscover``);
   then fires the due schedules that start runs, as fairly (:func:`onward.schedules.fire_due`);
3. makes steps whose lease expired ready again (their worker died or stalled);
4. ends waiting runs that outlived their maximum age (R13);
5. half-opens circuits whose cool-down passed, each with one parked step as its probe, and
   resumes the steps parked on a budget before today (their budget renewed) (R5);
6. completes erasures that waited on a run with a step in flight (R14);
7. prunes sent outbox rows, and notifications delivered a month ago (:mod:`onward.notify`);
8. deletes finished runs past their organisation's retention, a few bounded batches per tick
   (:class:`onward.retention.Pruner`).
9. continues the bulk operations whose driver died (``onward.operations``: a cancel of many
   runs, a migration), a bounded page of organisations per tick, in a task of its own so a
   long operation never delays the next tick.

The sweep fires timers; it never claims steps. Claiming is the workers' job, bounded by their
free capacity, so the sweep cannot hand out more work than the workers can start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import psycopg

from onward import (
    budgets,
    circuits,
    erasure,
    leases,
    metrics,
    notify,
    operations,
    outbox,
    retention,
    schedules,
    timers,
)
from onward.crashpoints import crash_point
from onward.db import Pool
from onward.db.sql import Queries
from onward.leader import Leadership

Q = Queries(__package__, "sweep.sql")
log = logging.getLogger("onward.sweep")


@dataclass
class SweepLimits:
    orgs: int = 20  # organisations per batch
    per_org: int = 50  # timers per organisation per batch
    batch: int = 500  # timers per batch
    max_batches: int = 20  # per tick, so a tick stays short
    rescue: int = 500
    rediscover: int = 1000
    operation_orgs: int = 20  # organisations whose stale operations one pass resumes
    operations: int = 5  # stale operations per organisation per pass


@dataclass
class SweepStats:
    ticks: int = 0
    fired: int = 0
    batches: int = 0
    rescued: int = 0
    expired: int = 0
    pruned: int = 0
    scheduled: int = 0  # runs started by schedules
    probes: int = 0  # circuits half-opened
    budget_resumed: int = 0
    erasures: int = 0  # erasures completed after their last run stopped
    retention_pruned: int = 0  # finished runs deleted (onward.retention)
    operations_resumed: int = 0
    lateness: list[float] = field(default_factory=list)


class Sweeper:
    def __init__(
        self,
        pool: Pool,
        *,
        worker_id: str,
        interval: float = 2.0,
        limits: SweepLimits | None = None,
        kick: asyncio.Event | None = None,
        retention_days: float | None = 30.0,
        prune_limits: retention.PruneLimits | None = None,
        metrics_seconds: float = 15.0,
    ) -> None:
        self.pool, self.worker_id, self.interval = pool, worker_id, interval
        self.limits = limits or SweepLimits()
        self.kick = kick  # set when work was made ready, to wake a local relay at once
        self.stats = SweepStats()
        self._rediscover_after = ""
        self._budget_after = ""
        self.leadership = Leadership(pool, "sweeper", worker_id, ttl=max(3 * interval, 5.0))
        self.pruner = retention.Pruner(pool, default_days=retention_days, limits=prune_limits)
        self._operations: asyncio.Task[None] | None = None
        self.health = metrics.HealthGauges(pool, interval=metrics_seconds)

    async def fire_batch(self) -> tuple[int, list[str]]:
        """One fair batch: returns (timers fired, organisations served)."""
        lim = self.limits
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(Q.due_candidates, {"orgs": lim.orgs})
            orgs = [r["org_id"] for r in await cur.fetchall()]
            if not orgs:
                return 0, []
            cur = await conn.execute(
                Q.claim_due, {"org_ids": orgs, "per_org": lim.per_org, "batch": lim.batch}
            )
            due = [(r["org_id"], r["timer_id"]) for r in await cur.fetchall()]
            crash_point("sweep.after_claim")
            fired = await timers.fire(conn, due, by="sweep")
            served = sorted({f["org_id"] for f in fired})
            await conn.execute(Q.mark_served, {"org_ids": orgs, "served": served})
        self.stats.lateness.extend(f["lateness_s"] for f in fired)
        metrics.timers_fired("sweep", fired)
        if len(self.stats.lateness) > 100_000:
            del self.stats.lateness[:50_000]
        crash_point("sweep.after_fire")
        return len(fired), served

    async def rediscover(self) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                Q.rediscover, {"after": self._rediscover_after, "limit": self.limits.rediscover}
            )
            row = await cur.fetchone()
        assert row is not None
        self._rediscover_after = row["last_org"] or ""  # wrap around after the last page
        return int(row["flagged"])

    async def rescue(self) -> int:
        async with self.pool.connection() as conn:
            return await leases.rescue_expired(
                conn, limit=self.limits.rescue, worker=self.worker_id
            )

    async def expire_over_age(self) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute(Q.org_page, {"after": self._budget_after, "limit": 100})
            orgs = [r["org_id"] for r in await cur.fetchall()]
            self._budget_after = orgs[-1] if orgs else ""
            if not orgs:
                return 0
            cur = await conn.execute(Q.waiting_over_age, {"org_ids": orgs, "limit": 100})
            expired = 0
            for r in await cur.fetchall():
                res = await conn.execute(
                    Q.expire_waiting_run,
                    {
                        "org_id": r["org_id"],
                        "run_id": r["run_id"],
                        "reason": "maximum age reached while waiting",
                        "worker": self.worker_id,
                    },
                )
                row = await res.fetchone()
                expired += int(row["expired"]) if row else 0
        return expired

    async def prune_outbox(self, keep_seconds: float = 3600.0, limit: int = 5000) -> int:
        """Remove sent outbox rows older than ``keep_seconds``, in a bounded batch."""
        async with self.pool.connection() as conn:
            return await outbox.prune_sent(conn, keep_seconds=keep_seconds, limit=limit)

    async def tick(self) -> int:
        """One sweep as leader. Returns the number of timers fired."""
        fired_total = 0
        await self.rediscover()
        for _ in range(self.limits.max_batches):
            fired, _served = await self.fire_batch()
            self.stats.batches += 1
            fired_total += fired
            if fired == 0:
                break
        self.stats.fired += fired_total
        self.stats.scheduled += await schedules.fire_due(self.pool)
        self.stats.rescued += (rescued := await self.rescue())
        metrics.rescued(rescued)
        self.stats.expired += (expired := await self.expire_over_age())
        metrics.run_finished("exceeded", expired)
        resumed = await self.flow_control()
        self.stats.erasures += await erasure.finish_pending(self.pool)
        await self.resume_operations()
        if self.stats.ticks % 100 == 0:
            self.stats.pruned += await self.prune_outbox()
            async with self.pool.connection() as conn:
                self.stats.pruned += await notify.prune_delivered(conn)
        self.stats.retention_pruned += await self.pruner.tick()
        self.stats.ticks += 1
        if (fired_total or resumed) and self.kick is not None:
            self.kick.set()
        return fired_total

    async def flow_control(self) -> int:
        """Circuits past their cool-down become half-open (one probe each); steps parked on a
        circuit that closed before their park committed resume; steps parked on a budget
        before today, or whose call fits in their budget's room now, resume. Returns how many
        steps were made ready."""
        async with self.pool.connection() as conn:
            probes = await circuits.half_open_due(conn, worker=self.worker_id)
            stranded = await circuits.resume_stranded(conn, worker=self.worker_id)
            renewed = await budgets.resume_parked(
                conn, None, worker=self.worker_id, reason="a new day", renewed_only=True
            )
            renewed += await budgets.resume_with_room(conn, worker=self.worker_id)
        self.stats.probes += len(probes)
        self.stats.budget_resumed += renewed
        return sum(1 for p in probes if p["probe_run_id"]) + stranded + renewed

    async def resume_operations(self) -> None:
        """Continue the operations whose driver died, in a task (one pass at a time), so a long
        operation never delays the next tick."""
        if self._operations is not None and not self._operations.done():
            return
        orgs = await operations.stale_orgs(self.pool, limit=self.limits.operation_orgs)
        if orgs:
            self._operations = asyncio.create_task(self._resume_operations(orgs))

    async def _resume_operations(self, orgs: list[str]) -> None:
        try:
            for org in orgs:
                done = await operations.resume_stale(self.pool, org, limit=self.limits.operations)
                self.stats.operations_resumed += len(done)
        except (psycopg.OperationalError, OSError) as exc:
            log.warning("sweep: resuming operations failed (%s); next tick", exc)
        except Exception:
            log.exception("sweep: resuming operations failed")

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    leads = await self.leadership.try_lead()
                    self.health.leading(leads)
                    if leads:
                        await self.tick()
                except (psycopg.OperationalError, OSError) as exc:
                    log.warning("sweep: database unavailable (%s); retrying", exc)
                await outbox.sleep_or(stop, self.interval)
        finally:
            await self.health.close()
            if self._operations is not None:
                self._operations.cancel()
                await asyncio.gather(self._operations, return_exceptions=True)
            with contextlib.suppress(psycopg.OperationalError, OSError):
                await self.leadership.resign()
