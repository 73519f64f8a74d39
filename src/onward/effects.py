"""Outside effects, at least once made idempotent (R4) -- the design's ``runEffect``.

    result = await effects.run(step, connector, params)

1. **Claim or read** the effect row by key (``<run_id>/<step_id>/<iteration>``: the same for
   every attempt, different for every loop iteration).
2. ``settled``: return the recorded result -- the provider is not called again.
   A claim (and a new attempt) reads the run's ``cancel_requested_at`` in its own statement:
   a cancelled run's effect is never called (``RunCancelled``), only reconciled.
3. ``in_flight`` with a live effect lease: another attempt may be calling the provider right
   now. Wait for it to settle or for its lease to lapse; never overlap it.
4. ``in_flight`` with a lapsed lease, or ``outcome_unknown``: the call may have happened.
   Reconcile first (search the provider for work tagged with the key); if found, settle it.
   Else, if the provider deduplicates idempotency keys, begin a new attempt with the SAME key
   (likewise where a repeat only costs, like a model generation: ``repeat_is_harmless``).
   Else park for a person (``review``) with what is known: key, first attempt, last error.
   A person resolves it (:func:`resolve`, in the transaction of ``onward.actions``): it
   happened (settled with the provider's reference), retry with the same key (one more
   attempt is allowed), or skip (never called again).
5. Perform, heartbeating the effect lease; settle the result. A dropped connection after the
   request was sent marks the effect ``outcome_unknown``; an answer that says the work was not
   done (429, 401, 4xx, 5xx) withdraws the claim so the next attempt starts clean.

The effect lease is separate from the step lease: a worker whose step lease was taken over
may still be inside the provider call; its replacement waits on the effect lease instead of
calling the provider a second time.

Each transition writes its history row in its own statement (``effects.sql``): the run's
timeline shows the effect claimed (with an excerpt of the request), settled or reconciled (the
provider's reference and an excerpt of the result), not done, unknown, or parked for review --
each with the effect key, which is also the provider's idempotency key (R17).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from psycopg.types.json import Jsonb

from onward import tracing
from onward.connectors.base import Connector
from onward.crashpoints import crash_point
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import NeedsReview, OutcomeUnknown, RunCancelled, StepError
from onward.history import excerpt
from onward.kinds import StepContext

Q = Queries(__package__, "effects.sql")


def _error_of(exc: BaseException) -> dict[str, Any]:
    detail = exc.detail if isinstance(exc, StepError) else {}
    return {"type": type(exc).__name__, "message": str(exc)[:1000], "detail": detail}


def _error(exc: BaseException) -> Jsonb:
    return Jsonb(_error_of(exc))


def reference_of(result: dict[str, Any]) -> str | None:
    """The provider's reference in a result: its ``id`` (a message, charge or record id), else
    its ``reference``."""
    for name in ("id", "reference"):
        value = result.get(name)
        if isinstance(value, str | int) and not isinstance(value, bool):
            return str(value)
    return None


def _who(step: StepContext, key: str, provider: str) -> dict[str, Any]:
    """The arguments every effect statement takes: the effect, and the step entry, attempt
    and worker its history row is filed under, with the start of that row's detail."""
    return {
        "org_id": step.org_id,
        "effect_key": key,
        "run_id": step.run_id,
        "seq": step.seq,
        "provider": provider,
        "step_id": step.step_id,
        "attempt": step.attempt,
        "worker": step.worker,
        # the key is the provider's idempotency key (Connector.perform sends it as such)
        "base": {"effect_key": key, "idempotency_key": key, "provider": provider},
    }


def _note(args: dict[str, Any], **more: Any) -> Jsonb:
    return Jsonb({**args["base"], **{k: v for k, v in more.items() if v is not None}})


async def unsettled_of_step(conn: Conn, org_id: str, run_id: str, seq: int) -> bool:
    """Whether the step entry has an effect whose outcome is not recorded (``in_flight`` or
    ``outcome_unknown``): its worker died or was interrupted mid-call."""
    cur = await conn.execute(Q.unsettled_of_step, {"org_id": org_id, "run_id": run_id, "seq": seq})
    return await cur.fetchone() is not None


