"""Operator actions (B2/B3): what a person does to a run the engine cannot move on its own.

* **Resolve a review** (:func:`resolve_review`): a step parked ``review`` because an outside
  call's outcome could not be settled safely (its effect is in ``review``: no reconcile hit, no
  provider idempotency). The person checked with the provider and says:

  - ``happened`` with the provider's reference: the effect settles with that result
    (``effects.happened_result``) and the step runs again; its kind finds the settled effect
    and returns it without calling the provider, so the step advances as if the call had
    returned it (an ``email.send`` step's output then names the reference as its message id);
  - ``retry``: the effect allows one more attempt under the **same idempotency key** and the
    step runs again, calling the provider once more (a second uncertain outcome parks again);
  - ``skip``: the effect is never called again; the step ends ``skipped`` without running its
    kind and the run goes on to its next step (``policy.skipped_by_operator``, at the claim).

* **Resume** (:func:`resume`): a step parked for a reason a person may override. Which wait
  kinds, and why:

  - ``reconnect`` -- only once its connection is usable again: resuming while it is still
    broken would park again at once without a call, so that is refused and names the restore
    (which resumes every step parked on the connection itself);
  - ``budget`` -- it reserves again when it runs and parks again if still no room (as the
    renewal does); a person may know the budget was raised elsewhere;
  - ``circuit`` -- only when its circuit is no longer open or half-open (its own probe resumes
    it otherwise; a call through an open circuit is not made);
  - ``migration`` -- only if the step's id is in the run's version now (a later migration added
    it); otherwise migrate, fork or cancel;
  - ``review`` -- refused: an outside call may have happened, so a person resolves it instead.

* **Fork** (:func:`fork`): retry a failed (cancelled, exceeded) run from a chosen step as a
  **new run** linked to the old one (``runs.forked_from``, like DBOS ``fork_workflow``): the
  same input and contact, the outputs and variables of the steps before the chosen one (copied,
  not run again), the chosen step ready on the same version or a given one. Its start key
  (``ids.fork_start_key``) makes asking twice return the first fork.

Each action writes one history row naming who did it (``detail.by``): ``review_resolved``,
``step_resumed``, ``run_forked`` (on both runs). Resolve and resume are each one transaction
under the run's transition lock (``signals.lock_run``, then the step, then the run row -- the
order of ``cancel``); the effect's resolution and the step's wake commit together, so there is
no crash window between them. A fork is one statement (``start.sql fork_run``). An action that
does not apply raises ``ActionRefused`` and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from onward import audit, circuits, connections, effects, policy, signals
from onward.automations.versions import VersionCache
from onward.db import Conn, Pool
from onward.db.sql import Queries
from onward.errors import ActionRefused, InvalidInput, UnknownAutomation, UnknownRun
from onward.inputs import check_text
from onward.kinds import Registry
from onward.start import ForkPlan, fork_run

Q = Queries(__package__, "actions.sql")

#: How a review is resolved.
RESOLUTIONS = effects.RESOLUTIONS
#: The wait kinds of a parked step a person may resume (see the module docstring for why).
RESUMABLE = ("reconnect", "budget", "circuit", "migration")
#: The run statuses a fork may be made of.
FORKABLE = ("failed", "cancelled", "exceeded")
#: The longest name of who acted, in characters.
MAX_BY = 200


def check_by(by: str) -> str:
    """Who acts: a name that can be stored, 1 to ``MAX_BY`` characters."""
    by = check_text(by, "by").strip()
    if not by or len(by) > MAX_BY:
        raise InvalidInput(f"by: name who acts, 1 to {MAX_BY} characters")
    return by


@dataclass(frozen=True)
class Forked:
    """A fork: the new run, the run it was made from, and where it starts."""

    run_id: str
    forked_from: str
    created: bool  # False: the same fork was asked before; this is the first one
    start_key: str
    step_id: str
    seq: int
    version: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "forked_from": self.forked_from,
            "created": self.created,
            "duplicate": not self.created,
            "start_key": self.start_key,
            "step_id": self.step_id,
            "seq": self.seq,
            "version": self.version,
        }


# -- locks and checks ----------------------------------------------------------------------


async def _parked_step(conn: Conn, org_id: str, run_id: str) -> tuple[dict[str, Any], Any]:
    """Lock the run (transition lock, step, run row) and return its parked step and run row;
    ``UnknownRun``, or ``ActionRefused`` when the run is finished or not parked."""
    args = {"org_id": org_id, "run_id": run_id}
    await signals.lock_run(conn, org_id, run_id)
    step = await (await conn.execute(Q.lock_step, args)).fetchone()
    run = await (await conn.execute(Q.lock_run, args)).fetchone()
    if run is None:
        raise UnknownRun(org_id, run_id)
    if run["finished_at"] is not None:
        raise ActionRefused(
            "finished",
            f"run {run_id} has finished ({run['status']}): nothing to resume or resolve; "
            "fork it to run it again",
        )
    if step is None or step["status"] != "parked":
        now = step["status"] if step else run["status"]
        raise ActionRefused("not_parked", f"run {run_id} is not parked (its step is {now})")
    return step, run


async def _make_ready(
    conn: Conn,
    org_id: str,
    run_id: str,
    step: dict[str, Any],
    *,
    event: str,
    wake: dict[str, Any],
    detail: dict[str, Any],
    worker: str,
) -> dict[str, Any]:
    row = await (
        await conn.execute(
            Q.make_ready,
            {
                "org_id": org_id,
                "run_id": run_id,
                "seq": step["seq"],
                "wait_kind": step["wait_kind"],
                "wake": Jsonb(wake),
                "event": event,
                "worker": worker,
                "detail": Jsonb(detail),
            },
        )
    ).fetchone()
    assert row is not None, "the parked step is locked"
    return dict(row)


# -- resolve a review ----------------------------------------------------------------------


async def resolve_review(
    pool: Pool,
    org_id: str,
    run_id: str,
    how: str,
    *,
    by: str,
    reference: str | None = None,
    effect_key: str | None = None,
    worker: str = "operator",
) -> dict[str, Any]:
    """Resolve the review a run is parked for (``happened`` with the provider's
    ``reference``, ``retry``, ``skip``); ``effect_key`` names one effect when its step has
    several in review. One transaction; ``ActionRefused`` if it does not apply."""
    by = check_by(by)
    if how not in RESOLUTIONS:
        raise InvalidInput(f"how: one of {', '.join(RESOLUTIONS)}, not {how!r}")
    if how == "happened":
        if not reference or not reference.strip():
            raise InvalidInput("a call that happened needs the provider's reference")
        reference = check_text(reference.strip(), "reference")
    elif reference is not None:
        raise InvalidInput("a reference goes with happened only")
    async with pool.connection() as conn, conn.transaction():
        step, _ = await _parked_step(conn, org_id, run_id)
        if step["wait_kind"] != "review":
            raise ActionRefused(
                "not_in_review",
                f"run {run_id} is parked on {step['wait_kind']}, not for review: resume it",
            )
        pending = await effects.in_review(conn, org_id, run_id, step["seq"])
        if effect_key is not None:
            pending = [e for e in pending if e["effect_key"] == effect_key]
            if not pending:
                raise ActionRefused(
                    "unknown_effect", f"effect {effect_key!r} of run {run_id} is not in review"
                )
        if how == "happened" and len(pending) != 1:
            raise ActionRefused(
                "no_effect" if not pending else "several_effects",
                f"step {step['step_id']} of run {run_id} has "
                + (
                    "no effect in review (a person or an engine error parked it): "
                    "retry runs the step again, skip goes on without it"
                    if not pending
                    else f"{len(pending)} effects in review: name one (effect_key)"
                ),
            )
        keys = [e["effect_key"] for e in pending]
        for key in keys:
            await effects.resolve(conn, org_id, key, how, by=by, reference=reference)
        detail = {"how": how, "reference": reference, "by": by, "effects": keys}
        wake = {"by": "review", "how": how, "operator": by, "reference": reference}
        ready = await _make_ready(
            conn,
            org_id,
            run_id,
            step,
            event="review_resolved",
            wake=wake,
            detail=detail,
            worker=worker,
        )
        await audit.record(
            conn,
            org_id,
            actor=by,
            action="resolve_review",
            target=run_id,
            detail={"how": how, "step": step["step_id"], "effects": keys, "reference": reference},
        )
    return {**ready, "status": "active", **detail}


# -- resume --------------------------------------------------------------------------------


async def _why_not_resumable(
    conn: Conn,
    org_id: str,
    step: dict[str, Any],
    run: dict[str, Any],
    versions: VersionCache,
) -> str | None:
    kind, error = step["wait_kind"], step["error"] or {}
    if kind == "review":
        return (
            "it is parked for review: an outside call may have happened, so resolve the review "
            "(happened with the provider's reference, retry with the same key, or skip)"
        )
    if kind not in RESUMABLE:
        return f"a step parked on {kind} is not resumed by a person"
    if kind == "reconnect":
        connection = error.get("connection")
        if connection and await connections.status_of(conn, org_id, connection) == "broken":
            return (
                f"connection {connection} is still broken: restore it (POST "
                f"/v1/connections/{connection}/restore), which resumes every step parked on it"
            )
    if kind == "circuit" and error.get("circuit"):
        for c in await circuits.not_closed(conn, org_id, [error["circuit"]]):
            return (
                f"circuit {c['key']} is {c['state']} (retry at {c['retry_at']}): its probe "
                "resumes the step after the cool-down"
            )
    if kind == "migration":
        try:
            (await versions.get(org_id, run["automation_id"], run["version"])).step(step["step_id"])
        except (KeyError, UnknownAutomation):
            return (
                f"step {step['step_id']} is not in version {run['version']} of "
                f"{run['automation_id']}: migrate the run, fork it from another step, or cancel it"
            )
    return None


async def resume(
    pool: Pool,
    org_id: str,
    run_id: str,
    *,
    by: str,
    versions: VersionCache,
    worker: str = "operator",
) -> dict[str, Any]:
    """Resume a parked run: its step is ready again (same step, next attempt), with
    ``step_resumed`` naming who. ``ActionRefused`` when it does not apply (see
    ``RESUMABLE``)."""
    by = check_by(by)
    async with pool.connection() as conn, conn.transaction():
        step, run = await _parked_step(conn, org_id, run_id)
        why = await _why_not_resumable(conn, org_id, step, run, versions)
        if why is not None:
            raise ActionRefused(f"parked_{step['wait_kind']}", f"run {run_id}: {why}")
        detail = {"by": by, "via": "operator", "was": step["wait_kind"]}
        ready = await _make_ready(
            conn,
            org_id,
            run_id,
            step,
            event="step_resumed",
            wake={"by": "operator", "operator": by},
            detail=detail,
            worker=worker,
        )
        await audit.record(
            conn,
            org_id,
            actor=by,
            action="resume",
            target=run_id,
            detail={"step": step["step_id"], "was": step["wait_kind"]},
        )
    return {**ready, "status": "active", **detail}


# -- fork ----------------------------------------------------------------------------------


def _plan(
    run: dict[str, Any],
    steps: list[dict[str, Any]],
    entry: dict[str, Any],
    version: int,
    lane: str,
    kind: str,
) -> ForkPlan:
    """What the fork knows before its chosen step: the outputs of the steps settled before it
    (the latest per step id, as ``leases.sql settle_advance`` keeps them) and their variables.
    When nothing settled at or after the chosen step (a fork from where the run stopped), the
    run's own variables are exactly those; otherwise they are merged from each settled step's
    ``steps.vars``."""
    settled = ("done", "skipped")
    before = [s for s in steps if s["seq"] < entry["seq"] and s["status"] in settled]
    outputs = {s["step_id"]: s["output"] for s in before}
    if any(s["seq"] >= entry["seq"] and s["status"] in settled for s in steps):
        variables: dict[str, Any] = {}
        for s in before:
            variables.update(s["vars"] or {})
    else:
        variables = dict((run["ctx"] or {}).get("vars") or {})
    visits: dict[str, int] = {}
    for s in steps:
        if s["seq"] <= entry["seq"]:
            visits[s["step_id"]] = max(visits.get(s["step_id"], 0), s["iteration"])
    return ForkPlan(
        from_run_id=run["run_id"],
        automation_id=run["automation_id"],
        version=version,
        seq=entry["seq"],
        step_id=entry["step_id"],
        kind=kind,
        lane=lane,
        iteration=entry["iteration"],
        ctx={"vars": variables, "steps": outputs},
        visits=visits,
    )


async def fork(
    pool: Pool,
    org_id: str,
    run_id: str,
    *,
    by: str,
    versions: VersionCache,
    registry: Registry,
    from_step: str | None = None,
    version: int | None = None,
) -> Forked:
    """Retry a failed, cancelled or exceeded run from ``from_step`` (its latest entry; default:
    the step it stopped at) as a new run on ``version`` (default: the run's own)."""
    by = check_by(by)
    args = {"org_id": org_id, "run_id": run_id}
    async with pool.connection() as conn:
        run = await (await conn.execute(Q.fork_source, args)).fetchone()
        if run is None:
            raise UnknownRun(org_id, run_id)
        steps = list(await (await conn.execute(Q.fork_steps, args)).fetchall())
    if run["status"] not in FORKABLE:
        what = (
            "completed: nothing to retry"
            if run["status"] == "completed"
            else (f"{run['status']} (not finished): cancel it first")
        )
        raise ActionRefused(
            "not_forkable",
            f"run {run_id} is {what}; a fork is made of a failed, cancelled or exceeded run",
        )
    entries = [s for s in steps if from_step is None or s["step_id"] == from_step]
    if not entries:
        reached = ", ".join(dict.fromkeys(s["step_id"] for s in steps)) or "none"
        raise ActionRefused(
            "unknown_step", f"run {run_id} never reached step {from_step!r} (it reached: {reached})"
        )
    entry = entries[-1]
    target = version if version is not None else int(run["version"])
    doc = await versions.get(org_id, run["automation_id"], target)
    try:
        definition = doc.step(entry["step_id"])
    except KeyError:
        raise ActionRefused(
            "unknown_step",
            f"step {entry['step_id']!r} is not in version {target} of {run['automation_id']}",
        ) from None
    lane = policy.step_lane(definition, registry)
    plan = _plan(dict(run), steps, entry, target, lane, definition.kind)
    started = await fork_run(pool, org_id, plan, by=by)
    return Forked(
        run_id=started.run_id,
        forked_from=run_id,
        created=started.created,
        start_key=started.start_key,
        step_id=plan.step_id,
        seq=plan.seq,
        version=target,
    )
