"""Starting runs, once per start key (R1), with their first wake in the outbox (R2).

The start key comes from the provider's event id when there is one
(``<automation_id>:<event_id>``); otherwise from a hash of the payload, which is weaker: two
genuinely separate submissions with identical content collapse into one run. A caller may also
pass its own key. A second start with the same key is acknowledged as a duplicate, not an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from onward import audit, erasure, ids, metrics, tracing
from onward.automations.versions import VersionCache
from onward.crashpoints import crash_point
from onward.db import Pool
from onward.db.sql import Queries
from onward.errors import InvalidInput, PayloadTooLarge, UnknownAutomation
from onward.inputs import check_storable, check_text
from onward.kinds import Registry

Q = Queries(__package__, "start.sql")

#: The longest ids a start takes, in characters; the API and the CLI refuse longer ones too.
MAX_EVENT_ID = 256
MAX_KEY = 512
MAX_CONTACT_ID = 320


@dataclass(frozen=True)
class Started:
    run_id: str
    created: bool  # False: a duplicate delivery of a start that already made this run
    start_key: str


def start_key_for(
    automation_id: str, payload: Any, event_id: str | None, key: str | None
) -> tuple[str, str]:
    if key:
        return key, "caller"
    if event_id:
        return ids.event_start_key(automation_id, event_id), "event"
    return ids.payload_start_key(automation_id, payload), "payload_hash"


async def start_run(
    pool: Pool,
    org_id: str,
    automation_id: str,
    payload: dict[str, Any],
    *,
    event_id: str | None = None,
    key: str | None = None,
    version: int | None = None,
    contact_id: str | None = None,
    max_payload_bytes: int = 256 * 1024,
    registry: Registry | None = None,
    versions: VersionCache | None = None,
    traceparent: str | None = None,
) -> Started:
    """Start a run of the latest (or given) version: one statement, one commit, for a new run
    and for a duplicate whose run committed before (one more statement for a duplicate that
    raced its original). ``registry`` and ``versions`` are accepted for callers
    that pass them; the version's first step was resolved when it was published.
    ``traceparent``: the W3C trace context of the request that asked for the run, kept so its
    steps continue that trace (``onward.tracing``; an invalid one is ignored)."""
    # What PostgreSQL would refuse mid-statement (NUL, lone surrogates, NaN, too deep) is
    # refused here, whole, before anything is written.
    limits = (
        ("automation id", automation_id, None),
        ("event id", event_id, MAX_EVENT_ID),
        ("key", key, MAX_KEY),
        ("contact id", contact_id, MAX_CONTACT_ID),
    )
    for what, text, longest in limits:
        if text is None:
            continue
        check_text(text, what)
        if longest is not None and len(text) > longest:
            raise InvalidInput(f"{what}: at most {longest} characters ({len(text)} given)")
    if not isinstance(payload, dict):
        raise InvalidInput(f"the payload must be a JSON object, not {type(payload).__name__}")
    # max_bytes: a structure that shares one sub-list many times stops here, early, instead of
    # being expanded by json.dumps below
    check_storable(payload, "the payload", max_bytes=4 * max_payload_bytes)
    size = len(json.dumps(payload, default=str).encode())
    if size > max_payload_bytes:
        raise PayloadTooLarge(size, max_payload_bytes)
    start_key, kind = start_key_for(automation_id, payload, event_id, key)
    args = {
        "org_id": org_id,
        "run_id": ids.new_run_id(),
        "automation_id": automation_id,
        "version": version,
        "start_key": start_key,
        "start_key_kind": kind,
        "input": Jsonb(payload),
        "contact_id": contact_id,
        "traceparent": tracing.valid_traceparent(traceparent),
    }
    async with pool.connection() as conn:
        if contact_id is None:
            row = await (await conn.execute(Q.start_run, args)).fetchone()
        else:  # refused if the contact was erased; ordered with an erasure by its lock
            async with conn.transaction():
                await erasure.check_start(conn, org_id, contact_id)
                row = await (await conn.execute(Q.start_run, args)).fetchone()
        if row is not None and row["created"]:
            crash_point("start.after_commit")
            metrics.run_started(True)
            return Started(row["run_id"], True, start_key)
        if row is not None:  # a duplicate, recorded by the same statement
            metrics.run_started(False)
            return Started(row["run_id"], False, start_key)
        # Conflict with a run committed while the statement ran (a fresh statement sees it), or
        # no such automation or version.
        cur = await conn.execute(Q.find_duplicate, {"org_id": org_id, "start_key": start_key})
        dup = await cur.fetchone()
    if dup is None:
        what = f"version {version} of " if version else ""
        raise UnknownAutomation(f"no published {what}automation {automation_id!r} in {org_id!r}")
    metrics.run_started(False)
    return Started(dup["run_id"], False, start_key)


@dataclass(frozen=True)
class ForkPlan:
    """Where a fork starts: the run it comes from, the step entry it starts at (same ``seq``,
    its ``iteration``), that step's kind and lane in ``version``, and what the run knew before
    it (``ctx``: variables and step outputs; ``visits``: entries per step id)."""

    from_run_id: str
    automation_id: str
    version: int
    seq: int
    step_id: str
    kind: str
    lane: str
    iteration: int
    ctx: dict[str, Any]
    visits: dict[str, int]


async def fork_run(pool: Pool, org_id: str, plan: ForkPlan, *, by: str) -> Started:
    """Start the fork ``plan`` describes (one statement, one commit; ``start.sql fork_run``):
    a new run linked to the old one (``runs.forked_from``), with copies of the steps before the
    chosen one and ``run_forked`` in both runs' history. Its start key
    (``ids.fork_start_key``) makes a repeat return the first fork (``created`` False)."""
    start_key = ids.fork_start_key(plan.from_run_id, plan.seq, plan.version)
    args = {
        "org_id": org_id,
        "run_id": ids.new_run_id(),
        "from_run_id": plan.from_run_id,
        "automation_id": plan.automation_id,
        "version": plan.version,
        "start_key": start_key,
        "seq": plan.seq,
        "step_id": plan.step_id,
        "kind": plan.kind,
        "lane": plan.lane,
        "iteration": plan.iteration,
        "ctx": Jsonb(plan.ctx),
        "visits": Jsonb(plan.visits),
        "by": by,
    }
    async with pool.connection() as conn:
        async with conn.transaction():  # the fork and its audit row commit together
            row = await (await conn.execute(Q.fork_run, args)).fetchone()
            if row is not None:
                await audit.record(
                    conn,
                    org_id,
                    actor=by,
                    action="fork",
                    target=plan.from_run_id,
                    detail={"run_id": row["run_id"], "step": plan.step_id, "version": plan.version},
                )
        if row is not None:
            metrics.run_started(True)
            return Started(row["run_id"], True, start_key)
        dup = await (
            await conn.execute(Q.find_duplicate, {"org_id": org_id, "start_key": start_key})
        ).fetchone()
    if dup is None:
        raise UnknownAutomation(
            f"no published version {plan.version} of automation {plan.automation_id!r}"
        )
    return Started(dup["run_id"], False, start_key)
