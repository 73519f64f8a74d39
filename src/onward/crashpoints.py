"""Named crash points: the lines where a process can die between two durable facts.

Production code marks each such line with ``crash_point("name")``. In normal runs nothing is
armed and the call is one set lookup. A test arms points with ``ONWARD_CRASH_AT`` (a comma-
separated list of ``name`` or ``name@n`` -- die on the nth time the line is reached); reaching an
armed point kills the process with SIGKILL, so no ``finally`` block, no atexit handler and no
buffered write runs: exactly what a power cut or an OOM kill does. ``docs/crash-points.md``
lists every point with the durable row that lets another process continue.
"""

from __future__ import annotations

import os
import signal
import sys

POINTS = {
    "start.after_commit": "run + first step + outbox row committed; nothing published yet",
    "relay.after_publish": "wakes published to the queue; outbox rows not yet marked sent",
    "worker.after_claim": "step claimed (attempt = token, lease set); handler not yet called",
    "worker.before_settle": "handler returned; its result not yet written",
    "worker.after_settle": "step settled and next step written; nothing else done",
    "sweep.after_claim": "due timers locked by the sweep; not yet fired (same transaction)",
    "sweep.after_fire": "timers fired and steps made ready; wakes only in the outbox",
    "shutdown.before_release": "graceful shutdown cancelled its steps; leases not yet released",
    "effect.after_claim": "effect row claimed in_flight; provider not yet called",
    "effect.after_call": "provider did the work; the effect is not yet settled",
    "signal.after_claim": "signal consumed and its step woken in a transaction not yet committed",
    "approval.after_request": "approval request committed; its Slack message not yet posted",
    "approval.after_decide": "decision written and its step woken in a transaction not yet committed",
    "worker.after_wait": "waiting step settled: timer row + delayed outbox wake committed",
    "worker.before_settle_error": "handler raised (effect row withdrawn/unknown); retry not written",
    "timer.after_fire": "timers fired on their wake, steps claimed here or made ready; not yet run",
    "schedule.after_start": "a schedule's run started (committed); the schedule not yet advanced",
    "circuit.after_open": "a failure opened a circuit (committed); its step not yet parked",
    "circuit.after_half_open": "circuits half-opened and their probes made ready (committed)",
    "circuit.before_close": "the probe's call succeeded (effect settled); the circuit still half-open",
    "budget.after_reserve": "a call's maximum cost reserved (committed); the call not yet made",
    "migrate.in_batch": "a migration batch moved its runs; batch and progress not yet committed",
    "vault.between_batches": "a rotate-secrets batch re-encrypted and committed; the next not yet",
    "erasure.after_record": "erasure recorded, runs cancelled and pseudonymised; no run erased yet",
    "erasure.after_run": "one run of an erased contact erased (committed); the others not yet",
    "notify.after_send": "a destination acknowledged a notification; delivered_at not yet written",
}


def _parse(raw: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        name, _, nth = part.partition("@")
        armed[name] = int(nth) if nth else 1
    return armed


_ARMED: dict[str, int] = _parse(os.environ.get("ONWARD_CRASH_AT", ""))
_SEEN: dict[str, int] = {}


def arm(spec: str) -> None:
    """Arm points in this process (tests that run the engine in a child process use this)."""
    _ARMED.clear()
    _ARMED.update(_parse(spec))
    _SEEN.clear()


def arm_also(spec: str) -> None:
    """Arm more points in this running process, keeping those already armed and their counts
    (``onward chaos`` arms every relay process at once, through its standby's stdin)."""
    for name, nth in _parse(spec).items():
        _ARMED[name] = _SEEN.get(name, 0) + nth


def disarm(*names: str) -> None:
    """Disarm points in this running process (the others stay armed)."""
    for name in names:
        _ARMED.pop(name, None)


def crash_point(name: str) -> None:
    if not _ARMED or name not in _ARMED:
        return
    _SEEN[name] = _SEEN.get(name, 0) + 1
    if _SEEN[name] >= _ARMED[name]:
        sys.stderr.write(f"onward: crash point {name} reached, SIGKILL\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
