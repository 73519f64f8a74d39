"""Graceful shutdown and sudden death of a REAL worker process (R3).

* SIGTERM while a long step runs: the process stops claiming, waits its grace period, then
  releases the step (``lease_until = now()``, history ``step_released``) and exits; another
  worker claims it at once (attempt 2) instead of waiting the lease out.
* SIGTERM while a short step runs: the step finishes within the grace period (attempt 1, no
  release), and the stopping worker does not take the next step.
* SIGKILL mid-step: nothing is released; the step is claimed again only after its lease lapses
  (the sweep's rescue, history ``lease_expired``), and the run completes exactly once.

Every time compared here is a database time (history ``at`` and ``lease_until``).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.testing import Process, attempts, eventually, history, step_row
from onward.testing.kinds import SLEEP_KIND
from tests.acceptance.conftest import Spawn

pytestmark = pytest.mark.acceptance

LEASE = 3.0  # the process's lease (the `settings` fixture uses the same for in-test workers)
HEARTBEAT = 0.5


async def claimed_by(sql: psycopg.Connection, run_id: str, worker: str, wp: Process) -> Any:
    async def check() -> Any:
        assert wp.alive(), f"worker process exited early:\n{wp.log_text()}"
        rows = [e for e in attempts(sql, run_id) if e["worker"] == worker]
        return rows[0] if rows else None

    return await eventually(check, timeout=20, what=f"step claimed by {worker}")


async def exits(wp: Process, timeout: float) -> float:
    """Wait (without blocking the event loop) until the process exits; returns the seconds."""
    t0 = time.monotonic()
    await wp.exited(timeout=timeout)
    return time.monotonic() - t0


def publish_nap(seconds: float, *, then: bool = False) -> dict[str, Any]:
    flow = Automation("nap").step("nap", SLEEP_KIND, seconds=seconds, retry_seconds=0.1)
    if then:
        flow = flow.step("after", "set", values={"done": "true"})
    return flow.build()


async def test_sigterm_releases_a_long_step_and_another_worker_claims_it_at_once(
    engine: Engine, sql: psycopg.Connection, spawn: Spawn
) -> None:
    await engine.publish(publish_nap(60))
    await engine.publish(Automation("quick").step("quick", SLEEP_KIND, seconds=0).build())
    started = await engine.start("nap", {}, event_id="long")
    run_id = started.run_id
    grace = 1.0
    wp = spawn("proc-a", grace=grace, lease=LEASE, heartbeat=HEARTBEAT)
    claim1 = await claimed_by(sql, run_id, "proc-a", wp)
    assert claim1["attempt"] == 1

    wp.terminate()

    async def stopping() -> bool:
        return wp.printed("stopping on SIGTERM")

    await eventually(stopping, timeout=5, what="the process to see SIGTERM")
    # work that becomes ready now is not for this process any more: it stopped claiming
    quick = await engine.start("quick", {}, event_id="after-sigterm")
    took = await exits(wp, timeout=grace + 5)
    assert wp.returncode == 0, wp.log_text()
    assert took < grace + 3, f"shutdown took {took:.1f}s with a grace of {grace}s"
    assert attempts(sql, quick.run_id) == []

    # the step was handed back at once: ready, lease ended now, nobody owns it, nothing written
    (released,) = history(sql, run_id, "step_released")
    assert (released["seq"], released["attempt"], released["worker"]) == (1, 1, "proc-a")
    row = step_row(sql, run_id, 1)
    assert row["status"] == "ready"
    assert row["owner"] is None and row["attempt"] == 1 and row["output"] is None
    assert row["lapsed"] is True, "released steps must have lease_until <= now()"
    assert history(sql, run_id, "step_done") == []

    # another worker (this process; no sweeper, so only the release can have freed the step)
    async with engine.running(sweeper=False):

        async def second_claim() -> Any:
            rows = [e for e in attempts(sql, run_id) if e["attempt"] == 2]
            return rows[0] if rows else None

        claim2 = await eventually(second_claim, timeout=10, what="claim of attempt 2")
        assert claim2["worker"] == engine.id
        assert await engine.wait(run_id, timeout=20) == "completed"
        assert await engine.wait(quick.run_id, timeout=20) == "completed"
    assert [e["worker"] for e in attempts(sql, quick.run_id)] == [engine.id]

    waited = (claim2["claimed_at"] - released["at"]).total_seconds()
    # the old lease ran at least LEASE - HEARTBEAT beyond the release: claiming within that
    # proves nobody waited it out
    assert waited < LEASE - HEARTBEAT - 0.5, f"attempt 2 claimed {waited:.2f}s after the release"
    assert history(sql, run_id, "lease_expired") == []
    done = history(sql, run_id, "step_done")
    assert [(e["seq"], e["attempt"], e["worker"]) for e in done] == [(1, 2, engine.id)]


async def test_sigterm_lets_a_short_step_finish_within_the_grace_period(
    engine: Engine, sql: psycopg.Connection, spawn: Spawn
) -> None:
    await engine.publish(publish_nap(0.3, then=True))
    started = await engine.start("nap", {}, event_id="short")
    run_id = started.run_id
    grace = 2.0
    wp = spawn("proc-b", grace=grace, lease=LEASE, heartbeat=HEARTBEAT)
    await claimed_by(sql, run_id, "proc-b", wp)

    wp.terminate()
    took = await exits(wp, timeout=grace + 5)
    assert wp.returncode == 0, wp.log_text()
    assert took < grace + 3

    nap = step_row(sql, run_id, 1)
    assert (nap["status"], nap["attempt"]) == ("done", 1), nap
    assert nap["output"]["worker"] == "proc-b"
    assert history(sql, run_id, "step_released") == []
    (done,) = history(sql, run_id, "step_done", seq=1)
    assert (done["attempt"], done["worker"]) == (1, "proc-b")
    # a stopping worker does not continue eagerly: the next step waits, unclaimed, for others
    after = step_row(sql, run_id, 2)
    assert (after["status"], after["attempt"], after["owner"]) == ("ready", 0, None), after
    assert attempts(sql, run_id, seq=2) == []

    async with engine.running(sweeper=False):
        assert await engine.wait(run_id, timeout=20) == "completed"
    claims = attempts(sql, run_id, seq=2)
    assert [(e["attempt"], e["worker"]) for e in claims] == [(1, engine.id)]


async def test_sigkill_mid_step_is_reclaimed_only_after_the_lease_lapses(
    engine: Engine, sql: psycopg.Connection, spawn: Spawn
) -> None:
    await engine.publish(publish_nap(60))
    started = await engine.start("nap", {}, event_id="killed")
    run_id = started.run_id
    wp = spawn("proc-c", grace=1.0, lease=LEASE, heartbeat=HEARTBEAT)
    claim1 = await claimed_by(sql, run_id, "proc-c", wp)
    # let a heartbeat or two extend the lease, so the lapse is the heartbeat's, not the claim's
    lease_at_claim = step_row(sql, run_id, 1)["lease_until"]

    async def extended() -> bool:
        return bool(step_row(sql, run_id, 1)["lease_until"] > lease_at_claim)

    await eventually(extended, timeout=5, what="a heartbeat extending the lease")

    wp.kill()
    await exits(wp, timeout=5)
    assert wp.returncode == -9

    # a worker with a sweeper is ready at once; it must still wait for the lease to lapse
    async with engine.running():
        assert await engine.wait(run_id, timeout=20) == "completed"

    (expired,) = history(sql, run_id, "lease_expired")
    claims = attempts(sql, run_id)
    assert [(c["attempt"], c["worker"], c["ended"]) for c in claims] == [
        (1, "proc-c", "lease_expired"),
        (2, engine.id, "step_done"),
    ]
    claim2 = claims[1]
    lease_until = step_lease_until(expired)
    assert lease_until > claim1["claimed_at"]
    assert expired["at"] >= lease_until, "rescued before the lease lapsed"
    assert claim2["claimed_at"] >= lease_until, "claimed again before the lease lapsed"
    assert claim2["claimed_at"] > expired["at"]
    assert history(sql, run_id, "step_released") == []
    done = history(sql, run_id, "step_done", seq=1)
    assert [(d["attempt"], d["worker"]) for d in done] == [(2, engine.id)]
    assert done[0]["detail"] == {"run": "completed"}


def step_lease_until(expired: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(expired["detail"]["lease_until"])
