""" "Way forward now": which durable row will move an unfinished run next, and when.

The design's one test -- stop a process at the worst line, then ask which row lets another
continue -- asked of one run, now. Every unfinished run has exactly one unfinished step, its
latest (``steps_one_unfinished`` for a ready, waiting or parked one; a running one's successor
is written only by the statement that ends it: migration 0034), and its state says which row
moves it:

* ``ready`` -- the step row itself: any worker of its lane claims it at ``available_at`` (a
  wake job is a hint; the sweep finds the row without one);
* ``running`` -- the step's lease: its worker settles it, or the lease lapses at
  ``lease_until`` and the elected sweeper makes it ready again;
* ``waiting`` -- its unfired timer rows (the wait's instant, or the deadline of a wait on a
  signal or a person), plus the signal names, correlation keys or approval that may come first;
* ``parked`` -- a person: what they can do depends on why (resolve the review, resume,
  restore the connection); a circuit's own probe, a budget's renewal may come first.

A run with none of these has no way forward: ``onward doctor`` reports it, and so does this.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

UNFINISHED_STEP = ("ready", "running", "waiting", "parked")

PERSON = {
    "review": "a person resolves the review (it happened, with the provider's reference; "
    "retry with the same idempotency key; or skip)",
    "reconnect": "a person reconnects the account: restoring the connection resumes this step",
    "budget": "a person resumes it, or raises the budget (every step parked on it resumes)",
    "circuit": "the circuit's probe after its cooldown, or a person resumes it once closed",
    "migration": "a person migrates the run to a version that has its step, forks or cancels",
}


@dataclass(frozen=True)
class Way:
    """One way forward: what moves the run, the durable row that holds it, and when."""

    what: str
    row: str
    when: datetime | None = None
    overdue: bool = False


def ways_forward(
    run: dict[str, Any],
    steps: list[dict[str, Any]],
    *,
    timers: list[dict[str, Any]],
    approvals: list[dict[str, Any]],
    correlations: list[dict[str, Any]],
    circuits: list[dict[str, Any]],
    more: dict[str, Any],
    now: datetime,
) -> list[Way]:
    """The ways forward of ``run`` now; empty for a finished run. A run unfinished with none
    is the doctor's ``runs_without_way_forward`` (answered as one ``Way`` saying so)."""
    if run.get("finished_at") is not None:
        return []
    step = next((s for s in steps if s["status"] in UNFINISHED_STEP), None)
    ways: list[Way] = []
    if more.get("cancel_requested_at") is not None:
        ways.append(
            Way(
                f"cancellation requested by {more.get('cancel_requested_by') or 'an operator'}: "
                "honoured at the next safe point",
                f"runs {run['run_id']} (cancel_requested_at)",
                more["cancel_requested_at"],
            )
        )
    if step is None:
        ways.append(Way("NONE: no unfinished step; onward doctor reports this run", "none"))
        return ways
    where = f"steps ({run['run_id']}, seq {step['seq']}) {step['step_id']}"
    if step["status"] == "ready":
        at = step["available_at"]
        ways.append(
            Way(
                f"any worker of lane {step['lane']} claims step {step['step_id']}"
                + (" now" if at <= now else " when it becomes available"),
                f"{where}: ready",
                at,
                overdue=(now - at).total_seconds() > 60,
            )
        )
    elif step["status"] == "running":
        lease = step["lease_until"]
        ways.append(
            Way(
                f"worker {step['owner']} (attempt {step['attempt']}) settles step "
                f"{step['step_id']}; if it dies, the sweeper rescues the step when the lease "
                "lapses",
                f"{where}: running, lease until",
                lease,
                overdue=lease is not None and lease < now,
            )
        )
    elif step["status"] == "waiting":
        ways.extend(_waiting(step, where, timers, approvals, correlations, now))
    else:
        ways.extend(_parked(step, where, circuits))
    return ways


def _waiting(
    step: dict[str, Any],
    where: str,
    timers: list[dict[str, Any]],
    approvals: list[dict[str, Any]],
    correlations: list[dict[str, Any]],
    now: datetime,
) -> list[Way]:
    ways: list[Way] = []
    seq = step["seq"]
    pending = [t for t in timers if t["seq"] == seq and t["fired_at"] is None]
    for t in pending:
        purpose = {"wait": "the wait's instant", "deadline": "the deadline", "retry": "a retry"}
        ways.append(
            Way(
                f"the timer fires ({purpose.get(t['purpose'], t['purpose'])}; the due sweep "
                "fires it whatever happened to its wake job)",
                f"timers #{t['timer_id']} (wake {t['wake_n']})",
                t["due_at"],
                overdue=t["due_at"] < now,
            )
        )
    if step.get("wait_kind") == "signal":
        names = ", ".join(step.get("signals") or []) or "a signal"
        keys = [c["key"] for c in correlations if c["seq"] == seq]
        routed = f" (routed by correlation key {', '.join(keys)})" if keys else ""
        ways.append(Way(f"signal {names} arrives{routed}", f"signals → {where}"))
    for a in approvals:
        if a["seq"] == seq and a["status"] == "pending":
            ways.append(
                Way(
                    f"an approver ({', '.join(a['approvers'])}) decides approval "
                    f"{a['approval_id']}",
                    f"approvals {a['approval_id']}: pending until",
                    a["deadline_at"],
                )
            )
    if not pending:
        ways.append(
            Way("NONE: a waiting step with no unfired timer; onward doctor reports it", where)
        )
    return ways


def _parked(step: dict[str, Any], where: str, circuits: list[dict[str, Any]]) -> list[Way]:
    kind = step.get("wait_kind") or "?"
    ways = [Way(PERSON.get(kind, f"a person ({kind})"), f"{where}: parked on {kind}")]
    if kind == "circuit":
        key = (step.get("error") or {}).get("circuit")
        for c in circuits:
            if c["key"] == key and c.get("retry_at") is not None:
                ways.insert(
                    0,
                    Way(
                        f"circuit {key} ({c['state']}) lets one probe through, then resumes "
                        "the steps parked on it",
                        f"circuits {key}",
                        c["retry_at"],
                    ),
                )
    return ways
