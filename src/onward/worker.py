"""The worker: claims steps lane by lane, runs their kinds, and settles them, fenced (R3).

It is one of three parts: this lane scheduler (capacity, claims, heartbeats, eager chains,
shutdown); the pure outcome policy (``onward.policy``: what a step's outcome means for its run);
and the settler with its batcher (``onward.settle``: the fenced statements that write it, the
advances of concurrent chains grouped into one commit).

Lanes: each lane has a policy (``onward.lanes``): a capacity (how many of its steps run at
once), a lease length and a retry policy. A lane loop claims only as many steps as it has free
slots -- backpressure: a claimed step never waits for a worker
while its lease runs out -- and claims again when a slot frees, when a wake arrives, or every
``poll_seconds`` (the backstop when wakes are lost or the queue is off).

Heartbeats: one statement extends every lease this worker holds. A step whose lease was taken
over is missing from the answer; its handler is cancelled and nothing it produced is written.

Eager continuation: when a step is done and the next step is in a lane this worker serves with
a free slot, the settle statement inserts the next step already claimed by this worker, which
then runs it at once: one commit per step and no wake-up. If the worker dies, that claim's lease
lapses and the sweep hands the step to another worker.

Graceful shutdown (SIGTERM): stop claiming, let running steps finish within the grace period,
then cancel the rest and release them with ``lease_until = now()`` so another worker claims
them at once.

Seeing a step: while a step runs, its org, run, step id, seq, attempt and this worker's id are
bound to every log line (``onward.logs.step_context``), and with OpenTelemetry installed its
kind runs inside a span of its run's trace (``onward.tracing.step_span``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pydantic import ValidationError

from onward import lanes as lane_policies
from onward import leases, logs, metrics, policy, timers, tracing
from onward.automations import cel
from onward.automations.document import AutomationDoc, StepDef
from onward.automations.versions import VersionCache
from onward.config import Settings
from onward.crashpoints import crash_point
from onward.db import Pool
from onward.durations import parse_duration
from onward.errors import LeaseLost, UnknownAutomation
from onward.kinds import KindSpec, Registry, StepContext
from onward.leases import Token
from onward.outbox import sleep_or
from onward.queue.base import Queue, Wake
from onward.settle import Settler

log = logging.getLogger("onward.worker")


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"


#: a lane with free slots and no ready step known to wait claims again when a chain ends, at
#: most this often (``Worker.more``)
CLAIM_POLL_SECONDS = 0.01


class _LeaseLostError(Exception):
    pass


@dataclass
class _Held:
    token: Token
    lane: str
    lease: float
    lease_lost: asyncio.Event = field(default_factory=asyncio.Event)
    #: the task running the step's kind, while it does (``Worker._call``): a lost lease
    #: cancels it, the way ``asyncio.timeout`` cancels -- no extra task or future a step
    calling: asyncio.Task[Any] | None = None
    cancelled: bool = False

    def lose(self) -> None:
        """The heartbeat found the lease gone: tell the kind, and stop its call."""
        self.lease_lost.set()
        if self.calling is not None and not self.cancelled:
            self.cancelled = True
            self.calling.cancel()


@dataclass
class WorkerStats:
    claims: int = 0  # claim statements sent
    claimed: int = 0
    settled: int = 0
    eager: int = 0
    lost: int = 0
    retried: int = 0
    deferred: int = 0
    released: int = 0


class Worker:
    def __init__(
        self,
        pool: Pool,
        queue: Queue,
        *,
        settings: Settings,
        registry: Registry,
        versions: VersionCache | None = None,
        worker_id: str | None = None,
        lanes: dict[str, int] | None = None,
        eager: bool = True,
        claim_batch: int = 32,
        integrations: Any = None,
    ) -> None:
        self.pool, self.queue, self.settings, self.registry = pool, queue, settings, registry
        self.versions = versions or VersionCache(pool)
        self.id = worker_id or new_worker_id()
        self.policies = lane_policies.policies(
            dict(lanes or settings.lanes),
            settings.lane_policy,
            lease_seconds=settings.lease_seconds,
        )
        self.capacity = {lane: p.capacity for lane, p in self.policies.items()}
        self.eager = eager
        self.claim_batch = claim_batch
        self.integrations = integrations
        self.running = dict.fromkeys(self.capacity, 0)
        self.kick = {lane: asyncio.Event() for lane in self.capacity}
        # A chain that ends (a slot freed) sends its lane loop to claim again when ready steps
        # may be waiting that the loop has not taken -- its last claim filled all it asked
        # for, or a wake came while every slot was busy (``more``) -- and otherwise at most
        # every ``claim_poll_seconds``. New ready steps come with their own wake (their outbox
        # row, published by a relay's next round; the poll is the backstop), so a claim at
        # every chain's end mostly found the few steps started since: under live load, about
        # 13 a claim and 800-900 claims for 10,000 runs. Not at all: 158-175 claims, live
        # 9,887-10,263 steps/s, but a run started meanwhile waits for the relay's round (p50
        # 60-74 ms from start to completion). Every 10 ms: 356-370 claims, 9,440-9,934 steps/s,
        # p50 35-36 ms, p99 71-78 ms (alternated runs of 2026-12-07; at every chain's end,
        # 8,400-9,000 steps/s, p50 26-31 ms).
        self.more = dict.fromkeys(self.capacity, True)
        self.claimed_at = dict.fromkeys(self.capacity, 0.0)
        self.claim_poll_seconds = CLAIM_POLL_SECONDS
        self.held: dict[tuple[str, str, int], _Held] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.stats = WorkerStats()
        self._stopping = False
        # timer wakes to fire: (org_id, timer_id, wake_n, lane)
        self._timer_inbox: asyncio.Queue[tuple[str, int, int | None, str]] = asyncio.Queue()
        #: per (org, automation, version): the outputs its expressions read (versions are
        #: immutable, so this never goes stale)
        self._reads: dict[tuple[str, str, int], frozenset[str] | None] = {}
        self._params_cache: dict[tuple[str, str, int, str], Any] = {}
        #: per (org, automation, version, step id): the version, its step and the step's
        #: timeout in seconds -- one lookup a step instead of the version cache's coroutine, the
        #: document's step search and the duration's parse (versions are immutable)
        self._steps: dict[tuple[str, str, int, str], tuple[AutomationDoc, StepDef, float | None]]
        self._steps = {}
        self.settler = Settler(pool, self.id, settings.lease_seconds)
        cel.load()  # once, here: not in the first step's time

    # -- wakes ---------------------------------------------------------------------------
    def on_wake(self, wake: Wake) -> None:
        if wake.topic == "timer":
            timer_id, wake_n = wake.payload.get("timer_id"), wake.payload.get("wake_n")
            if isinstance(timer_id, int):
                # the wake number: a wake of a timer recomputed since does nothing
                self._timer_inbox.put_nowait(
                    (wake.org_id, timer_id, wake_n if isinstance(wake_n, int) else None, wake.lane)
                )
        elif wake.lane in self.kick:
            self.kick[wake.lane].set()

    def on_reconnect(self) -> None:
        for ev in self.kick.values():
            ev.set()

    async def _fire_timers(self, stop: asyncio.Event) -> None:
        """Fast path of timers: fire on the delayed wake (idempotent with the sweep), as soon
        as wakes arrive -- whatever has arrived, up to ``timer_fire_batch`` timers a statement,
        with up to ``timer_fire_concurrency`` statements in flight, so a wake never waits for
        a batch to fill nor long behind a big one."""
        slots = asyncio.Semaphore(self.settings.timer_fire_concurrency)
        firing: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                first = await self._timer_inbox.get()
                await slots.acquire()
                batch = [first]
                while not self._timer_inbox.empty() and len(batch) < self.settings.timer_fire_batch:
                    batch.append(self._timer_inbox.get_nowait())
                task = asyncio.create_task(self._fire_batch(batch, slots))
                firing.add(task)
                task.add_done_callback(firing.discard)
        finally:
            # a fire in flight may have claimed steps for this worker: let it hand them over
            if firing:
                await asyncio.wait(set(firing))

    async def _fire_batch(
        self, batch: list[tuple[str, int, int | None, str]], slots: asyncio.Semaphore
    ) -> None:
        """Fire one batch of timer wakes. Eager: the free slots of the lanes the wakes name are
        held for the fire, which claims up to that many of the woken steps for this worker
        (``timers.Eager``); they run at once, as an eager chain's successor does."""
        want: dict[str, int] = {}
        for *_, lane in batch:
            want[lane] = want.get(lane, 0) + 1
        held: dict[str, int] = {}
        if self.eager and not self._stopping:
            for lane, n in want.items():
                if lane in self.capacity:
                    held[lane] = max(0, min(n, self.capacity[lane] - self.running[lane]))
                    self.running[lane] += held[lane]
        eager = (
            timers.Eager(self.id, held, {lane: self._lease(lane) for lane in held})
            if any(held.values())
            else None
        )
        try:
            async with self.pool.connection() as conn:
                fired = await timers.fire(conn, [b[:3] for b in batch], by="wake", eager=eager)
        except (psycopg.OperationalError, OSError) as exc:
            log.warning("firing timers on wake failed (%s); the sweep will fire them", exc)
            return
        finally:
            for lane, n in held.items():
                self.running[lane] -= n
            slots.release()
        crash_point("timer.after_fire")
        metrics.timers_fired("wake", fired)
        claims = [f["claim"] for f in fired if f["claim"] is not None]
        self.stats.claimed += len(claims)
        metrics.claimed(claims)
        for claim in claims:
            self._spawn(claim)
        for f in fired:
            if f["claim"] is None and f["lane"] in self.kick:
                self.kick[f["lane"]].set()

    # -- the lane loops ------------------------------------------------------------------
    async def _lane_loop(self, lane: str, stop: asyncio.Event) -> None:
        cap = self.capacity[lane]
        while not stop.is_set():
            self.kick[lane].clear()
            free = cap - self.running[lane]
            if free <= 0:  # woken (or polled) with every slot busy: a slot freed claims
                self.more[lane] = True
            else:
                want = min(free, self.claim_batch)
                try:
                    async with self.pool.connection() as conn:
                        rows = await leases.claim(
                            conn, lane, want, self.id, self.policies[lane].lease_seconds
                        )
                except (psycopg.OperationalError, OSError) as exc:
                    log.warning("claim in lane %s failed (%s); retrying", lane, exc)
                    await sleep_or(stop, 1.0)
                    continue
                claimed = len(rows)
                self.more[lane] = claimed == want
                self.claimed_at[lane] = time.monotonic()
                self.stats.claims += 1
                self.stats.claimed += claimed
                metrics.claimed(rows)
                for row in rows:
                    self._spawn(row)
                if claimed == want and self.running[lane] < cap:
                    continue  # there may be more ready work: claim again at once
            await sleep_or(stop, self.settings.poll_seconds, self.kick[lane])

    def _spawn(self, row: dict[str, Any]) -> None:
        lane = row["lane"]
        self.running[lane] = self.running.get(lane, 0) + 1
        token = Token(row["org_id"], row["run_id"], row["seq"], row["attempt"])
        self.held[token.key] = _Held(token, lane, self._lease(lane))
        task = asyncio.create_task(self._run_chain(row), name=f"step {token.run_id}#{token.seq}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run_chain(self, row: dict[str, Any] | None) -> None:
        """Run a claimed step and, eagerly, the steps after it that this worker claimed."""
        while row is not None:
            lane = row["lane"]
            token = Token(row["org_id"], row["run_id"], row["seq"], row["attempt"])
            began = time.perf_counter()
            bound = logs.step_context(
                token.org_id, token.run_id, row["step_id"], token.seq, token.attempt, self.id
            )
            try:
                row = await self._execute(row, token)
            except (psycopg.OperationalError, OSError) as exc:
                # The outcome of the settle is unknown to us; the fence makes either case safe:
                # if it committed, the step moved on; if not, the lease lapses and it is retried.
                log.warning(
                    "step %s#%s: database error %s; leaving it to its lease",
                    token.run_id,
                    token.seq,
                    exc,
                )
                row = None
            except Exception as exc:  # a bug outside the handler: never loop on it
                log.exception("step %s#%s: engine error", token.run_id, token.seq)
                row = None
                with contextlib.suppress(Exception):
                    await self._write(token, policy.engine_error(exc))
            finally:
                metrics.step_timed(lane, time.perf_counter() - began)
                logs.unbind(bound)
                self.held.pop(token.key, None)
                self.running[lane] -= 1
                if lane in self.kick and (
                    self.more[lane]
                    or time.monotonic() - self.claimed_at[lane] >= self.claim_poll_seconds
                ):
                    self.kick[lane].set()
            if row is not None:  # eager: already counted in its lane by _execute
                self.held[(row["org_id"], row["run_id"], row["seq"])] = _Held(
                    Token(row["org_id"], row["run_id"], row["seq"], row["attempt"]),
                    row["lane"],
                    self._lease(row["lane"]),
                )

    def _lease(self, lane: str) -> float:
        policy_ = self.policies.get(lane)
        return policy_.lease_seconds if policy_ else self.settings.lease_seconds

    def _retry(self, lane: str) -> Any:
        policy_ = self.policies.get(lane)
        return policy_.retry if policy_ else lane_policies.NEW_LANE.retry

    # -- running one step ------------------------------------------------------------------
    def _params(
        self, doc: AutomationDoc, row: dict[str, Any], step: StepDef, spec: KindSpec
    ) -> Any:
        key = (row["org_id"], row["automation_id"], row["version"], step.id)
        if key not in self._params_cache:
            self._params_cache[key] = spec.parse_params(step.params)
        return self._params_cache[key]

    async def _write(
        self, token: Token, t: policy.Stop | policy.Retry | policy.Defer | policy.WaitTimer
    ) -> None:
        """Write a transition that ends this chain (anything but an advance)."""
        if isinstance(t, policy.Stop):
            ok = await self.settler.stop(token, t)
            outcome = t.step_status
            if ok and t.run_status != "parked":
                metrics.run_finished(t.run_status)
        elif isinstance(t, policy.Retry):
            ok = await self.settler.retry(token, t)
            self.stats.retried += int(ok)
            outcome = "retried"
        elif isinstance(t, policy.Defer):
            ok = await self.settler.defer(token, t)
            self.stats.deferred += int(ok)
            outcome = "deferred"
        else:
            ok = await self.settler.wait(token, t)
            outcome = "waiting"
        self._count_settle(token, outcome, ok)

    def _count_settle(self, token: Token, outcome: str, ok: bool) -> None:
        if ok:
            self.stats.settled += 1
        else:
            self.stats.lost += 1
            log.info(
                "step %s#%s: settle refused, attempt %s is stale", *token.key[1:], token.attempt
            )
        held = self.held.get(token.key)
        metrics.step_settled(held.lane if held else "unknown", outcome, ok)

    async def _execute(self, row: dict[str, Any], token: Token) -> dict[str, Any] | None:
        """Run one claimed step and write its transition; returns the eagerly claimed next
        step's row, if any."""
        crash_point("worker.after_claim")
        stop = policy.at_claim(row)
        reconcile_only = stop is not None and await self._unsettled_effect(row, token)
        if stop is not None and not reconcile_only:
            await self._write(token, stop)
            return None
        key = (row["org_id"], row["automation_id"], row["version"], row["step_id"])
        known = self._steps.get(key)
        if known is None:
            try:
                doc = await self.versions.get(row["org_id"], row["automation_id"], row["version"])
                step = doc.step(row["step_id"])
            except (UnknownAutomation, KeyError):
                await self._write(token, policy.step_not_in_version(row["step_id"]))
                return None
            if len(self._steps) > 10_000:
                self._steps.clear()
            timeout = parse_duration(step.timeout) if step.timeout is not None else None
            known = self._steps[key] = (doc, step, timeout)
        doc, step, timeout = known
        skipped = policy.skipped_by_operator(row["wake"])
        if skipped is not None:  # a person chose "skip": the kind does not run
            return await self._after_result(row, token, step, doc, skipped)
        spec = self.registry.get(row["kind"])
        if spec is None:
            await self._write(token, policy.kind_not_registered(row["kind"], self.id))
            return None
        try:
            params = self._params(doc, row, step, spec)
        except ValidationError as exc:
            problems = "; ".join(
                ".".join(str(p) for p in e["loc"]) + ": " + e["msg"] for e in exc.errors()
            )
            await self._write(token, policy.params_do_not_fit(step.id, row["kind"], problems))
            return None
        held = self.held.get(token.key)
        lease_lost = held.lease_lost if held else asyncio.Event()
        if lease_lost.is_set():  # lost before the kind was called
            self.stats.lost += 1
            metrics.lease_lost(row["lane"])
            return None
        ctx = StepContext(
            org_id=row["org_id"],
            run_id=row["run_id"],
            seq=row["seq"],
            step_id=step.id,
            kind=row["kind"],
            lane=row["lane"],
            iteration=row["iteration"],
            attempt=row["attempt"],
            worker=self.id,
            params=params,
            input=row["input"] or {},
            vars=dict((row["ctx"] or {}).get("vars") or {}),
            steps=dict((row["ctx"] or {}).get("steps") or {}),
            wake=row["wake"],
            definition=step,
            lease_lost=lease_lost,
            integrations=self.integrations,
            now=row.get("db_now"),
            automation=doc,
        )
        log.debug("step %s (%s) running", step.id, row["kind"])
        try:
            with tracing.step_span(
                org_id=token.org_id,
                run_id=token.run_id,
                seq=token.seq,
                step_id=step.id,
                kind=row["kind"],
                lane=row["lane"],
                attempt=token.attempt,
                worker=self.id,
                traceparent=row.get("traceparent"),
            ):
                result = await self._call(spec, ctx, held, timeout)
        except (_LeaseLostError, LeaseLost):  # LeaseLost: a fenced write inside the kind
            self.stats.lost += 1
            metrics.lease_lost(row["lane"])
            log.info("step %s#%s: lease lost; its result is dropped", token.run_id, token.seq)
            return None
        except Exception as exc:
            if stop is not None:  # reconciled (or parked for review); the run ends cancelled
                await self._write(token, stop)
                return None
            crash_point("worker.before_settle_error")
            retry = step.retry or spec.retry or self._retry(row["lane"])
            await self._write(
                token,
                policy.after_error(
                    exc, step_id=step.id, failures=row.get("failures") or 0, retry=retry
                ),
            )
            return None
        crash_point("worker.before_settle")
        if stop is not None:
            await self._write(token, stop)
            return None
        # as _after_result, inline: one coroutine less a step
        t = self._decide(row, step, doc, result)
        if not isinstance(t, policy.Proceed):
            await self._write(token, t)
            return None
        return await self._proceed(row, token, step, t)

    def _decide(
        self, row: dict[str, Any], step: StepDef, doc: AutomationDoc, result: Any
    ) -> policy.Proceed | policy.WaitTimer | policy.Stop:
        """What the kind's answer means for the run (``policy.after_result``)."""
        key = (row["org_id"], row["automation_id"], row["version"])
        if key not in self._reads:
            if len(self._reads) > 10_000:
                self._reads.clear()
            self._reads[key] = policy.outputs_read(doc, self.registry)
        return policy.after_result(
            result,
            step=step,
            doc=doc,
            registry=self.registry,
            visits=row["visits"],
            reads=self._reads[key],
        )

    async def _after_result(
        self, row: dict[str, Any], token: Token, step: StepDef, doc: AutomationDoc, result: Any
    ) -> dict[str, Any] | None:
        t = self._decide(row, step, doc, result)
        if not isinstance(t, policy.Proceed):
            await self._write(token, t)
            return None
        return await self._proceed(row, token, step, t)

    async def _unsettled_effect(self, row: dict[str, Any], token: Token) -> bool:
        """A cancelled run's step whose earlier attempt left an effect unsettled (its worker
        died mid-call) runs its kind once more, only to reconcile it: the effect claim reads
        the cancel, so the provider is searched, never called again, and then the step ends
        cancelled. Asked only when the claim says the run is cancelled."""
        effects = getattr(self.integrations, "effects", None)
        if not row.get("cancel_requested") or effects is None or row.get("attempt", 1) <= 1:
            return False
        return bool(await effects.unsettled(token.org_id, token.run_id, token.seq))

    async def _call(
        self, spec: KindSpec, ctx: StepContext, held: _Held | None, timeout: float | None
    ) -> Any:
        """Await the kind in this step's own task. A lost lease cancels the task while it is
        in here (``_Held.lose``), and that cancellation becomes ``_LeaseLostError``; one this
        scope did not ask for (a shutdown) stays a cancellation."""
        task = asyncio.current_task()
        if held is not None and task is not None:
            held.calling = task
        try:
            if timeout is None:  # the handler's own coroutine, no wrapper around it
                result = await spec.handler(ctx)
            else:
                result = await self._invoke(spec, ctx, timeout)
        except asyncio.CancelledError:
            if held is not None and held.cancelled and task is not None and task.uncancel() == 0:
                raise _LeaseLostError() from None
            raise
        finally:
            if held is not None:
                held.calling = None
        if held is not None and held.cancelled and task is not None:
            task.uncancel()  # the kind swallowed the cancellation; its result is dropped anyway
            raise _LeaseLostError()
        return result

    @staticmethod
    async def _invoke(spec: KindSpec, ctx: StepContext, timeout: float) -> Any:
        """The handler within the step's ``timeout``."""
        scope = asyncio.timeout(timeout)
        try:
            async with scope:
                return await spec.handler(ctx)
        except TimeoutError:
            if scope.expired():
                raise TimeoutError(f"step {ctx.step_id} timed out after {timeout}s") from None
            raise

    def _eager(self, row: dict[str, Any], t: policy.Proceed) -> bool:
        """Run the next step here, claimed by the settle itself: it is in a lane this worker
        serves with a free slot (or the same lane, whose slot this chain hands over)."""
        nxt = t.next_step
        return (
            self.eager
            and not self._stopping
            and nxt is not None
            and nxt.lane in self.capacity
            and (nxt.lane == row["lane"] or self.running[nxt.lane] < self.capacity[nxt.lane])
        )

    async def _proceed(
        self, row: dict[str, Any], token: Token, step: StepDef, t: policy.Proceed
    ) -> dict[str, Any] | None:
        eager = self._eager(row, t)
        lease = self._lease(t.next_step.lane) if eager and t.next_step else None
        res = await self.settler.proceed(token, t, eager=eager, lease=lease)
        self._count_settle(token, "skipped" if t.skipped else "done", res is not None)
        if res is not None and t.next_step is None:
            metrics.run_finished("completed")
        nxt = t.next_step
        if res is None or nxt is None or not eager:
            return None
        self.stats.eager += 1
        self.running[nxt.lane] += 1  # the chain's finally releases the current lane's slot
        ctx = row["ctx"] or {}
        steps_out = ctx.get("steps") or {}
        if t.keep_output:
            steps_out = {**steps_out, step.id: t.output}
        return {
            **row,
            "seq": row["seq"] + 1,
            "step_id": nxt.step_id,
            "kind": nxt.kind,
            "lane": nxt.lane,
            "iteration": nxt.iteration,
            "attempt": 1,
            "failures": 0,
            "wake": None,
            "ctx": {"vars": {**(ctx.get("vars") or {}), **t.vars}, "steps": steps_out},
            "visits": {**(row["visits"] or {}), nxt.step_id: nxt.iteration},
            "steps_executed": res["steps_executed"],
            "db_now": res["db_now"],
            "cancel_requested": res["cancel_requested"],
            "over_steps": res["steps_executed"] >= res["max_steps"],
            "over_age": res["over_age"],
        }

    # -- heartbeats ------------------------------------------------------------------------
    async def _heartbeat_loop(self, stop: asyncio.Event) -> None:
        last_ok = time.monotonic()
        while not stop.is_set() or self.held:
            await sleep_or(asyncio.Event(), self.settings.heartbeat_seconds)
            held = list(self.held.values())
            tokens = [h.token for h in held]
            if not tokens:
                last_ok = time.monotonic()
                continue
            try:
                async with self.pool.connection() as conn:
                    alive = await leases.heartbeat(conn, tokens, [h.lease for h in held])
                last_ok = time.monotonic()
            except (psycopg.OperationalError, OSError) as exc:
                log.warning("heartbeat failed (%s)", exc)
                if time.monotonic() - last_ok < self.settings.lease_seconds:
                    continue
                alive = set()  # we cannot prove we hold anything any more
            for t in tokens:
                if t.key not in alive and (h := self.held.get(t.key)) is not None and h.token == t:
                    h.lose()

    # -- lifecycle -------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop`` is set, then shut down gracefully."""
        lane_loops = [asyncio.create_task(self._lane_loop(lane, stop)) for lane in self.capacity]
        consumer = asyncio.create_task(
            self.queue.consume(list(self.capacity), self.on_wake, self.on_reconnect)
        )
        firer = asyncio.create_task(self._fire_timers(stop))
        hb_stop = asyncio.Event()
        heart = asyncio.create_task(self._heartbeat_loop(hb_stop))
        try:
            await stop.wait()
        finally:
            self._stopping = True
            # Lane loops stop by themselves on ``stop``; cancelling one just after its claim
            # committed would orphan the claimed rows until their lease lapsed.
            await asyncio.gather(*lane_loops, return_exceptions=True)
            for t in (consumer, firer):
                t.cancel()
            # A queue client may swallow one cancellation inside its own reconnect logic;
            # shutdown must not hang on it, so the wait is bounded and repeated.
            pending = {consumer, firer}
            for _ in range(5):
                _done, pending = await asyncio.wait(pending, timeout=1.0)
                if not pending:
                    break
                for t in pending:
                    t.cancel()
            await self._drain(self.settings.shutdown_grace_seconds)
            await self.settler.close()
            hb_stop.set()
            heart.cancel()
            await asyncio.gather(heart, return_exceptions=True)

    async def _drain(self, grace: float) -> None:
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=grace)
        remaining = list(self.tasks)
        held = [h.token for h in self.held.values()]
        for t in remaining:
            t.cancel()
        await asyncio.gather(*remaining, return_exceptions=True)
        crash_point("shutdown.before_release")
        if held:
            try:
                async with self.pool.connection() as conn:
                    self.stats.released += await leases.release(conn, held, self.id)
            except (psycopg.OperationalError, OSError) as exc:
                log.warning("release at shutdown failed (%s); the leases will lapse", exc)


def lanes_from_spec(spec: str | None, default: dict[str, int]) -> dict[str, int]:
    """``"fast=64,io=16"`` -> {"fast": 64, "io": 16}; None -> default."""
    if not spec:
        return dict(default)
    out: dict[str, int] = {}
    for part in spec.split(","):
        name, _, cap = part.partition("=")
        out[name.strip()] = int(cap) if cap else default.get(name.strip(), 8)
    return out


__all__: Sequence[str] = ["Worker", "lanes_from_spec", "new_worker_id"]