class Effects:
    """The effect store of one engine: claims, leases and results of outside effects."""

    def __init__(self, pool: Pool, *, lease_seconds: float = 30.0, poll: float = 0.1) -> None:
        self.pool, self.lease_seconds, self.poll = pool, lease_seconds, poll

    async def _one(self, query: str, args: dict[str, Any]) -> dict[str, Any] | None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(query, args)
            row: dict[str, Any] | None = await cur.fetchone()
            return row

    async def read(self, org_id: str, key: str) -> dict[str, Any] | None:
        """The effect row as it stands (None if no attempt ever claimed it)."""
        return await self._one(Q.read, {"org_id": org_id, "effect_key": key})

    async def settle_found(
        self, step: StepContext, connector: Connector, found: dict[str, Any]
    ) -> dict[str, Any]:
        """Record a result found by reconciliation."""
        args = _who(step, step.effect_key, connector.provider)
        return await self._settle(args, found, reconciled=True)

    async def run(
        self,
        step: StepContext,
        connector: Connector,
        params: dict[str, Any],
        *,
        key: str | None = None,
        harmless_repeat: bool = False,
    ) -> dict[str, Any]:
        key = key or step.effect_key
        args = {**_who(step, key, connector.provider), "lease": self.lease_seconds}
        claiming = {**args, "note": _note(args, request=excerpt(params))}
        claimed = await self._one(Q.claim, claiming)
        token: int | None = claimed["owner_token"] if claimed else None
        while token is None:
            row = await self._one(Q.read, args)
            if row is None:
                if claimed and claimed["cancelled"]:
                    raise self._cancelled(key)
                # withdrawn between our claim and read: claim afresh
                claimed = await self._one(Q.claim, claiming)
                token = claimed["owner_token"] if claimed else None
                continue
            status = row["status"]
            if status == "settled":
                return dict(row["result"] or {})
            if status in ("review", "skipped"):
                raise self._review(key, connector, row)
            if status == "in_flight":
                if row["lease_live"]:
                    # Another attempt may be inside the provider call: do not overlap it.
                    await asyncio.sleep(min(self.poll, row["lease_left_s"] + 0.01))
                    continue
                await self._one(Q.lapse, {**args, "note": _note(args)})
                continue
            # outcome_unknown: the work may have happened.
            if connector.supports_reconcile:
                found = await connector.reconcile(key)
                if found is not None:
                    return await self._settle(args, found, reconciled=True)
            harmless = connector.repeat_is_harmless or harmless_repeat
            approved = row.get("retry_approved_by") is not None  # a person allowed one more
            if not connector.supports_idempotency and not harmless and not approved:
                parked = await self._one(
                    Q.park_for_review, {**args, "error": None, "note": _note(args)}
                )
                raise self._review(key, connector, parked or row)
            begun = await self._one(Q.begin_attempt, claiming)
            if begun and begun["cancelled"]:
                raise self._cancelled(key)  # reconciled above; never called again
            token = begun["owner_token"] if begun else None
        crash_point("effect.after_claim")
        result = await self._perform(args, token, key, connector, params)
        crash_point("effect.after_call")
        return await self._settle(args, result)

    async def _perform(
        self,
        args: dict[str, Any],
        token: int,
        key: str,
        connector: Connector,
        params: dict[str, Any],
    ) -> dict[str, Any]:
        stop_beat = asyncio.Event()
        beat = asyncio.create_task(self._heartbeat(args, token, stop_beat))
        try:
            with tracing.effect_span(connector.provider, key, token):
                return await connector.perform(key, params)
        except StepError as exc:
            failed = {**args, "token": token, "error": _error(exc)}
            failed["note"] = _note(args, error=excerpt(_error_of(exc)))
            if isinstance(exc, OutcomeUnknown):
                await self._one(Q.mark_unknown, failed)
            else:  # the provider answered: the work was not done
                gone = await self._one(Q.forget_attempt, failed)
                if gone is None:
                    await self._one(Q.back_to_unknown, failed)
            raise
        except asyncio.CancelledError:
            # Interrupted mid-call: write nothing now; the effect lease lapses into
            # outcome_unknown and the next attempt reconciles.
            raise
        except Exception as exc:
            note = _note(args, error=excerpt(_error_of(exc)))
            await self._one(
                Q.mark_unknown, {**args, "token": token, "error": _error(exc), "note": note}
            )
            raise OutcomeUnknown(f"effect {key}: {type(exc).__name__}: {exc}") from exc
        finally:
            stop_beat.set()
            beat.cancel()
            await asyncio.wait({beat}, timeout=1.0)  # bounded: see _heartbeat

    async def _heartbeat(self, args: dict[str, Any], token: int, stop: asyncio.Event) -> None:
        # The stop flag, not only cancel(): on Python 3.11 a cancel that lands while this loop
        # waits for a pooled connection can be swallowed (asyncio.wait_for inside the pool), and
        # a heartbeat that outlives its call keeps the effect lease alive for ever.
        while not stop.is_set():
            waiter = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({waiter}, timeout=self.lease_seconds / 3)
            finally:
                waiter.cancel()
            if stop.is_set():
                return
            with contextlib.suppress(Exception):
                await self._one(Q.heartbeat, {**args, "token": token})

    async def _settle(
        self, args: dict[str, Any], result: dict[str, Any], *, reconciled: bool = False
    ) -> dict[str, Any]:
        result = json.loads(json.dumps(result, default=str))
        note = _note(args, reference=reference_of(result), result=excerpt(result))
        row = await self._one(
            Q.settle,
            {
                **args,
                "result": Jsonb(result),
                "event": "effect_reconciled" if reconciled else "effect_settled",
                "note": note,
            },
        )
        if row is None:  # settled by someone else first: theirs is the recorded truth
            read = await self._one(Q.read, args)
            return dict(read["result"] or {}) if read else result
        return result

    async def unsettled(self, org_id: str, run_id: str, seq: int) -> bool:
        """Whether the step entry has an effect whose outcome is not recorded."""
        async with self.pool.connection() as conn:
            return await unsettled_of_step(conn, org_id, run_id, seq)

    @staticmethod
    def _cancelled(key: str) -> RunCancelled:
        return RunCancelled(
            f"effect {key}: not called, the run was cancelled", detail={"effect_key": key}
        )

    @staticmethod
    def _review(key: str, connector: Connector, row: dict[str, Any]) -> NeedsReview:
        known = {
            "effect_key": key,
            "provider": connector.provider,
            "first_attempt_at": str(row.get("first_attempt_at")),
            "attempts": row.get("attempts"),
            "last_error": row.get("last_error"),
        }
        return NeedsReview(
            f"effect {key}: the {connector.provider} call may have happened and the provider "
            "offers neither an idempotency key nor a search; a person must check "
            f"(first attempt {known['first_attempt_at']}, {known['attempts']} attempt(s))",
            detail=known,
        )


