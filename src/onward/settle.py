"""Writing a step's transition: each one fenced statement, advances grouped into one commit.

:class:`Settler` writes whatever :mod:`onward.policy` decided for a claimed step, through the
lease holder's fenced statements in :mod:`onward.leases` (``WHERE attempt = token AND status =
'running'``): a worker whose lease was taken over writes nothing and learns it (``False`` /
``None``).

:class:`SettleBatcher` groups the advances of concurrent chains (independent runs) into one
statement: one commit for many steps. A chain hands over its settle and awaits its own row; the
batcher flushes whatever is pending at once (after one turn of the event loop, so chains ready
in the same turn join), with at most ``inflight`` statements running. Under load the pending
list grows while statements run, so batches grow by themselves; an idle worker settles a single
step with no added wait. Each row is fenced on its own; a failed statement fails every chain in
it, and each then treats its outcome as unknown, which the fence makes safe -- except a
statement the database chose as a deadlock's victim (its batch and another transaction's, a
migration's or a heartbeat's, waiting on each other's steps): it rolled back whole, so it is
sent again at once (``db.repeat_rolled_back``) instead of leaving its steps to their leases.
"""

from __future__ import annotations

import asyncio
from typing import Any

from onward import approvals, connections, leases, metrics, signals
from onward.crashpoints import crash_point
from onward.db import Conn, Pool, repeat_rolled_back
from onward.leases import AdvanceSettle, Token
from onward.policy import Defer, Proceed, Retry, Stop, WaitTimer

_Pending = tuple[AdvanceSettle, "asyncio.Future[dict[str, Any] | None]"]


class SettleBatcher:
    """One statement (``leases.settle_advance_many``) for the advances of many chains."""

    def __init__(
        self, pool: Pool, worker: str, lease: float, *, max_batch: int = 64, inflight: int = 4
    ) -> None:
        self.pool, self.worker, self.lease = pool, worker, lease
        self.max_batch = max_batch
        self._sem = asyncio.Semaphore(inflight)
        self._pending: list[_Pending] = []
        self._kick = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        self.statements = 0

    async def settle(self, item: AdvanceSettle) -> dict[str, Any] | None:
        """Settle one advance; returns its run row, or None when its lease was lost."""
        return await self.submit(item)

    def submit(self, item: AdvanceSettle) -> asyncio.Future[dict[str, Any] | None]:
        """Hand one advance to the next batch; the future answers as ``settle`` does (awaited
        directly, a step's settle costs no coroutine of its own)."""
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._loop())
        fut: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        self._kick.set()
        return fut

    async def _loop(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            await asyncio.sleep(0)  # chains that finished in this turn join the batch
            while self._pending:
                await self._sem.acquire()
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                task = asyncio.create_task(self._flush(batch))
                self._flushes.add(task)
                task.add_done_callback(self._flushes.discard)

    async def _flush(self, batch: list[_Pending]) -> None:
        items = [item for item, _ in batch]
        try:
            async with self.pool.connection() as conn:
                rows = await repeat_rolled_back(
                    lambda: leases.settle_advance_many(
                        conn, items, worker=self.worker, lease=self.lease
                    )
                )
            self.statements += 1
        except BaseException as exc:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            for item, fut in batch:
                if not fut.done():
                    fut.set_result(rows.get((item.token.org_id, item.token.run_id)))
        finally:
            self._sem.release()

    async def close(self) -> None:
        if self._flushes:
            await asyncio.wait(set(self._flushes), timeout=5.0)
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)


