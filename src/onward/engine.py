"""The engine: one object that holds the pool, the queue and the registry, and starts the
background tasks of a process (worker, relay, sweeper).

    async with Engine.open() as engine:          # embedded PostgreSQL if no URL is set
        await engine.publish(document)
        started = await engine.start("welcome", {"name": "Maya"}, event_id="evt_1")
        async with engine.running():             # worker + relay + sweeper in this process
            status = await engine.wait(started.run_id)
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from onward import actions, api_keys, cache, erasure, timers, vault
from onward import approvals as approval_ops  # (also registers the approval kind)
from onward import audit as audit_ops
from onward import budgets as budget_ops
from onward import builtin_kinds as _builtin_kinds  # noqa: F401  (registers the built-ins)
from onward import cancel as cancel_ops
from onward import circuits as circuit_ops
from onward import effect_kinds as _effect_kinds  # noqa: F401  (registers email.send, ...)
from onward import intake as intake_ops
from onward import lanes as lane_ops
from onward import limits as limit_ops
from onward import notify as notify_ops
from onward import operations as operation_ops
from onward import outbound as outbound_ops
from onward import retention as retention_ops
from onward import schedules as schedule_ops
from onward import signals as signal_ops
from onward.automations.document import AutomationDoc
from onward.automations.versions import Published, VersionCache, publish, publish_all
from onward.config import Settings
from onward.connections import Integrations
from onward.db import API_ROLE, Pool, make_pool, org_pool, resolve_url
from onward.db import read as db_read
from onward.db.migrate import apply as apply_migrations
from onward.effects import Effects
from onward.errors import DecisionRefused, InvalidInput, UnknownAutomation
from onward.history import list_runs, run_status, run_view
from onward.kinds import Registry
from onward.kinds import registry as default_registry
from onward.outbox import Relay
from onward.queue import Queue, make_queue
from onward.start import Start, StartBatcher, Started, prepare, start_many, write_one
from onward.sweep import Sweeper
from onward.worker import Worker, new_worker_id

log = logging.getLogger("onward")


async def _warm(pool: Pool) -> None:
    """Read the database's own encryption key into this process (the API's role may not)."""
    async with pool.connection() as conn:
        await vault.warm(conn)


TERMINAL = frozenset({"completed", "failed", "cancelled", "exceeded"})


@dataclass
class Background:
    """The background tasks running in this process: worker, relay, sweeper."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    worker: Worker | None = None
    relay: Relay | None = None
    sweeper: Sweeper | None = None
    notifier: notify_ops.DeliveryRelay | None = None  # runs wherever the relay runs
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class Engine:
    def __init__(
        self,
        settings: Settings,
        url: str,
        pool: Pool,
        queue: Queue,
        registry: Registry,
    ) -> None:
        self.settings, self.url, self.pool, self.queue = settings, url, pool, queue
        self.registry = registry
        self.api_pool: Pool | None = None  # Engine.open makes it (as_tenant)
        self.engine_pool = pool  # the engine's role, in every view too (its own secrets)
        self.versions = VersionCache(pool)
        self.org_id = settings.org_id
        self.id = new_worker_id()
        self.effects = Effects(pool, lease_seconds=settings.lease_seconds)
        self.integrations = Integrations(pool, effects=self.effects)
        self.integrations.token_secret = settings.signing_secret
        self.integrations.budget_lease = settings.budget_lease_seconds
        self.integrations.set_outbound(
            settings.outbound_allow,
            max_response_bytes=settings.outbound_max_response_bytes,
            max_seconds=settings.outbound_max_seconds,
        )
        self._driving: set[asyncio.Task[Any]] = set()  # operations driven in this process
        # concurrent starts written together, and intake requests counted together, per
        # organisation and pool (onward.start, onward.intake, onward.batching)
        self._batchers: dict[tuple[str, int], StartBatcher] = {}
        self._admitters: dict[tuple[str, int], intake_ops.Admitter] = {}
        # A notification written in this process wakes its delivery relay at once (a hint: the
        # relay polls anyway, and any process's relay may deliver it).
        self._notify_kick = asyncio.Event()
        self.integrations.notify = self._kick_notifier

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        settings: Settings | None = None,
        *,
        migrate: bool = True,
        registry: Registry | None = None,
        pool_size: int = 10,
        start_queue: bool = True,
    ) -> AsyncIterator[Engine]:
        settings = settings or Settings.from_env()
        cache.configure(settings.auth_cache_seconds)
        url = await asyncio.to_thread(resolve_url, settings)
        if migrate:
            await asyncio.to_thread(apply_migrations, url)
        pool = make_pool(url, max_size=pool_size)
        await pool.open(wait=True)
        # the HTTP API's connections (row-level security, one organisation each): none until
        # a request needs one
        api_pool = make_pool(url, min_size=0, max_size=pool_size, name="onward-api", role=API_ROLE)
        await api_pool.open(wait=False)
        queue = make_queue(settings, url)
        try:
            await db_read(pool, lambda: _warm(pool))  # repeated once after a lost connection
            if start_queue:
                await queue.start()
            engine = cls(settings, url, pool, queue, registry or default_registry)
            engine.api_pool = api_pool
            try:
                yield engine
            finally:
                await engine.integrations.aclose()
        finally:
            await queue.close()
            await api_pool.close()
            await pool.close()

    # -- the library API -------------------------------------------------------------------
    async def publish(
        self, document: dict[str, Any] | AutomationDoc, *, actor: str | None = None
    ) -> Published:
        return await publish(self.pool, self.org_id, document, registry=self.registry, actor=actor)

    async def publish_all(
        self,
        documents: Sequence[tuple[str, dict[str, Any] | AutomationDoc]],
        *,
        actor: str | None = None,
    ) -> list[Published]:
        """Publish several documents, each named by its source (a file name), in one
        transaction: all or none. ``InvalidAutomation`` lists every problem, prefixed by its
        source, and nothing is stored."""
        return await publish_all(
            self.pool, self.org_id, list(documents), registry=self.registry, actor=actor
        )

    async def start(
        self,
        automation_id: str,
        payload: dict[str, Any] | None = None,
        *,
        event_id: str | None = None,
        key: str | None = None,
        version: int | None = None,
        contact_id: str | None = None,
        traceparent: str | None = None,
    ) -> Started:
        """Start a run (R1: a repeated start key answers the first run, ``created`` False).
        ``traceparent``: a W3C trace context the run's steps continue (``onward.tracing``).
        Concurrent starts are written together (``onward.start.StartBatcher``,
        ``ONWARD_START_BATCHES``), each with its own answer."""
        p = prepare(
            automation_id,
            payload or {},
            event_id=event_id,
            key=key,
            version=version,
            contact_id=contact_id,
            max_payload_bytes=self.settings.max_payload_bytes,
            traceparent=traceparent,
        )
        if self.settings.start_batches > 0:
            slot = (self.org_id, id(getattr(self.pool, "base", self.pool)))  # a view: its pool
            b = self._batchers.get(slot)
            if b is None:
                b = self._batchers[slot] = StartBatcher(
                    self.pool, self.org_id, self.settings.start_batches
                )
            return await b.start(p)
        return await write_one(self.pool, self.org_id, p)

    async def start_many(
        self, starts: Sequence[Start | Mapping[str, Any]], *, traceparent: str | None = None
    ) -> list[Started]:
        """Start up to 1,000 runs in one statement and one commit, each with its own start key
        and answer, in the order given (``onward.start.start_many``): ``Start`` objects or
        mappings of their fields. A bad start, an unknown automation or an erased contact
        refuses the whole batch (the error names its index); nothing is written."""
        return await start_many(
            self.pool,
            self.org_id,
            starts,
            max_payload_bytes=self.settings.max_payload_bytes,
            traceparent=traceparent,
        )

    async def show(self, run_id: str) -> dict[str, Any]:
        return await run_view(self.pool, self.org_id, run_id)

    async def runs(self, **filters: Any) -> list[dict[str, Any]]:
        return await list_runs(self.pool, self.org_id, **filters)

    async def status(self, run_id: str) -> str:
        return await run_status(self.pool, self.org_id, run_id)

    async def wait(
        self, run_id: str, *, timeout: float = 60.0, poll: float = 0.05, or_parked: bool = True
    ) -> str:
        """Wait until the run is in a terminal state (or parked, unless ``or_parked=False``);
        returns its status."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            status = await self.status(run_id)
            if status in TERMINAL or (or_parked and status == "parked"):
                return status
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"run {run_id} still {status} after {timeout}s")
            await asyncio.sleep(poll)

    # -- calendar timers (R6) --------------------------------------------------------------
    async def recompute_timers(
        self,
        *,
        run_id: str | None = None,
        contact_id: str | None = None,
        automation_id: str | None = None,
        step_id: str | None = None,
        zone: str | None = None,
        rule: str | None = None,
        every_organisation: bool = False,
    ) -> timers.Recomputed:
        """Recompute this organisation's pending calendar timers (narrowed to a run, a contact
        or an automation's step), with a new zone or rule when given; or, with
        ``every_organisation``, every pending calendar timer as it is (after a tz database
        update). Each move is in its run's history (``timer_moved``) and bumps the timer's
        wake number, so the old wake does nothing."""
        return await timers.recompute(
            self.pool,
            None if every_organisation else self.org_id,
            run_id=run_id,
            contact_id=contact_id,
            automation_id=automation_id,
            step_id=step_id,
            zone=zone,
            rule=rule,
            worker=self.id,
        )

    # -- signals (R9) ------------------------------------------------------------------------
    async def signal(
        self,
        signal_id: str,
        name: str,
        *,
        run_id: str | None = None,
        correlation_key: str | None = None,
        payload: dict[str, Any] | None = None,
    ) -> signal_ops.Delivered:
        """Deliver a signal: stored durably under ``signal_id`` (the sender's event id: a
        repeat is a duplicate), routed to ``run_id`` or by ``correlation_key``, and consumed at
        once if a step of its run waits on it -- else kept until one does. Raises
        ``SignalRefused`` (recorded) if the run has finished or was cancelled."""
        return await signal_ops.deliver(
            self.pool,
            self.org_id,
            signal_id=signal_id,
            name=name,
            run_id=run_id,
            correlation_key=correlation_key,
            payload=payload,
            worker=self.id,
            queue=self.queue,
        )

    async def signals(
        self,
        *,
        run_id: str | None = None,
        status: str | None = None,
        unrouted: bool = False,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        """This organisation's signals, newest first (``unrouted``: kept, nobody to route to)."""
        return await signal_ops.list_signals(
            self.pool, self.org_id, run_id=run_id, status=status, unrouted=unrouted, limit=limit
        )

    # -- approvals (R10) ---------------------------------------------------------------------
    async def decide(
        self, approval_id: str, decision: str, *, user: str, via: str = "api"
    ) -> dict[str, Any]:
        """Decide an approval request (``approve`` / ``reject``) as ``user``: the first
        decision wins and wakes its step; ``DecisionRefused`` says why not (expired, not
        permitted now, the content changed, already decided -- with that decision)."""
        return await approval_ops.decide(
            self.pool,
            self.org_id,
            approval_id,
            approval_ops.DECISIONS.get(decision, decision),
            user=user,
            via=via,
            content_now=self._content_now,
            worker=self.id,
        )

    async def decide_by_token(
        self, token: str, user: str, *, via: str = "slack", action: str | None = None
    ) -> dict[str, Any]:
        """Decide with a button's token (what Slack's interactivity sends). ``action`` (the
        button pressed) must match the decision the token was made for."""
        # the engine's own secret (org '_system'): read on the engine's pool, never a tenant's
        secret = await approval_ops.token_secret(self.engine_pool, self.settings.signing_secret)
        parsed = approval_ops.read_token(secret, token)
        if action is not None and approval_ops.DECISIONS.get(action) != parsed.decision:
            raise DecisionRefused("invalid_token", "this token belongs to the other button")
        if parsed.org_id != self.org_id:
            raise DecisionRefused("invalid_token", "this button does not belong to this request")
        return await approval_ops.decide(
            self.pool,
            self.org_id,
            parsed.approval_id,
            parsed.decision,
            user=user,
            via=via,
            content_now=self._content_now,
            worker=self.id,
            token=parsed,
        )

    async def _content_now(self, request: dict[str, Any]) -> str | None:
        """What the request's step would show for its run as the run is now."""
        view = await run_view(self.pool, self.org_id, request["run_id"])
        run = view["run"]
        try:
            doc = await self.versions.get(self.org_id, run["automation_id"], run["version"])
            definition = doc.step(request["step_id"])
        except (KeyError, UnknownAutomation):
            return None
        ctx = run.get("ctx") or {}
        return approval_ops.content_for(definition, run.get("input"), ctx.get("vars"))

    async def approvals(
        self, *, run_id: str | None = None, status: str | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        return await approval_ops.list_approvals(
            self.pool, self.org_id, run_id=run_id, status=status, limit=limit
        )

    async def approval(self, approval_id: str) -> dict[str, Any]:
        return await approval_ops.get(self.pool, self.org_id, approval_id)

    async def grant_approver(
        self, approver: str, *, automation_id: str = "*", actor: str | None = None
    ) -> dict[str, Any]:
        """Let ``approver`` decide (for one automation, or every one): checked at click time."""
        return await approval_ops.grant(
            self.pool, self.org_id, approver, automation_id, actor=actor
        )

    async def revoke_approver(
        self, approver: str, *, automation_id: str = "*", actor: str | None = None
    ) -> dict[str, Any] | None:
        """Take the permission away: a click after this is refused, whatever was sent."""
        return await approval_ops.revoke(
            self.pool, self.org_id, approver, automation_id, actor=actor
        )

    async def approvers(self) -> list[dict[str, Any]]:
        return await approval_ops.list_approvers(self.pool, self.org_id)

    async def erase_contact(
        self, contact_id: str, *, identifiers: Sequence[str] = (), by: str = "operator"
    ) -> dict[str, Any]:
        """Erase a contact (R14): cancel its runs, remove their data (history kept as a
        skeleton), suppress it by a pseudonym. ``identifiers``: its email addresses beyond
        those its runs' inputs hold. Idempotent; ``status`` is ``pending`` while a run with a
        step in flight has not stopped (the elected sweeper finishes it). See
        ``onward.erasure``."""
        return await erasure.erase_contact(
            self.pool, self.org_id, contact_id, identifiers=identifiers, by=by
        )

    async def skip_wait(self, run_id: str) -> list[dict[str, Any]]:
        """Skip a waiting run's timer: it fires now (``timer_moved`` in its history, reason
        ``skipped``). Empty when the run waits on no timer. Raises ``UnknownRun``."""
        await self.status(run_id)
        return await timers.skip(self.pool, self.org_id, run_id, worker=self.id)

    # -- operator actions (B2/B3): resolve a review, resume, fork ------------------------------
    async def resolve_review(
        self,
        run_id: str,
        how: str,
        *,
        by: str,
        reference: str | None = None,
        effect_key: str | None = None,
    ) -> dict[str, Any]:
        """Resolve the review a run is parked for: ``happened`` (with the provider's
        ``reference``), ``retry`` (the same idempotency key) or ``skip``. Raises ``UnknownRun``,
        ``ActionRefused`` (not parked for review, finished, ...: nothing changed)."""
        return await actions.resolve_review(
            self.pool,
            self.org_id,
            run_id,
            how,
            by=by,
            reference=reference,
            effect_key=effect_key,
            worker=self.id,
        )

    async def resume(self, run_id: str, *, by: str) -> dict[str, Any]:
        """Resume a parked run (``reconnect``, ``budget``, ``circuit``, ``migration``: see
        ``onward.actions``); its step is ready again. Raises ``UnknownRun``,
        ``ActionRefused``."""
        return await actions.resume(
            self.pool, self.org_id, run_id, by=by, versions=self.versions, worker=self.id
        )

    async def fork(
        self,
        run_id: str,
        *,
        by: str,
        from_step: str | None = None,
        version: int | None = None,
    ) -> actions.Forked:
        """Retry a failed, cancelled or exceeded run from a chosen step (default: where it
        stopped) as a new run linked to it; asking twice returns the first fork. Raises
        ``UnknownRun``, ``UnknownAutomation`` (no such version), ``ActionRefused``."""
        return await actions.fork(
            self.pool,
            self.org_id,
            run_id,
            by=by,
            versions=self.versions,
            registry=self.registry,
            from_step=from_step,
            version=version,
        )

    # -- cancellation (R12) and bulk operations -------------------------------------------------
    async def cancel(
        self, run_id: str, *, by: str = "operator", reason: str | None = None
    ) -> dict[str, Any]:
        """Cancel one run. A waiting, parked or ready run is cancelled at once (its timers and
        pending approval closed); a run with a step in flight is marked and stops at its next
        safe point. Idempotent; ``outcome`` says what it did: ``cancelled``,
        ``cancel_requested``, ``already_requested``, ``already_cancelled``,
        ``already_finished``. Raises ``UnknownRun``."""
        return await cancel_ops.cancel_run(self.pool, self.org_id, run_id, by=by, reason=reason)

    async def cancel_many(
        self,
        *,
        by: str = "operator",
        reason: str | None = None,
        on_batch: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
        batch: int = operation_ops.BATCH,
        **filters: Any,
    ) -> dict[str, Any]:
        """Cancel every unfinished run the filter names (``automation_id``, ``version``,
        ``status``, ``contact_id``, ``created_before``, ``created_after``; at least one), in
        batches recorded as an operation (``on_batch`` sees its row and the batch's per-run
        answers after each batch). Returns the operation's final row."""
        return await cancel_ops.cancel_many(
            self.pool, self.org_id, by=by, reason=reason, batch=batch, on_batch=on_batch, **filters
        )

    async def begin_cancel_many(
        self, *, by: str = "operator", reason: str | None = None, **filters: Any
    ) -> dict[str, Any]:
        """Record a bulk cancel without driving it (``resume_operation`` drives it; the API
        does so in the background). Returns the new operation's row."""
        params = cancel_ops.check_filter({k: v for k, v in filters.items() if v is not None})
        params.update(by=by, reason=reason)
        return await operation_ops.begin(self.pool, self.org_id, "cancel", params, requested_by=by)

    async def operation(self, operation_id: str) -> dict[str, Any]:
        """One bulk operation: its kind, parameters, progress (``done``, ``outcomes``), status.
        Raises ``UnknownOperation``."""
        return await operation_ops.get(self.pool, self.org_id, operation_id)

    async def operations(self, *, limit: int = 50) -> list[dict[str, Any]]:
        """The newest bulk operations first."""
        return await operation_ops.list_operations(self.pool, self.org_id, limit=limit)

    async def resume_operation(
        self,
        operation_id: str,
        *,
        on_batch: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
        batch: int = operation_ops.BATCH,
    ) -> dict[str, Any]:
        """Continue an operation from its cursor (its driver died or was stopped); a finished
        one is returned as it is. Raises ``UnknownOperation``."""
        return await operation_ops.resume(
            self.pool, self.org_id, operation_id, batch=batch, on_batch=on_batch
        )

    # -- flow control (R5): limits, circuits, budgets, lanes -----------------------------------
    async def set_limit(
        self,
        key: str,
        *,
        max_concurrent: int | None = None,
        calls: int | None = None,
        per_seconds: float | None = None,
        actor: str | None = None,
    ) -> dict[str, Any]:
        """Cap the calls in progress at once under ``key`` (``connection:<id>``,
        ``provider:<name>``, ``org``) and/or their rate (``calls`` per ``per_seconds``), across
        every process."""
        return await limit_ops.set_limit(
            self.pool,
            self.org_id,
            key,
            max_concurrent=max_concurrent,
            calls=calls,
            per_seconds=per_seconds,
            actor=actor,
        )

    async def remove_limit(self, key: str, *, actor: str | None = None) -> bool:
        return await limit_ops.remove_limit(self.pool, self.org_id, key, actor=actor)

    async def limits(self) -> list[dict[str, Any]]:
        return await limit_ops.list_limits(self.pool, self.org_id)

    async def configure_circuit(
        self,
        key: str,
        *,
        threshold: int = 5,
        window_seconds: float = 30.0,
        cooldown_seconds: float = 30.0,
        actor: str | None = None,
    ) -> dict[str, Any]:
        """Set when ``key``'s circuit opens (``threshold`` failures in ``window_seconds``) and
        how long it stays open before one probe (``cooldown_seconds``)."""
        return await circuit_ops.configure(
            self.pool,
            self.org_id,
            key,
            threshold=threshold,
            window_seconds=window_seconds,
            cooldown_seconds=cooldown_seconds,
            actor=actor,
        )

    async def circuits(self) -> list[dict[str, Any]]:
        return await circuit_ops.list_circuits(self.pool, self.org_id)

    async def set_budget(
        self, scope: str, unit: str, per_day: float, *, actor: str | None = None
    ) -> dict[str, Any]:
        """A cost budget per day (UTC) for the organisation (``scope='*'``) or one automation,
        in ``usd`` or ``tokens``. Steps parked on budgets resume (each checks again)."""
        return await budget_ops.set_budget(
            self.pool, self.org_id, scope, unit, per_day, worker=self.id, actor=actor
        )

    async def budgets(self) -> list[dict[str, Any]]:
        return await budget_ops.list_budgets(self.pool, self.org_id)

    # -- retention: finished runs deleted after an age (onward.retention) ----------------------
    async def set_retention(
        self, days: float | None = None, *, keep_forever: bool = False, actor: str | None = None
    ) -> dict[str, Any]:
        """Delete this organisation's finished runs ``days`` after they finished (at least 1);
        ``keep_forever=True`` keeps them; neither: the engine's default
        (``ONWARD_RETENTION_DAYS``). Answers :meth:`retention`."""
        return await retention_ops.set_days(
            self.pool,
            self.org_id,
            days,
            keep_forever=keep_forever,
            default_days=self.settings.retention_days,
            actor=actor,
        )

    async def retention(self) -> dict[str, Any]:
        """The retention in force, where it comes from, its cutoff, the oldest finished run."""
        return await retention_ops.show(
            self.pool, self.org_id, default_days=self.settings.retention_days
        )

    async def outbound_allow(self) -> dict[str, list[str]]:
        """Where this organisation's user-configured HTTP may go although not public
        (``onward.outbound``): ``{"engine": ONWARD_OUTBOUND_ALLOW, "org": its own entries}``."""
        async with self.pool.connection() as conn:
            org = await outbound_ops.entries(conn, self.org_id)
        return {"engine": list(self.integrations.outbound.engine_allow), "org": org}

    async def allow_outbound(self, entries: Sequence[str]) -> dict[str, list[str]]:
        """Add entries (CIDR, address or host name, optionally ``:port``) to this
        organisation's outbound allow-list; ``InvalidInput`` stores none of them."""
        async with self.pool.connection() as conn, conn.transaction():
            await outbound_ops.allow(conn, self.org_id, entries)
        return await self.outbound_allow()

    async def disallow_outbound(self, entries: Sequence[str]) -> dict[str, list[str]]:
        """Remove entries from this organisation's outbound allow-list."""
        async with self.pool.connection() as conn, conn.transaction():
            await outbound_ops.disallow(conn, self.org_id, entries)
        return await self.outbound_allow()

    async def prune(self, *, dry_run: bool = False, max_runs: int | None = None) -> dict[str, Any]:
        """Delete this organisation's finished runs past its retention now, in batches (the
        elected sweeper does the same on its own); ``dry_run`` only counts them (``due``)."""
        return await retention_ops.prune_org(
            self.pool,
            self.org_id,
            default_days=self.settings.retention_days,
            dry_run=dry_run,
            max_runs=max_runs,
        )

    def lanes(self) -> dict[str, lane_ops.LanePolicy]:
        """The lane policies a worker of this engine serves (``onward.lanes``)."""
        return lane_ops.policies(
            dict(self.settings.lanes),
            self.settings.lane_policy,
            lease_seconds=self.settings.lease_seconds,
        )

    # -- background tasks ------------------------------------------------------------------
    def background(
        self,
        *,
        worker: bool = True,
        relay: bool = True,
        sweeper: bool = True,
        lanes: dict[str, int] | None = None,
        integrations: Any = None,
    ) -> Background:
        """The background tasks of this process (not started: ``run_background`` runs them).
        ``integrations`` replaces what step kinds reach as ``step.integrations``."""
        svc = Background()
        kick = asyncio.Event()
        if worker:
            svc.worker = Worker(
                self.pool,
                self.queue,
                settings=self.settings,
                registry=self.registry,
                versions=self.versions,
                worker_id=self.id,
                lanes=lanes,
                integrations=integrations if integrations is not None else self.integrations,
            )
        if relay:
            svc.relay = Relay(
                self.pool,
                self.queue,
                batch=self.settings.relay_batch,
                poll_seconds=self.settings.relay_poll_seconds,
                kick=kick,
                fire_batch=self.settings.timer_fire_batch,
                rounds=self.settings.relay_rounds,
            )
        if sweeper:
            svc.sweeper = Sweeper(
                self.pool,
                worker_id=self.id,
                interval=self.settings.sweep_seconds,
                kick=kick,
                retention_days=self.settings.retention_days,
                metrics_seconds=self.settings.metrics_seconds,
            )
        if relay:
            svc.notifier = notify_ops.DeliveryRelay(
                self.pool,
                self.integrations,
                worker_id=self.id,
                lease_seconds=self.settings.lease_seconds,
                poll_seconds=self.settings.poll_seconds,
                kick=self._notify_kick,
            )
        return svc

    async def run_background(self, svc: Background) -> None:
        """Run the given tasks until ``svc.stop`` is set; then shut them down gracefully."""
        if svc.worker is not None:
            svc.tasks.append(asyncio.create_task(svc.worker.run(svc.stop)))
        if svc.relay is not None:
            svc.tasks.append(asyncio.create_task(svc.relay.run(svc.stop)))
        if svc.sweeper is not None:
            svc.tasks.append(asyncio.create_task(svc.sweeper.run(svc.stop)))
        if svc.notifier is not None:
            svc.tasks.append(asyncio.create_task(svc.notifier.run(svc.stop)))
        try:
            await asyncio.gather(*svc.tasks)
        finally:
            svc.stop.set()
            for t in svc.tasks:
                if not t.done():
                    t.cancel()
            await asyncio.gather(*svc.tasks, return_exceptions=True)

    @contextlib.asynccontextmanager
    async def running(self, **kw: Any) -> AsyncIterator[Background]:
        """Run worker, relay and sweeper in this process for the duration of the block."""
        svc = self.background(**kw)
        task = asyncio.create_task(self.run_background(svc))
        try:
            yield svc
        finally:
            svc.stop.set()
            await task

    # -- schedules that start runs (onward.schedules) ----------------------------------------
    async def schedules(self, automation_id: str | None = None) -> list[dict[str, Any]]:
        """The organisation's schedules (of one automation), with their next instant, the
        last firing and its run's status."""
        return await schedule_ops.list_schedules(self.pool, self.org_id, automation_id)

    async def pause_schedule(self, automation_id: str, schedule_id: str) -> dict[str, Any]:
        return await schedule_ops.pause(self.pool, self.org_id, automation_id, schedule_id)

    async def resume_schedule(
        self, automation_id: str, schedule_id: str, *, catch_up: bool = False
    ) -> dict[str, Any]:
        """Resume; the paused period is replayed only with ``catch_up`` (by the schedule's
        catch-up policy)."""
        return await schedule_ops.resume(
            self.pool, self.org_id, automation_id, schedule_id, catch_up=catch_up
        )

    async def trigger_schedule(
        self, automation_id: str, schedule_id: str, *, key: str | None = None
    ) -> schedule_ops.Triggered:
        """Fire now, once, under the overlap policy; ``key`` makes a retry a duplicate."""
        return await schedule_ops.trigger(
            self.pool, self.org_id, automation_id, schedule_id, key=key
        )

    # -- migrating runs between versions (R11, onward.run_migrations) ------------------------
    async def migrate_runs(
        self,
        automation_id: str,
        from_version: int,
        to_version: int,
        step_map: dict[str, str] | None = None,
        removed_step_policy: str | None = None,
        *,
        dry_run: bool = False,
        by: str = "operator",
        wait: bool = True,
        batch: int | None = None,
        on_batch: Any = None,
        max_passes: int | None = None,
        pass_pause_s: float | None = None,
    ) -> dict[str, Any]:
        """Move the unfinished runs of ``from_version`` to ``to_version``: ``step_map``
        ``{old: new}`` (a step whose id both versions have maps to itself), and for a step
        whose id is gone ``removed_step_policy`` ``park``, ``skip-to:STEP`` or ``cancel``.
        Raises ``MigrationRefused`` (every problem) before any run moves. ``dry_run``: the
        plan per run, nothing changed. Otherwise the operation's row (``operations``) -- when
        it finished, or at once with ``wait=False`` (driven in this process; its progress at
        ``operation(id)``)."""
        from onward import operations
        from onward import run_migrations as rm

        params = await rm.plan(
            self.pool,
            self.org_id,
            self.registry,
            automation_id=automation_id,
            from_version=from_version,
            to_version=to_version,
            step_map=step_map,
            removed_step_policy=removed_step_policy,
            by=by,
        )
        if max_passes is not None:
            params["max_passes"] = max_passes
        if pass_pause_s is not None:
            params["pass_pause_s"] = pass_pause_s
        if dry_run:
            return await rm.dry_run(self.pool, self.org_id, params)
        size = batch or operations.BATCH
        if wait:
            return await rm.migrate(self.pool, self.org_id, params, batch=size, on_batch=on_batch)
        op = await rm.begin(self.pool, self.org_id, params)

        async def drive() -> None:
            try:
                await operations.resume(self.pool, self.org_id, op["operation_id"], batch=size)
            except Exception:  # recorded on the row when it is the operation's own failure
                log.exception("operation %s stopped; resume it", op["operation_id"])

        task = asyncio.create_task(drive())
        self._driving.add(task)
        task.add_done_callback(self._driving.discard)
        return op

    # -- notifications that arrive (R15, onward.notify) -----------------------------------------
    async def _kick_notifier(self, subject: str, body: dict[str, Any]) -> None:
        self._notify_kick.set()

    async def set_notification_destination(
        self,
        destination_id: str,
        kind: str = "webhook",
        *,
        url: str | None = None,
        secret: str | None = None,
        connection_id: str | None = None,
        target: str | None = None,
        actor: str | None = None,
    ) -> dict[str, Any]:
        """Send this organisation's notifications to a webhook (``url``; signed with ``secret``,
        a new ``whsec_`` one when not given, returned here only), a Slack channel or an email
        address (``connection_id`` + ``target``). Notifications still undelivered get it too.
        ``InvalidInput`` (nothing stored) for a bad URL, kind or id."""
        return await notify_ops.set_destination(
            self.pool,
            self.org_id,
            destination_id,
            kind,
            url=url,
            secret=secret,
            connection_id=connection_id,
            target=target,
            actor=actor,
        )

    async def notification_destinations(self) -> list[dict[str, Any]]:
        return await notify_ops.destinations(self.pool, self.org_id)

    async def remove_notification_destination(
        self, destination_id: str, *, actor: str | None = None
    ) -> bool:
        """Stop sending there (its undelivered intents go); False if there was none."""
        return await notify_ops.remove_destination(
            self.pool, self.org_id, destination_id, actor=actor
        )

    # -- audit (issue 14): who changed what, and when (onward.audit) ---------------------------
    async def audit(
        self,
        *,
        limit: int = 50,
        action: str | None = None,
        since: datetime | str | None = None,
        before: int | None = None,
    ) -> list[dict[str, Any]]:
        """This organisation's audit rows, newest first (``audit_id``, ``at``, ``actor``,
        ``action``, ``target``, ``detail``); ``before`` (an ``audit_id``) pages on. Raises
        ``InvalidInput`` for an unknown action, a bad instant or limit."""
        return await audit_ops.page(
            self.pool, self.org_id, limit=limit, action=action, since=since, before=before
        )

    async def notifications(
        self, *, undelivered: bool = False, limit: int = 50
    ) -> list[dict[str, Any]]:
        """This organisation's notifications, newest first, with each delivery's state."""
        return await notify_ops.list_notifications(
            self.pool, self.org_id, undelivered=undelivered, limit=limit
        )

    async def retry_notifications(self, notification_id: int | None = None) -> list[dict[str, Any]]:
        """Deliver failed (or backing-off) notifications now, with a new round of attempts."""
        found = await notify_ops.retry(self.pool, self.org_id, notification_id)
        self._notify_kick.set()
        return found

    # -- API keys (issue 14, onward.api_keys) -------------------------------------------------
    async def create_key(
        self, name: str, scopes: Sequence[str], *, by: str | None = None
    ) -> tuple[dict[str, Any], str]:
        """A new API key of this organisation: its row and the key itself, shown only here
        (only its hash is kept). ``InvalidInput`` for an unknown scope or a bad name."""
        return await api_keys.create(self.pool, self.org_id, name=name, scopes=scopes, by=by)

    async def keys(self) -> list[dict[str, Any]]:
        """This organisation's API keys, live and revoked, newest first (never a secret)."""
        return await api_keys.list_keys(self.pool, self.org_id)

    async def revoke_key(self, key_id: str, *, by: str | None = None) -> dict[str, Any] | None:
        """Revoke a live key of this organisation (``None``: no such live key here)."""
        return await api_keys.revoke(self.pool, self.org_id, key_id, by=by)

    async def authenticate(self, token: str | None) -> api_keys.Principal | None:
        """Whose live key ``token`` is, in any organisation; ``None`` for anything else."""
        return await api_keys.authenticate(self.pool, token)

    def for_org(self, org_id: str) -> Engine:
        """This engine acting for ``org_id``: the same pool, queue and background tasks; every
        library call of the view reads and changes that organisation only."""
        if org_id == self.org_id:
            return self
        view = copy.copy(self)
        view.org_id = org_id
        return view

    def as_tenant(self, org_id: str) -> Engine:
        """This engine as the HTTP API serves ``org_id``: a view whose every statement runs on
        the API's pool, as role ``onward_api`` with ``onward.org_id`` set (``db.OrgPool``), so
        PostgreSQL's row-level security shows and admits that organisation's rows only, even
        to a query that forgot its ``org_id``. Published versions are still read through the
        engine's cache (immutable rows, keyed by organisation)."""
        if org_id.startswith("_") or not org_id:  # '_system': the engine's own rows
            raise InvalidInput(f"organisation {org_id!r}: not one the API serves")
        if self.api_pool is None:  # an engine built by hand, without Engine.open
            return self.for_org(org_id)
        view = copy.copy(self)
        view.org_id = org_id
        view.pool = org_pool(self.api_pool, org_id)
        view.integrations = copy.copy(self.integrations)
        view.integrations.pool = view.pool
        return view

    # -- signed intake (issue 14, onward.intake) ------------------------------------------------
    async def admit_intake(self) -> None:
        """Count one intake request of this organisation: ``IntakeLimited`` past
        ``ONWARD_INTAKE_LIMIT`` in the window (``onward.intake.admit``); concurrent requests
        are counted together (``onward.intake.Admitter``), each answered as if alone."""
        s = self.settings
        if s.intake_limit <= 0:
            return
        if s.start_batches <= 0:
            await intake_ops.admit(
                self.pool, self.org_id, limit=s.intake_limit, window_s=s.intake_window_seconds
            )
            return
        key = (self.org_id, id(getattr(self.pool, "base", self.pool)))
        admitter = self._admitters.get(key)
        if admitter is None:
            admitter = self._admitters[key] = intake_ops.Admitter(
                self.pool,
                self.org_id,
                limit=s.intake_limit,
                window_s=s.intake_window_seconds,
                in_flight=s.start_batches,
            )
        await admitter.admit()

    async def add_hook_secret(
        self, automation_id: str, secret: str | None = None
    ) -> dict[str, Any]:
        """Require the Standard Webhooks signature on the automation's webhook endpoint with one
        more secret (a new ``whsec_`` one when not given; returned here only). The others stay
        valid (rotation). ``UnknownAutomation`` if it is not published, ``InvalidInput`` for a
        malformed secret."""
        return await intake_ops.add_secret(self.pool, self.org_id, automation_id, secret)

    async def hook_secrets(self, automation_id: str | None = None) -> list[dict[str, Any]]:
        """The webhook secrets (ids and when made; never the secret) of one or every automation."""
        return await intake_ops.list_secrets(self.pool, self.org_id, automation_id)

    async def remove_hook_secret(self, automation_id: str, secret_id: str) -> bool:
        """Stop accepting that secret's signatures; False if there was none. With no secret
        left the endpoint takes unsigned requests again."""
        return await intake_ops.remove_secret(self.pool, self.org_id, automation_id, secret_id)

    async def rotate_secrets(self, *, batch: int = 500) -> dict[str, dict[str, int]]:
        """Re-encrypt every stored secret, of every organisation, under the current (first) key
        of ``ONWARD_SECRET_KEYS`` in batches of ``batch`` rows (each one transaction);
        idempotent. An operator's action, not an organisation's (``onward.vault``)."""
        return await vault.rotate_secrets(self.pool, batch=batch)
