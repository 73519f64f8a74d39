"""Migrating runs between versions (R11).

A run finishes on the version it started on: publishing version 4 changes nothing for the runs
of version 3 (a published version is immutable, in the database too: migration 0008's trigger
refuses UPDATE and DELETE of a version row). Moving runs is explicit::

    onward runs migrate --automation A --from 3 --to 4 --map old:new,... \\
        --removed-step-policy park|skip-to:STEP|cancel [--dry-run]

**The step map.** A step keeps its id across versions when it means the same thing, so a step
whose id exists in both versions maps to itself unless the map says otherwise; ``--map old:new``
names the new step of an old step whose id changed (or overrides the default).

**Refused before any run moves** (``MigrationRefused``, every problem listed): the automation
or either version unknown; from == to; a map naming a step id the old version (left side) or
the new version (right side) does not have, or an old step twice; a policy other than park,
skip-to:STEP or cancel, or a skip-to step the new version does not have; and a **reachable
step left unmapped**: a step of the old version

* that some unfinished run of the old version is at now, or can still enter from where it is
  (following the old version's edges: static ``next``, branch cases and default, goto targets,
  a kind's declared successors), and
* whose id the new version does not have, and the map does not name, and no removed-step
  policy was given.

(Publishing refuses a step no path from ``start`` reaches, so every step of a version is
reachable from its start; what matters is where the runs *are*: a step every unfinished run is
past, and that none can come back to, needs no mapping.) A run found at an unmapped step later
-- a run started on the old version meanwhile, with no policy -- is left on its version
(outcome ``unmapped``).

**Moving one run** (one transaction, under the run's transition lock, its timers, its step and
its run row -- the order of every transition on a run; one history row ``run_migrated`` with
from, to, map, policy, by, and the step's move):

* ``runs.version`` becomes the new version; the run's budget comes from it (``max_steps``,
  ``deadline_at`` = created + the new ``max_age``); the outputs (``ctx.steps``) and visit counts
  of renamed steps are copied under their new ids, so the new version's expressions and loop
  counts find them;
* its unfinished step takes its new id, kind and lane (resolved like publish and advance do:
  the step's lane, else its kind's, else ``io``) and ``steps.version`` (what the claim reads);
  its status, attempt, failures, iteration and available_at stay. A ``ready`` step whose lane
  changed is announced again in the new lane (make_ready/announce_ready);
* a ``waiting`` step keeps its wait -- its timer (instant, intent, wake number), its signal
  names, its pending approval -- when its definition did not change in a way that matters to
  a wait: the same kind, the same parameters (``with``) and the same lane. Its next step is read
  from the new version when it wakes. Otherwise the wait is **re-entered**: its timers close
  (``fired_by = 'migrated'``), a pending approval is cancelled (a click on it is refused), and
  the step is ready, woken by nothing, so the new definition's handler runs from its start (a
  ``wait_for`` waits its new duration from the migration; a ``wait_signal`` takes a signal that
  is already pending);
* a ``parked`` step stays parked (for its reason) under its new id;
* a step whose id has no counterpart (removed, unmapped) follows the policy:

  - ``park``: the run stays on its version; its step and the run park for a person
    (``wait_kind = 'migration'``, history ``step_parked``/``run_parked`` with the reason). Its
    timers close. An operator resumes it (it then finishes on its old version), cancels it, or
    migrates it again with ``skip-to``;
  - ``skip-to:STEP``: the step ends ``skipped`` (``step_skipped``), the run moves, and STEP of
    the new version is its next step, ``ready``, announced through the shared
    make-ready/announce fragments so a worker wakes;
  - ``cancel``: ``onward.cancel.cancel_in_tx`` cancels the run on its version.

**Safe points.** A run with its step in flight (``running``) is not moved: the batch answers
``deferred`` and the operation makes another pass over the version's runs after a pause, until
none is deferred or the passes run out (``onward.operations``: ``max_passes``, default 30,
``pass_pause_s``, default 1 s); a run still in flight then is reported ``deferred`` and stays on
its version (run the migration again). A run between two steps (no unfinished step: a worker's
settle is committing) is deferred the same way. **An outside effect** is keyed by
``<run_id>/<step_id>/<iteration>``: a step whose id changes (a rename, or a removal with
skip-to) while its effect is recorded but unresolved (``in_flight``, ``outcome_unknown``,
``review``) -- or, for a rename, settled while the step is unfinished -- is deferred too, so no
effect loses its idempotency key.

Outcomes per run: ``moved``, ``reentered``, ``skipped_to``, ``parked``, ``cancelled``,
``deferred``, ``unmapped``, ``already_parked``, ``already_moved``, ``already_finished``.

A dry run describes the same decisions, per run (from step -> to step, the policy applied, or
deferred and why), and changes nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from onward import approvals, cancel, operations, signals, timers
from onward.automations.document import AutomationDoc, StepDef
from onward.crashpoints import crash_point
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import InvalidInput, MigrationRefused
from onward.kinds import Registry

Q = Queries(__package__, "run_migrations.sql")

POLICIES = ("park", "skip-to", "cancel")
OUTCOMES = (
    "moved",
    "reentered",
    "skipped_to",
    "parked",
    "cancelled",
    "deferred",
    "unmapped",
    "already_parked",
    "already_moved",
    "already_finished",
)
WORKER = "migration"
UNRESOLVED_EFFECT = ("in_flight", "outcome_unknown", "review")
DRY_RUN_LIST = 1000  # the most runs a dry run lists one by one (all are counted)


# -- parsing what a person typed -------------------------------------------------------------


def parse_map(text: str | None) -> dict[str, str]:
    """``old:new,old2:new2`` -> ``{"old": "new", ...}``; InvalidInput names a bad pair."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        old, sep, new = part.partition(":")
        if not sep or not old.strip() or not new.strip():
            raise InvalidInput(f"--map: {part!r} is not old:new")
        if old.strip() in out:
            raise InvalidInput(f"--map: step {old.strip()!r} is mapped twice")
        out[old.strip()] = new.strip()
    return out


