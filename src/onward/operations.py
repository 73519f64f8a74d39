"""Bulk operations over many runs (R11, R12, B2): cancel every run of an automation or a
filter, migrate a version's runs. An operation is a row (``operations``): its kind, its
parameters, a cursor (``after_run_id``), how many runs it has handled and the outcomes by kind.

:func:`drive` runs it in batches. Each batch -- the kind's batch function changing up to
``batch`` runs after the cursor, in run id order -- and the operation's progress commit in one
transaction, so a process stopped at any line leaves every run either handled or not and the
row's cursor says where to continue. A batch function is idempotent for a run it has already
handled (cancelling a cancelled run, migrating a migrated one, does nothing and says so), so a
resumed operation is safe even if two drivers overlap: they take turns on the row's lock
(``operations.sql take``) and each reads the cursor after taking it.

Passes: a batch function may answer ``deferred`` for a run it cannot handle now (its step is
in flight: a migration moves a run only at a safe point). When a scan reaches the end with runs
deferred in it, the operation starts another pass from the beginning of its cursor after
``pass_pause_s`` (a parameter, default :data:`PASS_PAUSE`), up to ``max_passes`` passes (default
:data:`MAX_PASSES`); the row shows the pass and the runs deferred in it. A deferred run counts
in ``done`` and ``outcomes`` once, as ``deferred``, only if it is still deferred in the last
pass. A kind that never defers (cancel) makes one pass.

A driver renews the operation's lease with every batch; an operation whose lease lapsed lost
its driver, and :func:`resume` (``onward operations resume``, or the elected sweeper through
:func:`resume_stale`) continues it.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from onward import audit, ids, pseudonyms
from onward.db import Conn, Pool, repeat_rolled_back
from onward.db.sql import Queries
from onward.errors import InvalidInput, UnknownOperation

Q = Queries(__package__, "operations.sql")

LEASE_SECONDS = 30.0
BATCH = 500
MAX_PASSES = 30  # passes over the runs while some are deferred (in flight)
PASS_PAUSE = 1.0  # seconds between two passes: the deferred runs' steps may settle meanwhile

# A batch: (conn, org_id, params, after_run_id, limit) -> the runs it handled, in run id
# order, each {"run_id": .., "outcome": .., ...}. Fewer than ``limit`` means finished.
BatchFn = Callable[[Conn, str, dict[str, Any], str, int], Awaitable[list[dict[str, Any]]]]

# The batch function of each kind, imported when first needed (the kinds' modules import this).
KINDS: dict[str, str] = {
    "cancel": "onward.cancel:cancel_batch",
    "migrate": "onward.run_migrations:migrate_batch",
}


def batch_function(kind: str) -> BatchFn:
    module, _, name = KINDS[kind].partition(":")
    fn: BatchFn = getattr(importlib.import_module(module), name)
    return fn


async def begin(
    pool: Pool, org_id: str, kind: str, params: dict[str, Any], *, requested_by: str
) -> dict[str, Any]:
    """Record a new operation (not yet driven)."""
    if kind not in KINDS:
        raise InvalidInput(f"unknown operation kind {kind!r}")
    async with pool.connection() as conn, conn.transaction():
        row = await (
            await conn.execute(
                Q.create,
                {
                    "org_id": org_id,
                    "operation_id": ids.new_operation_id(),
                    "kind": kind,
                    "params": json.dumps(params),
                    "requested_by": requested_by,
                    "lease": LEASE_SECONDS,
                },
            )
        ).fetchone()
        assert row is not None
        await audit.record(  # the request, with the operation it starts, in one transaction
            conn,
            org_id,
            actor=requested_by,
            action=AUDIT_ACTIONS[kind],
            target=row["operation_id"],
            detail=await _audit_detail(conn, org_id, params),
        )
    return dict(row)


AUDIT_ACTIONS = {"cancel": "cancel_many", "migrate": "migrate"}
_NOT_AUDITED = ("by", "reason", "max_passes", "pass_pause_s")


async def _audit_detail(conn: Conn, org_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """An operation's parameters for its audit row: a contact named by a filter appears as its
    pseudonym only (an erasure leaves no identifier in audit)."""
    detail = {k: v for k, v in params.items() if k not in _NOT_AUDITED and v is not None}
    if isinstance(detail.get("contact_id"), str):
        detail["contact_id"] = pseudonyms.digest(
            await pseudonyms.key(conn, org_id), detail["contact_id"]
        )
    return detail


async def drive(
    pool: Pool,
    org_id: str,
    operation_id: str,
    *,
    batch: int = BATCH,
    on_batch: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
    results: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run the operation's batches until it is done; returns its final row. ``on_batch`` sees
    the row after each batch and that batch's per-run results (progress for a CLI or a
    stream); ``results``, if given, collects every per-run result. A batch the database chose
    as a deadlock's victim rolled back whole, its progress too: it is taken again
    (``db.repeat_rolled_back``)."""
    while True:
        row, handled, again, params = await repeat_rolled_back(
            lambda: _batch(pool, org_id, operation_id, batch)
        )
        if row is None:
            return await get(pool, org_id, operation_id)
        if results is not None:
            results.extend(handled)
        if on_batch is not None:
            on_batch(dict(row), handled)
        if row["status"] != "running":
            return dict(row)
        if again:
            await asyncio.sleep(float(params.get("pass_pause_s", PASS_PAUSE)))