#: How a person may resolve an effect parked for review, and the query each one runs.
RESOLUTIONS = ("happened", "retry", "skip")


async def in_review(conn: Conn, org_id: str, run_id: str, seq: int) -> list[dict[str, Any]]:
    """The effects of one step entry that wait for a person, locked until the transaction ends."""
    cur = await conn.execute(Q.in_review, {"org_id": org_id, "run_id": run_id, "seq": seq})
    return list(await cur.fetchall())


def happened_result(reference: str, by: str) -> dict[str, Any]:
    """The result recorded for a call a person says happened: the provider's reference as its
    ``id`` (what the kinds read of a result, e.g. a message id), and who said so."""
    return {"id": reference, "reference": reference, "resolved": {"how": "happened", "by": by}}


async def resolve(
    conn: Conn, org_id: str, effect_key: str, how: str, *, by: str, reference: str | None = None
) -> bool:
    """A person's resolution of an effect in ``review``, in the caller's transaction:
    ``happened`` settles it with :func:`happened_result`; ``retry`` makes it
    ``outcome_unknown`` with one more attempt allowed under the same idempotency key;
    ``skip`` makes it ``skipped``. False: it is no longer in review (a late result settled
    it)."""
    args: dict[str, Any] = {"org_id": org_id, "effect_key": effect_key, "by": by}
    if how == "happened":
        if not reference:
            raise ValueError("a call that happened needs the provider's reference")
        query = Q.resolve_happened
        args["result"] = Jsonb(happened_result(reference, by))
    elif how == "retry":
        query = Q.resolve_retry
    elif how == "skip":
        query = Q.resolve_skip
    else:
        raise ValueError(f"unknown resolution {how!r}: one of {', '.join(RESOLUTIONS)}")
    cur = await conn.execute(query, args)
    return await cur.fetchone() is not None