def parse_policy(text: str | None) -> tuple[str | None, str | None]:
    """``park`` | ``skip-to:STEP`` | ``cancel`` (or None) -> ``(policy, skip_to)``."""
    if text is None or not text.strip():
        return None, None
    name, _, target = text.strip().partition(":")
    if name == "skip-to":
        return name, target.strip() or None
    return name, None


# -- the plan: validated once, before any run moves ------------------------------------------


def _lane(step: StepDef, registry: Registry) -> str:
    spec = registry.get(step.kind)
    return step.lane or (spec.lane if spec else "io")


def _edges(doc: AutomationDoc, registry: Registry) -> dict[str, list[str]]:
    edges: dict[str, list[str]] = {}
    for step in doc.steps:
        spec = registry.get(step.kind)
        targets: list[str] = [step.next] if step.next else []
        if spec is not None:
            # parameters this process parses differently: the static next only
            with contextlib.suppress(Exception):
                targets = list(spec.successors(step, spec.parse_params(step.params)))
        edges[step.id] = [t for t in targets if t]
    return edges


def reachable(doc: AutomationDoc, registry: Registry, current: set[str]) -> set[str]:
    """The steps of ``doc`` a run at one of ``current`` is at or can still enter."""
    edges = _edges(doc, registry)
    seen: set[str] = set()
    frontier = [s for s in current if s in edges]
    while frontier:
        step = frontier.pop()
        if step not in seen:
            seen.add(step)
            frontier.extend(t for t in edges.get(step, []) if t not in seen)
    return seen


def _target(step: StepDef, registry: Registry) -> dict[str, Any]:
    return {"step_id": step.id, "kind": step.kind, "lane": _lane(step, registry)}