async def _batch(
    pool: Pool, org_id: str, operation_id: str, batch: int
) -> tuple[Any, list[dict[str, Any]], bool, dict[str, Any]]:
    """One batch of the operation in one transaction: its row after the batch (None: nothing
    left to take), the per-run results, whether another pass follows, its parameters."""
    async with pool.connection() as conn, conn.transaction():
        op = await (
            await conn.execute(Q.take, {"org_id": org_id, "operation_id": operation_id})
        ).fetchone()
        if op is None:
            return None, [], False, {}
        fn = batch_function(op["kind"])
        try:
            handled = await fn(conn, org_id, op["params"], op["after_run_id"], batch)
        except InvalidInput as exc:
            raise _Failed(str(exc)) from exc
        outcomes: dict[str, int] = {}
        for r in handled:
            if r["outcome"] != "deferred":
                outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        deferred = op["deferred"] + sum(1 for r in handled if r["outcome"] == "deferred")
        scanned = len(handled) < batch
        params = op["params"]
        again = scanned and deferred > 0 and op["pass"] < params.get("max_passes", MAX_PASSES)
        finished = scanned and not again
        if finished and deferred:
            outcomes["deferred"] = deferred  # still deferred in the last pass
        row = await (
            await conn.execute(
                Q.progress,
                {
                    "org_id": org_id,
                    "operation_id": operation_id,
                    "after_run_id": ""
                    if again
                    else (handled[-1]["run_id"] if handled else op["after_run_id"]),
                    "n": sum(outcomes.values()),
                    "outcomes": json.dumps(outcomes),
                    "finished": finished,
                    "next_pass": again,
                    "deferred": 0 if again else deferred,
                    "lease": LEASE_SECONDS,
                },
            )
        ).fetchone()
    assert row is not None
    return row, handled, again, params


class _Failed(Exception):
    pass


async def run(
    pool: Pool,
    org_id: str,
    kind: str,
    params: dict[str, Any],
    *,
    requested_by: str,
    batch: int = BATCH,
    on_batch: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
    results: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Begin and drive an operation to its end. A batch function's ``InvalidInput`` (the
    parameters no longer hold) marks the operation failed, with its reason, and is raised."""
    op = await begin(pool, org_id, kind, params, requested_by=requested_by)
    return await _drive_or_fail(pool, org_id, op["operation_id"], batch, on_batch, results)


async def resume(
    pool: Pool,
    org_id: str,
    operation_id: str,
    *,
    batch: int = BATCH,
    on_batch: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
) -> dict[str, Any]:
    """Continue an operation from its cursor (its driver died, or was stopped)."""
    await get(pool, org_id, operation_id)  # NotFound
    return await _drive_or_fail(pool, org_id, operation_id, batch, on_batch, None)


async def _drive_or_fail(
    pool: Pool,
    org_id: str,
    operation_id: str,
    batch: int,
    on_batch: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None,
    results: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    try:
        return await drive(
            pool, org_id, operation_id, batch=batch, on_batch=on_batch, results=results
        )
    except _Failed as exc:
        async with pool.connection() as conn:
            await conn.execute(
                Q.fail, {"org_id": org_id, "operation_id": operation_id, "error": str(exc)}
            )
        raise InvalidInput(str(exc)) from None


async def resume_stale(pool: Pool, org_id: str, *, limit: int = 5) -> list[dict[str, Any]]:
    """Continue the operations of this organisation whose driver died (the sweeper's call)."""
    async with pool.connection() as conn:
        rows = await (await conn.execute(Q.stale, {"org_id": org_id, "limit": limit})).fetchall()
    done = []
    for row in rows:
        try:
            done.append(await resume(pool, org_id, row["operation_id"]))
        except InvalidInput:
            continue  # recorded as failed with its reason
    return done


async def stale_orgs(pool: Pool, *, limit: int = 20) -> list[str]:
    """The organisations with an operation whose driver died (the sweeper resumes them)."""
    async with pool.connection() as conn:
        rows = await (await conn.execute(Q.stale_orgs, {"limit": limit})).fetchall()
    return [r["org_id"] for r in rows]


async def get(pool: Pool, org_id: str, operation_id: str) -> dict[str, Any]:
    async with pool.connection() as conn:
        row = await (
            await conn.execute(Q.get, {"org_id": org_id, "operation_id": operation_id})
        ).fetchone()
    if row is None:
        raise UnknownOperation(org_id, operation_id)
    return dict(row)


async def list_operations(pool: Pool, org_id: str, *, limit: int = 50) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        rows = await (await conn.execute(Q.list, {"org_id": org_id, "limit": limit})).fetchall()
    return [dict(r) for r in rows]
