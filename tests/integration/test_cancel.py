"""Cancellation (R12) end to end: a waiting run is cancelled at once (a late signal or decision
refused as cancelled); a run with a step in flight stops at its next safe point -- before the
next step's handler, instead of a wait, a retry, a deferral or a park, and before any outside
call; cancel is idempotent and says what it did; a bulk cancel goes in batches with progress,
from the library, the CLI and HTTP, and the elected sweeper continues one whose driver died."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import psycopg
import pytest

from onward import (
    Automation,
    DecisionRefused,
    Deferred,
    NeedsReview,
    RetryableError,
    SignalRefused,
    StepContext,
    UnknownOperation,
    UnknownRun,
    Wait,
    run_effect,
    step_kind,
)
from onward.api import ApiServer, create_app
from onward.engine import Engine
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.sweep import Sweeper
from onward.testing import (
    api_key,
    auth,
    eventually,
    history,
    lock_awaited,
    run_row,
    step_row,
    steps,
)
from onward.testing.processes import run_onward

ENTERED: dict[str, asyncio.Event] = {}  # run_id -> set when cancel.gate's handler began
GATES: dict[str, asyncio.Event] = {}  # run_id -> opened by the test to let the handler go on
RAN: list[tuple[str, str]] = []  # (run_id, step_id) of every cancel.mark handler that ran


@step_kind("cancel.gate", lane="io", replace=True)
async def _gate(step: StepContext) -> Any:
    """Holds the step in flight until the test opens its gate, then does what ``then`` says."""
    ENTERED.setdefault(step.run_id, asyncio.Event()).set()
    await GATES.setdefault(step.run_id, asyncio.Event()).wait()
    then = step.params.get("then", "advance")
    if then == "wait":
        return Wait(due_in=3600, intent={"why": "a long wait"})
    if then == "retry":
        raise RetryableError("the provider hiccuped")
    if then == "defer":
        raise Deferred(600.0, "a rate limit", key="org")
    if then == "park":
        raise NeedsReview("a person must look")
    if then == "send":
        return await run_effect(
            step,
            "mailbox",
            {"from": "a@example.test", "to": "maya@example.test", "subject": "s", "body": "b"},
        )
    return {"gate": "open"}


@step_kind("cancel.mark", lane="io", replace=True)
async def _mark(step: StepContext) -> dict[str, Any]:
    RAN.append((step.run_id, step.step_id))
    return {}


async def in_flight(engine: Engine, automation_id: str, key: str, then: str = "advance") -> str:
    await engine.publish(
        Automation(automation_id)
        .step("gate", "cancel.gate", then=then)
        .step("next", "cancel.mark")
        .build()
    )
    run_id = (await engine.start(automation_id, {}, event_id=key)).run_id
    await asyncio.wait_for(ENTERED.setdefault(run_id, asyncio.Event()).wait(), 30)
    return run_id


def cancelled_at_once(sql: psycopg.Connection[Any], run_id: str) -> None:
    run = run_row(sql, run_id)
    assert (run["status"], run["cancel_requested_by"]) == ("cancelled", "ops"), run
    assert run["finished_at"] is not None
    assert [s["status"] for s in steps(sql, run_id)][-1] == "cancelled"
    pending = sql.execute(
        "SELECT count(*) AS n FROM timers WHERE run_id = %s AND fired_at IS NULL", (run_id,)
    ).fetchone()
    assert pending == {"n": 0}
    closed = sql.execute(
        "SELECT fired_by FROM timers WHERE run_id = %s ORDER BY timer_id DESC LIMIT 1", (run_id,)
    ).fetchone()
    assert closed == {"fired_by": "cancelled"}
    assert len(history(sql, run_id, "run_cancelled")) == 1


async def waiting(sql: psycopg.Connection[Any], run_id: str, kind: str) -> None:
    async def check() -> Any:
        return sql.execute(
            "SELECT 1 FROM steps WHERE run_id = %s AND status = 'waiting' AND wait_kind = %s",
            (run_id, kind),
        ).fetchone()

    await eventually(check, what=f"the run waits on a {kind}")


# -- waiting runs: cancelled at once ------------------------------------------------------------
async def test_a_run_waiting_on_a_timer_is_cancelled_at_once_and_its_timer_fires_nothing(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(
        Automation("nap")
        .step("nap", "wait_for", duration="1h")
        .step("after", "set", values={"x": "1"})
        .build()
    )
    run_id = (await engine.start("nap", {}, event_id="t1")).run_id
    async with engine.running():
        await waiting(sql, run_id, "timer")
        answer = await engine.cancel(run_id, by="ops", reason="sent by mistake")
    assert answer == {
        "run_id": run_id,
        "status": "cancelled",
        "outcome": "cancelled",
        "was": "waiting:timer",
    }
    cancelled_at_once(sql, run_id)
    assert run_row(sql, run_id)["status_reason"] == "sent by mistake"
    assert await engine.skip_wait(run_id) == []  # no pending timer is left to fire
    again = await engine.cancel(run_id, by="ops")
    assert again["outcome"] == "already_cancelled"
    assert len(history(sql, run_id, "run_cancelled")) == 1


async def test_a_run_waiting_on_a_signal_is_cancelled_at_once_and_a_later_signal_refused(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(
        Automation("reply")
        .step("wait", "wait_signal", signals=["reply"], deadline="1h")
        .step("after", "set", values={"x": "1"})
        .build()
    )
    run_id = (await engine.start("reply", {}, event_id="s1")).run_id
    async with engine.running():
        await waiting(sql, run_id, "signal")
        answer = await engine.cancel(run_id, by="ops")
        assert (answer["outcome"], answer["was"]) == ("cancelled", "waiting:signal")
        with pytest.raises(SignalRefused):
            await engine.signal("evt-late", "reply", run_id=run_id, payload={"text": "yes"})
    cancelled_at_once(sql, run_id)
    refused = sql.execute("SELECT status, reason FROM signals WHERE signal_id = 'evt-late'")
    row = refused.fetchone()
    assert row is not None and row["status"] == "refused" and "cancelled" in row["reason"]
    assert len(history(sql, run_id, "signal_refused")) == 1


async def test_a_run_waiting_on_an_approval_is_cancelled_at_once_and_a_late_decision_refused(
    engine: Engine, sql: psycopg.Connection[Any], sandbox: SandboxServer, admin: SandboxAdmin
) -> None:
    await engine.integrations.add_connection(
        engine.org_id, "slack", provider="slack", base_url=sandbox.url, account="T_X", secret="T_X"
    )
    await engine.grant_approver("U_SAM")
    await engine.publish(
        Automation("approve")
        .step(
            "approve",
            "approval",
            connection="slack",
            channel="#ok",
            approvers=["U_SAM"],
            text="Go?",
            deadline="1h",
        )
        .step("after", "set", values={"x": "1"})
        .build()
    )
    run_id = (await engine.start("approve", {}, event_id="a1")).run_id
    async with engine.running():
        await waiting(sql, run_id, "approval")
        answer = await engine.cancel(run_id, by="ops")
        assert (answer["outcome"], answer["was"]) == ("cancelled", "waiting:approval")
    cancelled_at_once(sql, run_id)
    (request,) = await engine.approvals(run_id=run_id)
    assert request["status"] == "cancelled"
    with pytest.raises(DecisionRefused) as refused:
        await engine.decide(request["approval_id"], "approve", user="U_SAM")
    assert refused.value.reason == "cancelled"
    # the same over HTTP, as a click's endpoint would be answered
    api = ApiServer(create_app(engine), port=0, log_level="warning", access_log=False)
    async with (
        api,
        httpx.AsyncClient(base_url=api.url, headers=auth(await api_key(engine))) as http,
    ):
        reply = await http.post(
            "/v1/approvals/decide",
            json={"approval_id": request["approval_id"], "decision": "approve", "user": "U_SAM"},
        )
    assert reply.status_code == 409 and reply.json()["error"] == "decision_refused"
    assert "cancelled" in reply.json()["detail"]
    assert run_row(sql, run_id)["status"] == "cancelled"


# -- a step in flight: stopped at its next safe point -------------------------------------------
async def test_a_cancel_during_a_step_stops_the_run_before_the_next_steps_handler(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    async with engine.running():
        run_id = await in_flight(engine, "two", "f1")
        first = await engine.cancel(run_id, by="ops")
        assert (first["outcome"], first["status"]) == ("cancel_requested", "active")
        second = await engine.cancel(run_id, by="someone else")
        assert second["outcome"] == "already_requested"
        GATES[run_id].set()
        assert await engine.wait(run_id, timeout=30) == "cancelled"
    # the step in flight finished (a short call may finish); its successor, claimed eagerly by
    # the same settle, was stopped at its claim: its handler never ran
    assert [(s["step_id"], s["status"]) for s in steps(sql, run_id)] == [
        ("gate", "done"),
        ("next", "cancelled"),
    ]
    assert (run_id, "next") not in RAN
    (requested,) = history(sql, run_id, "cancel_requested")
    assert requested["detail"]["by"] == "ops" and requested["seq"] == 1
    assert run_row(sql, run_id)["cancel_requested_by"] == "ops"


async def test_a_cancel_during_a_step_stops_a_successor_that_is_not_claimed_eagerly(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(
        Automation("two-b")
        .step("gate", "cancel.gate")
        .step("next", "cancel.mark", lane="slow")  # a lane this worker does not serve
        .build()
    )
    run_id = (await engine.start("two-b", {}, event_id="f2")).run_id
    async with engine.running(lanes={"io": 4}):
        await asyncio.wait_for(ENTERED.setdefault(run_id, asyncio.Event()).wait(), 30)
        assert (await engine.cancel(run_id, by="ops"))["outcome"] == "cancel_requested"
        GATES[run_id].set()

        async def successor_ready() -> Any:
            return sql.execute(
                "SELECT 1 FROM steps WHERE run_id = %s AND seq = 2 AND status = 'ready'",
                (run_id,),
            ).fetchone()

        await eventually(successor_ready, what="the successor inserted ready")
    async with engine.running(lanes={"slow": 2}):  # its next claim stops it
        assert await engine.wait(run_id, timeout=30) == "cancelled"
    assert (run_id, "next") not in RAN
    assert [(s["step_id"], s["status"]) for s in steps(sql, run_id)] == [
        ("gate", "done"),
        ("next", "cancelled"),
    ]


@pytest.mark.parametrize("then", ["wait", "retry", "defer", "park"])
async def test_a_step_that_would_wait_retry_defer_or_park_after_a_cancel_ends_cancelled(
    then: str, engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    async with engine.running():
        run_id = await in_flight(engine, f"then-{then}", f"w-{then}", then=then)
        assert (await engine.cancel(run_id, by="ops"))["outcome"] == "cancel_requested"
        GATES[run_id].set()
        assert await engine.wait(run_id, timeout=30) == "cancelled"
    (gate,) = steps(sql, run_id)
    assert (gate["status"], gate["wait_kind"]) == ("cancelled", None)
    (ended,) = history(sql, run_id, "step_cancelled")
    assert ended["detail"]["instead_of"].split(":")[0] == then
    assert history(sql, run_id, "step_waiting", "step_retry", "step_deferred", "step_parked") == []
    left = sql.execute(
        "SELECT count(*) AS n FROM timers WHERE run_id = %s AND fired_at IS NULL", (run_id,)
    ).fetchone()
    assert left == {"n": 0}


async def test_no_outside_call_starts_after_the_cancel_commits(
    engine: Engine, sql: psycopg.Connection[Any], sandbox: SandboxServer, admin: SandboxAdmin
) -> None:
    await engine.integrations.add_connection(
        engine.org_id, "mailbox", provider="email", base_url=sandbox.url, account="a", secret="a"
    )
    async with engine.running():
        run_id = await in_flight(engine, "send-after", "e1", then="send")
        assert (await engine.cancel(run_id, by="ops"))["outcome"] == "cancel_requested"
        GATES[run_id].set()
        assert await engine.wait(run_id, timeout=30) == "cancelled"
    assert admin.ledger("email") == []
    assert sql.execute("SELECT * FROM effects WHERE run_id = %s", (run_id,)).fetchall() == []
    (gate,) = steps(sql, run_id)
    assert gate["status"] == "cancelled"
    assert gate["error"]["type"] == "RunCancelled"


async def test_a_ready_run_is_cancelled_at_once_and_unknown_runs_are_refused(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(Automation("idle").step("a", "set", values={"x": "1"}).build())
    run_id = (await engine.start("idle", {}, event_id="r1")).run_id  # no worker: ready
    answer = await engine.cancel(run_id, by="ops")
    assert (answer["outcome"], answer["was"]) == ("cancelled", "ready")
    assert step_row(sql, run_id, 1)["status"] == "cancelled"
    async with engine.running():  # a worker finds nothing to claim
        await asyncio.sleep(0)
    assert run_row(sql, run_id)["status"] == "cancelled"
    with pytest.raises(UnknownRun):
        await engine.cancel("run_nope", by="ops")
    with pytest.raises(UnknownOperation):
        await engine.operation("op_nope")


# -- bulk -----------------------------------------------------------------------------------------
async def start_many(engine: Engine, automation_id: str, n: int, prefix: str) -> list[str]:
    ids: list[str] = []
    for chunk in range(0, n, 200):
        got = await asyncio.gather(
            *(
                engine.start(automation_id, {}, event_id=f"{prefix}-{i}")
                for i in range(chunk, min(n, chunk + 200))
            )
        )
        ids.extend(s.run_id for s in got)
    return ids


async def test_bulk_cancel_of_ten_thousand_runs_reports_progress_per_batch(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(Automation("bulk").step("a", "set", values={"x": "1"}).build())
    await engine.publish(Automation("other").step("a", "set", values={"x": "1"}).build())
    ids = await start_many(engine, "bulk", 10_000, "b")
    (keep,) = await start_many(engine, "other", 1, "o")
    progress: list[int] = []
    began = time.monotonic()
    op = await engine.cancel_many(
        automation_id="bulk",
        by="ops",
        reason="campaign withdrawn",
        batch=500,
        on_batch=lambda row, batch: progress.append(row["done"]),
    )
    elapsed = time.monotonic() - began
    print(f"\nbulk cancel: 10,000 runs in {elapsed:.1f} s ({10_000 / elapsed:.0f} runs/s)")
    assert elapsed < 300
    assert (op["status"], op["done"], op["outcomes"]) == ("done", 10_000, {"cancelled": 10_000})
    assert progress == sorted(progress) and len(progress) == 21  # 20 full batches + the end
    assert progress[0] == 500 and progress[-1] == 10_000
    left = sql.execute(
        "SELECT count(*) AS n FROM runs WHERE automation_id = 'bulk' AND status <> 'cancelled'"
    ).fetchone()
    assert left == {"n": 0}
    assert run_row(sql, keep)["status"] == "active"
    assert run_row(sql, ids[0])["status_reason"] == "campaign withdrawn"
    # a second bulk cancel finds nothing left to do
    again = await engine.cancel_many(automation_id="bulk", by="ops")
    assert (again["status"], again["done"]) == ("done", 0)
    assert [o["operation_id"] for o in await engine.operations()][:2] == [
        again["operation_id"],
        op["operation_id"],
    ]


async def test_the_sweeper_continues_a_bulk_cancel_whose_driver_died(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(Automation("orphan").step("a", "set", values={"x": "1"}).build())
    ids = await start_many(engine, "orphan", 30, "x")
    op = await engine.begin_cancel_many(automation_id="orphan", by="ops")
    # its driver died a second ago: nobody renews the lease
    sql.execute(
        "UPDATE operations SET lease_until = now() - interval '1 second' WHERE operation_id = %s",
        (op["operation_id"],),
    )
    sweeper = Sweeper(engine.pool, worker_id="sweeper-1", interval=0.2)
    await sweeper.tick()

    async def finished() -> Any:
        row = await engine.operation(op["operation_id"])
        return row if row["status"] == "done" else None

    done = await eventually(finished, what="the sweeper to finish the operation")
    assert done["done"] == 30 and sweeper.stats.operations_resumed == 1
    assert {run_row(sql, r)["status"] for r in ids} == {"cancelled"}


async def test_bad_bulk_filters_are_refused_before_anything_is_stored(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    with pytest.raises(Exception, match="at least one"):
        await engine.cancel_many(by="ops")
    with pytest.raises(Exception, match="unknown cancel filter"):
        await engine.cancel_many(by="ops", colour="red")
    assert sql.execute("SELECT count(*) AS n FROM operations").fetchone() == {"n": 0}


# -- HTTP and CLI ---------------------------------------------------------------------------------
async def test_cancel_over_http_one_run_and_in_bulk_with_progress(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(Automation("web").step("a", "set", values={"x": "1"}).build())
    one = (await engine.start("web", {}, event_id="h0")).run_id
    many = await start_many(engine, "web", 40, "h")
    api = ApiServer(create_app(engine), port=0, log_level="warning", access_log=False)
    async with (
        api,
        httpx.AsyncClient(base_url=api.url, headers=auth(await api_key(engine))) as http,
    ):
        reply = await http.post(f"/v1/runs/{one}/cancel", json={"reason": "no", "by": "ana"})
        assert reply.status_code == 200, reply.text
        assert reply.json() == {
            "run_id": one,
            "status": "cancelled",
            "outcome": "cancelled",
            "was": "ready",
        }
        again = await http.post(f"/v1/runs/{one}/cancel")
        assert again.json()["outcome"] == "already_cancelled"
        missing = await http.post("/v1/runs/run_nope/cancel")
        assert missing.status_code == 404 and missing.json()["error"] == "unknown_run"
        bad = await http.post("/v1/runs/cancel", json={"reason": "no filter"})
        assert bad.status_code == 422 and "at least one" in bad.json()["detail"]
        bulk = await http.post("/v1/runs/cancel", json={"automation_id": "web", "by": "ana"})
        assert bulk.status_code == 202, bulk.text
        op_id = bulk.json()["operation_id"]

        async def done() -> Any:
            got = (await http.get(f"/v1/operations/{op_id}")).json()
            return got if got["status"] == "done" else None

        finished = await eventually(done, what="the bulk cancel to finish")
        assert finished["done"] == 40 and finished["outcomes"] == {"cancelled": 40}
        listed = (await http.get("/v1/operations")).json()
        assert [o["operation_id"] for o in listed] == [op_id]
        assert (await http.get("/v1/operations/op_nope")).status_code == 404
    assert {run_row(sql, r)["status"] for r in many} == {"cancelled"}
    assert run_row(sql, one)["cancel_requested_by"] == "ana"


async def test_cancel_from_the_cli_one_run_in_bulk_and_the_operations(
    engine: Engine, sql: psycopg.Connection[Any], db_url: str
) -> None:
    await engine.publish(Automation("cli").step("a", "set", values={"x": "1"}).build())
    one = (await engine.start("cli", {}, event_id="c0")).run_id
    many = await start_many(engine, "cli", 12, "c")
    env = {"ONWARD_ORG": engine.org_id}
    got = run_onward(db_url, "cancel", one, "--by", "ops", env=env)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == f"{one}  cancelled (was ready)"
    again = run_onward(db_url, "cancel", one, "--json", env=env)
    assert '"outcome": "already_cancelled"' in again.stdout
    bulk = run_onward(db_url, "cancel", "--automation", "cli", "--status", "active", env=env)
    assert bulk.returncode == 0, bulk.stderr
    assert "12 runs (cancelled 12)" in bulk.stdout and "batch of 12" in bulk.stderr
    assert {run_row(sql, r)["status"] for r in many} == {"cancelled"}
    (op,) = await engine.operations()
    listed = run_onward(db_url, "operations", env=env)
    assert op["operation_id"] in listed.stdout and "done" in listed.stdout
    shown = run_onward(db_url, "operations", "show", op["operation_id"], env=env)
    assert "'automation_id': 'cli'" in shown.stdout
    resumed = run_onward(db_url, "operations", "resume", op["operation_id"], env=env)
    assert resumed.returncode == 0 and "done" in resumed.stdout
    for argv in (
        ("cancel",),
        ("cancel", one, "--automation", "cli"),
        ("cancel", "--automation", "cli", "--before", "yesterday"),
        ("cancel", "run_nope"),
        ("operations", "show", "op_nope"),
    ):
        bad = run_onward(db_url, *argv, env=env)
        assert bad.returncode == 2, (argv, bad.stdout, bad.stderr)
        assert bad.stderr.startswith("onward: ") and len(bad.stderr.strip().splitlines()) == 1


async def test_a_bulk_cancel_chosen_as_a_deadlocks_victim_takes_its_batch_again(
    engine: Engine, sql: psycopg.Connection[Any], db_url: str
) -> None:
    # Another transaction holds the second run's row while the batch (which locks runs in id
    # order) holds the first and waits for it; then it asks for the first: a cycle, of which
    # the batch is the victim (it waited first). Its transaction rolled back whole, so the
    # operation takes the batch again and finishes both runs -- it does not fail.
    await engine.publish(Automation("victim").step("a", "set", values={"x": "1"}).build())
    first, second = sorted(await start_many(engine, "victim", 2, "v"))
    org = engine.settings.org_id
    lock = "SELECT 1 FROM runs WHERE org_id = %s AND run_id = %s FOR UPDATE"
    with psycopg.connect(db_url) as other:
        other.execute(lock, (org, second))
        task = asyncio.create_task(engine.cancel_many(automation_id="victim", by="ops"))
        await lock_awaited(
            sql, besides=other.info.backend_pid, what="the batch waits on the second run"
        )
        other.execute(lock, (org, first))  # returns once the victim's transaction is gone
        other.commit()
    op = await task
    assert (op["status"], op["done"], op["outcomes"]) == ("done", 2, {"cancelled": 2})
    assert {run_row(sql, r)["status"] for r in (first, second)} == {"cancelled"}