def _same_for_a_wait(old: StepDef, new: StepDef, registry: Registry) -> bool:
    """Does a waiting step keep its wait? The same kind, parameters and lane."""
    return (
        old.kind == new.kind
        and json.dumps(old.params, sort_keys=True) == json.dumps(new.params, sort_keys=True)
        and _lane(old, registry) == _lane(new, registry)
    )


async def plan(
    pool: Pool,
    org_id: str,
    registry: Registry,
    *,
    automation_id: str,
    from_version: int,
    to_version: int,
    step_map: Mapping[str, str] | None,
    removed_step_policy: str | None,
    by: str,
) -> dict[str, Any]:
    """Validate a migration and answer its parameters (what every batch reads; the operation
    stores them). Raises ``MigrationRefused`` with every problem; nothing is written."""
    problems: list[str] = []
    step_map = dict(step_map or {})
    policy, skip_to = parse_policy(removed_step_policy)
    if policy is not None and policy not in POLICIES:
        problems.append(
            f"removed-step policy {removed_step_policy!r}: choose park, skip-to:STEP or cancel"
        )
    if policy == "skip-to" and skip_to is None:
        problems.append("removed-step policy skip-to names no step (skip-to:STEP)")
    if from_version == to_version:
        problems.append(f"from and to are the same version ({from_version}): nothing to move")
    async with pool.connection() as conn:
        rows = await (
            await conn.execute(
                Q.versions,
                {
                    "org_id": org_id,
                    "automation_id": automation_id,
                    "versions": [from_version, to_version],
                },
            )
        ).fetchall()
        found = {r["version"]: r for r in rows}
        for v, what in ((from_version, "from"), (to_version, "to")):
            if v not in found:
                problems.append(
                    f"{what} version {v} of automation {automation_id!r} is not published"
                )
        if from_version not in found or to_version not in found:
            raise MigrationRefused(problems)
        current = {
            r["step_id"]
            for r in await (
                await conn.execute(
                    Q.current_steps,
                    {"org_id": org_id, "automation_id": automation_id, "version": from_version},
                )
            ).fetchall()
        }
    old = AutomationDoc.model_validate(found[from_version]["document"])
    new = AutomationDoc.model_validate(found[to_version]["document"])
    old_ids, new_ids = {s.id for s in old.steps}, {s.id for s in new.steps}
    for o, n in step_map.items():
        if o not in old_ids:
            problems.append(f"map {o}:{n}: version {from_version} has no step {o!r}")
        if n not in new_ids:
            problems.append(f"map {o}:{n}: version {to_version} has no step {n!r}")
    if skip_to is not None and skip_to not in new_ids:
        problems.append(f"skip-to:{skip_to}: version {to_version} has no step {skip_to!r}")
    live = reachable(old, registry, current)
    steps: dict[str, dict[str, Any]] = {}
    for step in old.steps:
        to = step_map.get(step.id) or (step.id if step.id in new_ids else None)
        if to is not None and to in new_ids:
            target = new.step(to)
            steps[step.id] = {
                "action": "move",
                **_target(target, registry),
                "same_wait": _same_for_a_wait(step, target, registry),
            }
        elif to is None:
            steps[step.id] = {"action": "removed" if policy else "unmapped"}
            if policy is None and step.id in live:
                problems.append(
                    f"step {step.id!r} of version {from_version} is reachable (an unfinished "
                    f"run is at it or can enter it) and version {to_version} has no such step: "
                    "map it (--map old:new) or give a removed-step policy"
                )
    if problems:
        raise MigrationRefused(problems)
    renames = {o: n for o, n in step_map.items() if o != n}
    skip = new.step(skip_to) if skip_to is not None else None
    return {
        "automation_id": automation_id,
        "from": from_version,
        "to": to_version,
        "map": step_map,
        "policy": policy,
        "skip_to": _target(skip, registry) if skip is not None else None,
        "by": by,
        "steps": steps,
        "renames": renames,
        "budget": {
            "max_steps": found[to_version]["max_steps"],
            "max_age_s": found[to_version]["max_age_s"],
        },
    }