class Settler:
    """Writes the policy's transitions for the steps this worker holds."""

    def __init__(self, pool: Pool, worker: str, lease: float) -> None:
        self.pool, self.worker, self.lease = pool, worker, lease
        self.batcher = SettleBatcher(pool, worker, lease)

    async def stop(self, token: Token, t: Stop) -> bool:
        async with self.pool.connection() as conn:
            if t.step_status != "parked":
                return await self._stop(conn, token, t)
            async with conn.transaction():
                if await self._cancelled_instead(conn, token, f"park:{t.wait_kind}"):
                    return True
                connection = (
                    (t.error or {}).get("connection") if t.wait_kind == "reconnect" else None
                )
                if connection and await connections.usable_for_park(
                    conn, token.org_id, connection
                ):  # restored while this step failed: go on at once instead of parking
                    return await leases.settle_defer(
                        conn,
                        token,
                        worker=self.worker,
                        delay=0.0,
                        detail={"why": "connection restored", "connection": connection},
                    )
                return await self._stop(conn, token, t)

    async def _stop(self, conn: Conn, token: Token, t: Stop) -> bool:
        return await leases.settle_stop(
            conn,
            token,
            worker=self.worker,
            step_status=t.step_status,
            run_status=t.run_status,
            reason=t.reason,
            error=t.error,
            wait_kind=t.wait_kind,
        )

    async def retry(self, token: Token, t: Retry) -> bool:
        async with self.pool.connection() as conn, conn.transaction():
            if await self._cancelled_instead(conn, token, "retry"):
                return True
            return await leases.settle_retry(
                conn, token, worker=self.worker, delay=t.delay, error=t.error, retry_at=t.retry_at
            )

    async def defer(self, token: Token, t: Defer) -> bool:
        async with self.pool.connection() as conn, conn.transaction():
            if await self._cancelled_instead(conn, token, "defer"):
                return True
            return await leases.settle_defer(
                conn, token, worker=self.worker, delay=t.delay, detail=t.detail
            )

    async def _cancelled_instead(self, conn: Conn, token: Token, instead_of: str) -> bool:
        """A step that would wait, retry, be deferred or park while its run was asked to cancel
        ends cancelled instead (R12): a cancel that came while it ran must not wait for a timer
        or a person. The run's transition lock first, the lock a cancel takes, so the check
        sees a cancel committed before it and a later cancel finds the step settled."""
        await signals.lock_run(conn, token.org_id, token.run_id)
        cancelled = await leases.settle_cancel_requested(
            conn, token, worker=self.worker, instead_of=instead_of
        )
        metrics.run_finished("cancelled", int(cancelled))
        return cancelled

    async def wait(self, token: Token, t: WaitTimer) -> bool:
        """The step waits (on a timer, on signals, on a person). One transaction with the run's
        transition lock taken first, so a signal stored (a decision made, a cancel requested)
        before it is seen here -- the signal wakes the step at once, the cancel ends it -- and
        one after it is applied by its own intake (``signals``, ``approvals``, ``cancel``),
        which locks the run the same way."""
        async with self.pool.connection() as conn, conn.transaction():
            if await self._cancelled_instead(conn, token, f"wait:{t.wait_kind}"):
                return True
            row = await self._wait(conn, token, t)
            if row is not None and t.wait_kind == "signal":
                await signals.consume(conn, token.org_id, token.run_id, worker=self.worker)
            elif row is not None and t.wait_kind == "approval":
                await approvals.wake_if_decided(
                    conn, token.org_id, token.run_id, token.seq, worker=self.worker
                )
        crash_point("worker.after_wait")
        return row is not None

    async def _wait(self, conn: Conn, token: Token, t: WaitTimer) -> dict[str, Any] | None:
        return await leases.settle_wait_timer(
            conn,
            token,
            worker=self.worker,
            due_in=t.due_in,
            intent=t.intent,
            due_at=t.due_at,
            wait_kind=t.wait_kind,
            signals=t.signals,
        )

    async def proceed(
        self, token: Token, t: Proceed, *, eager: bool, lease: float | None = None
    ) -> dict[str, Any] | None:
        """Done + enter the next step (claimed by this worker when ``eager``) or complete the
        run, grouped with other chains' advances. Returns the run row, None if the lease was
        lost."""
        row = await self.batcher.submit(
            AdvanceSettle(
                token,
                t.output,
                t.vars,
                t.next_step,
                eager and t.next_step is not None,
                detail={"skipped": t.skipped} if t.skipped else None,
                skipped=t.skipped is not None,
                lease=lease,
                keep_output=t.keep_output,
            )
        )
        crash_point("worker.after_settle")
        return row

    async def close(self) -> None:
        await self.batcher.close()
