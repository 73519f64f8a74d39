"""The outbox relay (R2): publishes unsent outbox rows as wakes, then marks them sent.

Rows are written by the transition they announce, in its transaction, so a committed
transition always has its wake recorded. The relay takes a batch with ``FOR UPDATE SKIP
LOCKED`` (several relays share the work), publishes each row under its ``job_id``, and marks the
batch sent in the same transaction. If it dies after publishing and before the commit, the rows
stay unsent and are published again: the queue drops the repeat while it retains the job id,
and otherwise the consumer's claim or fire finds nothing left to do.

With the PostgreSQL queue the NOTIFY is issued on the relay's own connection, inside that
transaction, so publishing and marking sent commit together (NOTIFY is transactional).

Timer wakes with the PostgreSQL queue: the outbox keeps a delayed wake until it is due, so the
relay that takes it at its instant fires the timer itself (``timers.fire(by='wake')``) in the
same transaction, instead of a NOTIFY that every listener hears and then fires through a
second statement: one transaction per batch, no broadcast, and each wake taken by one relay
(``SKIP LOCKED``). The woken steps' own wakes are rows of that transaction, published at once
by the relay's next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import psycopg

from onward import metrics, timers
from onward.crashpoints import crash_point
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.queue.base import Queue, Wake

Q = Queries(__package__, "outbox.sql")
log = logging.getLogger("onward.relay")

DELAY_HORIZON_S = 366 * 86400.0
# the shortest sleep of a relay waiting for the next delayed row (queue without delays): in a
# burst of timers due every few milliseconds it publishes them in batches of ~this long, not
# one by one
MIN_WAIT_S = 0.01


class Relay:
    def __init__(
        self,
        pool: Pool,
        queue: Queue,
        *,
        batch: int = 1000,
        poll_seconds: float = 0.1,
        kick: asyncio.Event | None = None,
        fire_batch: int = 500,
        rounds: int = 1,
    ) -> None:
        self.pool, self.queue = pool, queue
        # with the PostgreSQL queue a round fires the timers it takes, and every timer due while
        # the round runs waits for the next one: at most fire_batch rows a round
        self.batch = min(batch, fire_batch) if queue.name == "postgres" else batch
        # ... and a round that fires runs beside the next: up to this many rounds in flight
        self.rounds = max(1, rounds) if queue.name == "postgres" else 1
        self.poll_seconds = poll_seconds
        self.kick = kick or asyncio.Event()
        self.published = 0

    async def run_once(self) -> int:
        """Publish one batch (with the PostgreSQL queue, its timer wakes fired here); returns
        how many rows it took."""
        horizon = DELAY_HORIZON_S if self.queue.supports_delay else 0.0
        async with self.pool.connection() as conn, conn.transaction():
            # after BEGIN, whose instant is the take's now(): each row's delay_s counts from
            # there, so the time from here to the publish comes off it (below) -- never more,
            # so a wake is never early
            began = time.monotonic()
            cur = await conn.execute(Q.take_unsent, {"horizon": horizon, "limit": self.batch})
            rows = await cur.fetchall()
            if not rows:
                return 0
            fires = self.queue.name == "postgres"  # see the module's docstring
            due = [r for r in rows if fires and _timer_id(r) is not None]
            if due:
                fired = await timers.fire(
                    conn,
                    [
                        (r["org_id"], r["payload"]["timer_id"], r["payload"].get("wake_n"))
                        for r in due
                    ],
                    by="wake",
                )
            # a delayed wake due at deliver_at leaves with what remains of its delay now: a
            # round slowed by a busy process (or a batch of timers fired above) would otherwise
            # make every wake of it that much late
            spent = time.monotonic() - began
            wakes = [
                Wake(
                    job_id=r["job_id"],
                    topic=r["topic"],
                    lane=r["lane"],
                    org_id=r["org_id"],
                    payload=r["payload"],
                    delay_s=max(0.0, r["delay_s"] - spent) if r["delay_s"] else 0.0,
                )
                for r in rows
                if not (fires and _timer_id(r) is not None)
            ]
            publish_tx = getattr(self.queue, "publish_tx", None)
            if publish_tx is not None:
                await publish_tx(conn, wakes)
            else:
                await self.queue.publish(wakes)
            crash_point("relay.after_publish")
            await conn.execute(
                Q.mark_sent,
                {
                    "org_ids": [r["org_id"] for r in rows],
                    "outbox_ids": [r["outbox_id"] for r in rows],
                },
            )
        self.published += len(rows)
        metrics.published(len(rows))
        if due:
            metrics.timers_fired("wake", fired)
            if fired:
                self.kick.set()  # the woken steps' wakes: publish them at once
        return len(rows)

    async def run(self, stop: asyncio.Event) -> None:
        """Publish rounds until ``stop``. A round that took a full batch is followed at once;
        otherwise the next waits for a kick, the next delayed row's instant or the poll
        interval. With the PostgreSQL queue up to ``rounds`` rounds are in flight: a round
        firing a batch of timers takes tens of milliseconds under load, and a timer due
        meanwhile is taken by the next round (``SKIP LOCKED`` keeps their rows apart) instead
        of waiting for it to commit."""
        slots = asyncio.Semaphore(self.rounds)
        more = asyncio.Event()  # a round took a full batch: there may be more now
        flying: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                self.kick.clear()  # before the round: a kick during it is not lost
                more.clear()
                await slots.acquire()
                task = asyncio.create_task(self._round(stop, slots, more))
                flying.add(task)
                task.add_done_callback(flying.discard)
                if self.rounds == 1:
                    await task
                    if more.is_set():
                        continue
                await sleep_or(stop, await self._wait(), self.kick, more)
        except BaseException:
            for task in flying:  # cancelled: so are the rounds (their rows stay unsent)
                task.cancel()
            raise
        finally:
            if flying:
                await asyncio.wait(set(flying))

    async def _round(
        self, stop: asyncio.Event, slots: asyncio.Semaphore, more: asyncio.Event
    ) -> None:
        try:
            n = await self.run_once()
        except (psycopg.OperationalError, OSError, ConnectionError) as exc:
            log.warning("relay: publish failed (%s); rows stay unsent and are retried", exc)
            await sleep_or(stop, 1.0)
            return
        except Exception:
            # Anything else must not end the relay silently (R16): log it, keep the rows
            # unsent, and try again; doctor's stale_outbox check shows a relay that is stuck.
            log.exception("relay: unexpected error; rows stay unsent and are retried")
            await sleep_or(stop, 1.0)
            return
        finally:
            slots.release()
        if n >= self.batch:
            more.set()

    async def _wait(self) -> float:
        """How long to sleep: the poll interval, or -- with a queue that keeps no delayed jobs,
        whose delayed wakes wait here in the outbox -- until the next of them is due, if sooner
        (at least ``MIN_WAIT_S``)."""
        if self.queue.supports_delay:
            return self.poll_seconds
        try:
            async with self.pool.connection() as conn:
                row = await (await conn.execute(Q.next_due)).fetchone()
        except (psycopg.OperationalError, OSError):
            return self.poll_seconds
        wait_s = row["wait_s"] if row else None
        if wait_s is None:
            return self.poll_seconds
        return min(self.poll_seconds, max(MIN_WAIT_S, float(wait_s)))


def _timer_id(row: dict[str, Any]) -> int | None:
    """The timer a ``timer`` wake row names (None: not a timer wake, or a malformed one, which
    is published as it is and fires nothing)."""
    timer_id = (row["payload"] or {}).get("timer_id") if row["topic"] == "timer" else None
    return timer_id if isinstance(timer_id, int) else None


async def prune_sent(conn: Conn, *, keep_seconds: float, limit: int) -> int:
    """Remove sent rows older than ``keep_seconds``, at most ``limit``; returns how many."""
    cur = await conn.execute(Q.prune_sent, {"keep": keep_seconds, "limit": limit})
    return cur.rowcount or 0


async def sleep_or(stop: asyncio.Event, seconds: float, *events: asyncio.Event) -> None:
    """Sleep up to ``seconds``, returning early when ``stop`` or any event is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in (stop, *events)]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await w