def policy_text(params: Mapping[str, Any]) -> str | None:
    if params.get("policy") == "skip-to" and params.get("skip_to"):
        return f"skip-to:{params['skip_to']['step_id']}"
    policy: str | None = params.get("policy")
    return policy


# -- one run's decision (shared by the batch and the dry run) --------------------------------


@dataclass(frozen=True)
class Decision:
    """What happens to one run: ``action`` is move, reenter, skip_to, park, cancel, defer,
    unmapped or already_parked; ``to_step`` its step in the new version, if any."""

    action: str
    reason: str
    to_step: str | None = None


def decide(step: Mapping[str, Any] | None, params: Mapping[str, Any]) -> Decision:
    """``step``: the run's unfinished step (``step_id``, ``step_status``, ``wait_kind``,
    ``effect``) or None."""
    if step is None or step.get("step_id") is None:
        return Decision("defer", "between two steps (a settle is committing)")
    sid, status, effect = step["step_id"], step["step_status"], step.get("effect")
    if status == "running":
        return Decision("defer", f"step {sid!r} is in flight (running): moved at a safe point")
    entry = params["steps"].get(sid) or {"action": "removed" if params.get("policy") else ""}
    if entry["action"] == "move":
        to = entry["step_id"]
        if to != sid and effect is not None:
            return Decision(
                "defer",
                f"step {sid!r} has an outside effect ({effect}) keyed by its id: renaming it "
                "now would lose its idempotency key",
            )
        if status == "waiting" and not entry["same_wait"]:
            return Decision(
                "reenter", f"{sid} -> {to}: its wait's definition changed: the wait re-enters", to
            )
        keeps = "keeps its wait" if status == "waiting" else f"stays {status}"
        return Decision("move", f"{sid} -> {to} ({keeps})", to)
    if entry["action"] != "removed":
        return Decision("unmapped", f"step {sid!r} is neither kept, mapped nor covered by a policy")
    policy = params.get("policy")
    if policy == "park":
        if status == "parked" and step.get("wait_kind") == "migration":
            return Decision("already_parked", f"step {sid!r}: already parked by a migration")
        return Decision("park", f"step {sid!r} removed in version {params['to']}: parked")
    if policy == "skip-to":
        to = params["skip_to"]["step_id"]
        if effect in UNRESOLVED_EFFECT:
            return Decision(
                "defer", f"step {sid!r} has an unresolved outside effect ({effect}): not skipped"
            )
        return Decision("skip_to", f"step {sid!r} removed: skipped to {to}", to)
    return Decision("cancel", f"step {sid!r} removed in version {params['to']}: cancelled")


OUTCOME_OF = {
    "move": "moved",
    "reenter": "reentered",
    "skip_to": "skipped_to",
    "park": "parked",
    "cancel": "cancelled",
    "defer": "deferred",
    "unmapped": "unmapped",
    "already_parked": "already_parked",
}


# -- moving runs -----------------------------------------------------------------------------


def _renamed(value: Any, renames: Mapping[str, str]) -> dict[str, Any]:
    """A mapping keyed by step id with each renamed step's entry copied under its new id."""
    out = dict(value or {})
    for old, new in renames.items():
        if old in out and new not in out:
            out[new] = out[old]
    return out


async def migrate_batch(
    conn: Conn, org_id: str, params: dict[str, Any], after_run_id: str, limit: int
) -> list[dict[str, Any]]:
    """One batch of a migration (``operations`` kind ``migrate``), in the operation's
    transaction: the next ``limit`` unfinished runs of the old version, each moved (or handled
    by the policy, or deferred)."""
    rows = await (
        await conn.execute(
            Q.page,
            {
                "org_id": org_id,
                "automation_id": params["automation_id"],
                "version": params["from"],
                "after": after_run_id,
                "limit": limit,
            },
        )
    ).fetchall()
    out = [await migrate_run(conn, org_id, row["run_id"], params) for row in rows]
    if out:
        crash_point("migrate.in_batch")
    return out


async def migrate_run(
    conn: Conn, org_id: str, run_id: str, params: Mapping[str, Any]
) -> dict[str, Any]:
    """Move one run inside the caller's transaction (idempotent: a run already moved, or
    finished, is left alone and says so)."""
    args = {"org_id": org_id, "run_id": run_id}
    await signals.lock_run(conn, org_id, run_id)
    await timers.lock_pending_of_run(conn, org_id, run_id)
    step = await (await conn.execute(Q.lock_step, args)).fetchone()
    run = await (await conn.execute(Q.lock_run, args)).fetchone()
    answer: dict[str, Any] = {"run_id": run_id}
    if run is None or run["finished_at"] is not None:
        return {**answer, "outcome": "already_finished"}
    if run["version"] != params["from"]:
        return {**answer, "outcome": "already_moved", "version": run["version"]}
    d = decide(step, params)
    answer.update(
        outcome=OUTCOME_OF[d.action],
        reason=d.reason,
        from_step=step["step_id"] if step else None,
        to_step=d.to_step,
    )
    if d.action in ("defer", "unmapped", "already_parked"):
        return answer
    assert step is not None
    seq = step["seq"]
    by = params.get("by") or "operator"
    if d.action == "cancel":
        done = await cancel.cancel_in_tx(
            conn, org_id, run_id, by=by, reason=d.reason, worker=WORKER
        )
        return {**answer, "outcome": done["outcome"]}
    if d.action == "park":
        await timers.close_for_run(conn, org_id, run_id, fired_by="migration")
        await approvals.cancel_pending(conn, org_id, run_id)
        error = {
            "message": d.reason,
            "migration": {"from": params["from"], "to": params["to"], "by": by},
        }
        await conn.execute(
            Q.park,
            {**args, "seq": seq, "error": Jsonb(error), "reason": d.reason, "worker": WORKER},
        )
        return answer
    detail = {
        "from": params["from"],
        "to": params["to"],
        "map": params.get("map") or {},
        "policy": policy_text(params),
        "by": by,
        "from_step": step["step_id"],
        "to_step": d.to_step,
        "how": d.action,
    }
    renames = params.get("renames") or {}
    ctx = dict(run["ctx"] or {})
    outputs = {
        r["step_id"]: r["output"] for r in await (await conn.execute(Q.outputs, args)).fetchall()
    }
    ctx["steps"] = _renamed({**outputs, **(ctx.get("steps") or {})}, renames)
    visits = _renamed(run["visits"], renames)
    to = params["to"]
    skip = params.get("skip_to") if d.action == "skip_to" else None
    entry = skip or params["steps"][step["step_id"]]
    iteration = int(visits.get(entry["step_id"], 0)) + 1 if skip else None
    if iteration is not None:
        visits[entry["step_id"]] = iteration
    status = {"waiting": "waiting", "parked": "parked"}.get(step["step_status"], "active")
    if d.action in ("reenter", "skip_to"):
        status = "active"
    moved = await (
        await conn.execute(
            Q.move_run,
            {
                **args,
                "from": params["from"],
                "to": to,
                "max_steps": params["budget"]["max_steps"],
                "max_age_s": params["budget"]["max_age_s"],
                "ctx": Jsonb(ctx),
                "visits": Jsonb(visits),
                "current_seq": seq + 1 if skip else run["current_seq"],
                "status": status,
                "seq": seq,
                "step_id": step["step_id"],
                "worker": WORKER,
                "detail": Jsonb(detail),
            },
        )
    ).fetchone()
    assert moved is not None  # locked above: on the old version, unfinished
    note = {"migrated": {"from": params["from"], "to": to}}
    if skip:
        await timers.close_for_run(conn, org_id, run_id, fired_by="migrated")
        await approvals.cancel_pending(conn, org_id, run_id)
        await conn.execute(
            Q.skip_step,
            {**args, "seq": seq, "worker": WORKER, "detail": Jsonb({**note, "skip_to": d.to_step})},
        )
        await conn.execute(
            Q.enter_step,
            {
                **args,
                "seq": seq + 1,
                "step_id": skip["step_id"],
                "kind": skip["kind"],
                "lane": skip["lane"],
                "iteration": iteration,
                "to": to,
                "worker": WORKER,
                "detail": Jsonb({"lane": skip["lane"], "iteration": iteration, **note}),
            },
        )
        return answer
    await conn.execute(
        Q.move_step,
        {
            **args,
            "seq": seq,
            "step_id": entry["step_id"],
            "kind": entry["kind"],
            "lane": entry["lane"],
            "to": to,
        },
    )
    if d.action == "reenter":
        await timers.close_for_run(conn, org_id, run_id, fired_by="migrated")
        await approvals.cancel_pending(conn, org_id, run_id)
        await conn.execute(
            Q.reenter,
            {**args, "seq": seq, "worker": WORKER, "detail": Jsonb({**note, "reentered": True})},
        )
    elif step["step_status"] == "ready" and entry["lane"] != step["lane"]:
        await conn.execute(
            Q.announce,
            {
                **args,
                "seq": seq,
                "worker": WORKER,
                "detail": Jsonb({"lane": entry["lane"], **note}),
            },
        )
    return answer


# -- the whole migration ---------------------------------------------------------------------


async def dry_run(
    pool: Pool, org_id: str, params: Mapping[str, Any], *, limit: int = DRY_RUN_LIST
) -> dict[str, Any]:
    """What a migration would do to each unfinished run of the old version, and why; changes
    nothing. Lists the first ``limit`` runs; counts them all."""
    counts: dict[str, int] = {}
    listed: list[dict[str, Any]] = []
    after = ""
    async with pool.connection() as conn:
        while True:
            rows = await (
                await conn.execute(
                    Q.page,
                    {
                        "org_id": org_id,
                        "automation_id": params["automation_id"],
                        "version": params["from"],
                        "after": after,
                        "limit": 1000,
                    },
                )
            ).fetchall()
            for row in rows:
                d = decide(row if row["step_id"] is not None else None, params)
                outcome = OUTCOME_OF[d.action]
                counts[outcome] = counts.get(outcome, 0) + 1
                if len(listed) < limit:
                    listed.append(
                        {
                            "run_id": row["run_id"],
                            "status": row["status"],
                            "step_status": row["step_status"],
                            "from_step": row["step_id"],
                            "to_step": d.to_step,
                            "outcome": outcome,
                            "reason": d.reason,
                        }
                    )
            if len(rows) < 1000:
                break
            after = rows[-1]["run_id"]
    return {
        **summary(params),
        "dry_run": True,
        "runs": sum(counts.values()),
        "outcomes": counts,
        "plan": listed,
    }


def summary(params: Mapping[str, Any]) -> dict[str, Any]:
    """What a migration was asked: automation, from, to, map, policy."""
    return {
        "automation_id": params["automation_id"],
        "from": params["from"],
        "to": params["to"],
        "map": params.get("map") or {},
        "removed_step_policy": policy_text(params),
    }


async def begin(pool: Pool, org_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """Record the migration as an operation (validated already by :func:`plan`); drive it with
    ``operations.drive`` (or resume it)."""
    return await operations.begin(pool, org_id, "migrate", params, requested_by=params["by"])


async def migrate(
    pool: Pool,
    org_id: str,
    params: dict[str, Any],
    *,
    batch: int = operations.BATCH,
    on_batch: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
    results: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Move every unfinished run of the old version, in batches (an ``operations`` row with
    its progress); returns the operation's final row."""
    return await operations.run(
        pool,
        org_id,
        "migrate",
        params,
        requested_by=params["by"],
        batch=batch,
        on_batch=on_batch,
        results=results,
    )
