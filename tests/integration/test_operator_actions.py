"""Operator actions (issue 13, B2/B3) end to end with the sandbox: resolve a review three ways,
resume a parked run, fork a failed run from a chosen step -- through ``Engine``.

The review park is provoked as it happens in production: the sandbox payment provider (no
idempotency, no search) does the charge and drops the connection, so the engine cannot know
whether it happened; the retry parks the step for a person. The sandbox ledger shows every
call the provider received, with its idempotency key.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from onward import Automation, budgets
from onward.engine import Engine
from onward.errors import ActionRefused, InvalidInput, UnknownRun
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import effect_row, eventually, history, run_row, steps

ORG = "test"
FAST_RETRY = {"max_attempts": 5, "base": 0.01, "cap": 0.05}

pytestmark = pytest.mark.usefixtures("admin")


async def connect(engine: Engine, sandbox: SandboxServer, connection: str, provider: str) -> None:
    await engine.integrations.add_connection(
        ORG, connection, provider=provider, base_url=sandbox.url, account="acct_1", secret="acct_1"
    )


async def parked_for_review(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection
) -> tuple[str, str]:
    """A run whose charge happened but whose answer was lost: parked for review. Returns the
    run id and the charge's effect key."""
    await connect(engine, sandbox, "billing", "payment")
    flow = (
        Automation("charge-once")
        .step(
            "charge",
            "payment.charge",
            connection="billing",
            amount=4200,
            currency="eur",
            customer="cus_maya",
            retry=FAST_RETRY,
        )
        .step("after", "set", values={"done": "true"})
    )
    await engine.publish(flow.build())
    admin.faults("payment", script=["drop_after_work"])
    run_id = (await engine.start("charge-once", {}, event_id="evt-charge")).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "parked"
    (charge,) = steps(sql, run_id, "charge")
    assert (charge["status"], charge["wait_kind"]) == ("parked", "review"), charge
    key = f"{run_id}/charge/1"
    effect = effect_row(sql, key)
    assert effect is not None and effect["status"] == "review", effect
    assert len(admin.ledger("payment")) == 1  # the charge did happen
    return run_id, key


def events(sql: psycopg.Connection, run_id: str) -> list[str]:
    return [h["event"] for h in history(sql, run_id)]


# -- resolve a review -----------------------------------------------------------------------


async def test_it_happened_settles_the_effect_with_the_reference_and_the_run_completes(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    run_id, key = await parked_for_review(engine, sandbox, admin, sql)
    reference = admin.ledger("payment")[0]["response_id"]

    done = await engine.resolve_review(run_id, "happened", reference=reference, by="ana")
    assert (done["status"], done["how"], done["effects"]) == ("active", "happened", [key])
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"

    assert len(admin.ledger("payment")) == 1  # not charged again
    (charge,) = steps(sql, run_id, "charge")
    assert charge["status"] == "done"
    assert charge["output"] == {
        "id": reference,
        "reference": reference,
        "resolved": {"how": "happened", "by": "ana"},
    }
    effect = effect_row(sql, key)
    assert effect is not None and (effect["status"], effect["attempts"]) == ("settled", 1)
    (resolved,) = history(sql, run_id, "review_resolved")
    assert resolved["detail"] == {
        "how": "happened",
        "reference": reference,
        "by": "ana",
        "effects": [key],
    }
    # no expression of this automation reads the charge's output: it is on the step row only
    assert "charge" not in run_row(sql, run_id)["ctx"]["steps"]


async def test_retry_calls_the_provider_once_more_with_the_same_idempotency_key(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    run_id, key = await parked_for_review(engine, sandbox, admin, sql)

    await engine.resolve_review(run_id, "retry", by="ana")
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"

    charges = admin.ledger("payment")
    assert [c["idempotency_key"] for c in charges] == [key, key]  # one more call, same key
    (charge,) = steps(sql, run_id, "charge")
    assert charge["status"] == "done" and charge["output"]["id"] == charges[1]["response_id"]
    effect = effect_row(sql, key)
    assert effect is not None
    assert (effect["status"], effect["attempts"], effect["retry_approved_by"]) == (
        "settled",
        2,
        None,  # the permission was spent by the attempt it allowed
    )
    (resolved,) = history(sql, run_id, "review_resolved")
    assert (resolved["detail"]["how"], resolved["detail"]["by"]) == ("retry", "ana")


async def test_skip_ends_the_step_skipped_and_the_run_goes_on_without_a_call(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    run_id, key = await parked_for_review(engine, sandbox, admin, sql)

    await engine.resolve_review(run_id, "skip", by="ana")
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"

    assert len(admin.ledger("payment")) == 1
    (charge,) = steps(sql, run_id, "charge")
    (after,) = steps(sql, run_id, "after")
    assert (charge["status"], after["status"]) == ("skipped", "done")
    assert charge["output"] == {"skipped": True, "by": "ana"}
    effect = effect_row(sql, key)
    assert effect is not None and effect["status"] == "skipped"
    tail = events(sql, run_id)
    assert tail[tail.index("review_resolved") :] == [
        "review_resolved",
        "step_skipped",
        "step_done",  # `after`, claimed eagerly, with the run's completion
    ]
    assert history(sql, run_id)[-1]["detail"] == {"run": "completed"}


async def test_a_resolution_that_does_not_apply_is_refused_and_changes_nothing(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    run_id, key = await parked_for_review(engine, sandbox, admin, sql)
    before = events(sql, run_id)

    with pytest.raises(InvalidInput, match="reference"):
        await engine.resolve_review(run_id, "happened", by="ana")
    with pytest.raises(InvalidInput, match="one of happened, retry, skip"):
        await engine.resolve_review(run_id, "undo", by="ana")
    with pytest.raises(ActionRefused, match="resolve the review") as refused:
        await engine.resume(run_id, by="ana")
    assert refused.value.reason == "parked_review"
    with pytest.raises(ActionRefused, match="not in review"):
        await engine.resolve_review(run_id, "retry", by="ana", effect_key="no/such/1")
    with pytest.raises(UnknownRun):
        await engine.resolve_review("run_nope", "skip", by="ana")
    assert events(sql, run_id) == before
    effect = effect_row(sql, key)
    assert effect is not None and effect["status"] == "review"

    await engine.resolve_review(run_id, "skip", by="ana")
    with pytest.raises(ActionRefused, match="not parked") as again:
        await engine.resolve_review(run_id, "skip", by="bob")  # resolved once: not twice
    assert again.value.reason == "not_parked"
    assert len(history(sql, run_id, "review_resolved")) == 1


# -- resume ---------------------------------------------------------------------------------


async def test_a_run_parked_on_its_budget_is_resumed_by_an_operator_and_completes(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    """A worker that died after reserving the whole day's budget leaves a reservation that
    stops counting when its lease lapses -- but nothing resumes the step it made park before
    tomorrow. An operator does."""
    await connect(engine, sandbox, "llm", "model")
    await engine.set_budget("*", "tokens", 300)
    assert await budgets.reserve(
        engine.pool, ORG, "other", "dead-worker/1", cost={"tokens": 300.0}, lease=1.0
    )
    flow = Automation("summarise").step("draft", "model.generate", connection="llm", prompt="hi")
    flow = flow.step("after", "set", values={"done": "true"})
    await engine.publish(flow.build())
    run_id = (await engine.start("summarise", {}, event_id="evt-sum")).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "parked"
    (draft,) = steps(sql, run_id, "draft")
    assert draft["wait_kind"] == "budget"
    assert admin.ledger("model") == []

    async def lapsed() -> bool:
        row = sql.execute(
            "SELECT bool_and(lease_until < now()) AS lapsed FROM budget_reservations"
            " WHERE org_id = %s AND effect_key = 'dead-worker/1'",
            (ORG,),
        ).fetchone()
        return bool(row and row["lapsed"])

    await eventually(lapsed, timeout=10, what="the dead worker's reservation lapsed")
    resumed = await engine.resume(run_id, by="ana")
    assert (resumed["status"], resumed["was"], resumed["by"]) == ("active", "budget", "ana")
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"

    assert len(admin.ledger("model")) == 1
    (event,) = history(sql, run_id, "step_resumed")
    assert event["detail"] == {"by": "ana", "via": "operator", "was": "budget"}
    # and the audit has it once, naming who (written in the resume's transaction)
    rows = sql.execute("SELECT actor, target FROM audit WHERE action = 'resume'").fetchall()
    assert [(r["actor"], r["target"]) for r in rows] == [("ana", run_id)]


async def test_resuming_a_reconnect_park_while_the_connection_is_broken_is_refused(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    await connect(engine, sandbox, "mailbox", "email")
    flow = Automation("note").step(
        "send", "email.send", connection="mailbox", to="maya@example.test", subject="s", body="b"
    )
    await engine.publish(flow.build())
    admin.revoke("email", "acct_1")
    run_id = (await engine.start("note", {}, event_id="evt-note")).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "parked"
    before = events(sql, run_id)

    with pytest.raises(ActionRefused, match="still broken: restore it") as refused:
        await engine.resume(run_id, by="ana")
    assert refused.value.reason == "parked_reconnect"
    with pytest.raises(ActionRefused, match="not for review"):
        await engine.resolve_review(run_id, "retry", by="ana")
    assert events(sql, run_id) == before
    (send,) = steps(sql, run_id, "send")
    assert (send["status"], send["wait_kind"]) == ("parked", "reconnect")

    admin.restore("email", "acct_1")
    await engine.integrations.restore(ORG, "mailbox")  # the restore resumes it
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    with pytest.raises(ActionRefused, match="has finished") as finished:
        await engine.resume(run_id, by="ana")
    assert finished.value.reason == "finished"


# -- fork -----------------------------------------------------------------------------------


async def failed_run(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin
) -> tuple[str, dict[str, Any]]:
    """set n=41, email "Note 41", bump n to 42, charge (refused: 400, the run fails), after."""
    await connect(engine, sandbox, "mailbox", "email")
    await connect(engine, sandbox, "billing", "payment")
    flow = (
        Automation("notes")
        .step("init", "set", values={"n": "41"})
        .step(
            "send",
            "email.send",
            connection="mailbox",
            to="maya@example.test",
            subject="Note {vars.n}",
            body="b",
        )
        .step("bump", "set", values={"n": "vars.n + 1"})
        .step("charge", "payment.charge", connection="billing", amount=100, customer="cus_maya")
        .step("after", "set", values={"done": "true"})
    )
    await engine.publish(flow.build())
    admin.faults("payment", script=["400"])
    run_id = (await engine.start("notes", {"name": "Maya"}, event_id="evt-notes")).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "failed"
    return run_id, {}


async def test_a_failed_run_forked_from_its_failed_step_completes_without_rerunning_earlier_steps(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    old, _ = await failed_run(engine, sandbox, admin)
    assert len(admin.ledger("email")) == 1 and admin.ledger("payment") == []

    forked = await engine.fork(old, by="ana")  # default: the step it stopped at
    assert (forked.created, forked.step_id, forked.seq, forked.version) == (True, "charge", 4, 1)
    assert forked.start_key == f"fork:{old}:4:v1"
    async with engine.running():
        assert await engine.wait(forked.run_id, timeout=30) == "completed"

    assert len(admin.ledger("email")) == 1  # the earlier email was not sent again
    (charge,) = admin.ledger("payment")
    assert charge["idempotency_key"] == f"{forked.run_id}/charge/1"
    new = run_row(sql, forked.run_id)
    assert (new["forked_from"], new["start_key_kind"], new["input"]) == (
        old,
        "fork",
        {"name": "Maya"},
    )
    assert new["ctx"]["vars"] == {"n": 42, "done": True}
    # the fork's context holds the outputs of the steps before its first, from their rows
    assert new["ctx"]["steps"]["send"] == steps(sql, old, "send")[0]["output"]
    rows = steps(sql, forked.run_id)
    assert [(s["seq"], s["step_id"], s["status"]) for s in rows] == [
        (1, "init", "done"),
        (2, "send", "done"),
        (3, "bump", "done"),
        (4, "charge", "done"),
        (5, "after", "done"),
    ]
    (mine,) = history(sql, forked.run_id, "run_forked")
    assert mine["detail"] == {
        "forked_from": old,
        "from_step": "charge",
        "seq": 4,
        "version": 1,
        "by": "ana",
    }
    (theirs,) = history(sql, old, "run_forked")
    assert (theirs["detail"]["fork"], theirs["detail"]["by"]) == (forked.run_id, "ana")
    assert run_row(sql, old)["status"] == "failed"  # the old run is left as it was

    again = await engine.fork(old, by="bob")
    assert (again.run_id, again.created) == (forked.run_id, False)
    assert len(history(sql, old, "run_forked")) == 1
    # one audit row: the fork that made a run (the repeat changed nothing and wrote none)
    rows = sql.execute("SELECT actor FROM audit WHERE action = 'fork'").fetchall()
    assert [r["actor"] for r in rows] == ["ana"]


async def test_a_fork_from_an_earlier_step_runs_it_again_with_the_variables_it_had(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    old, _ = await failed_run(engine, sandbox, admin)

    forked = await engine.fork(old, from_step="send", by="ana")
    assert (forked.step_id, forked.seq) == ("send", 2)
    async with engine.running():
        assert await engine.wait(forked.run_id, timeout=30) == "completed"

    subjects = [e["request"]["subject"] for e in admin.ledger("email")]
    assert subjects == ["Note 41", "Note 41"]  # n as it was before `send`, not the final 42
    assert run_row(sql, forked.run_id)["ctx"]["vars"]["n"] == 42  # bumped once, in the fork
    assert [s["step_id"] for s in steps(sql, forked.run_id)][:2] == ["init", "send"]
    other = await engine.fork(old, by="ana")
    assert other.run_id != forked.run_id  # another step entry, another fork


async def test_a_fork_that_does_not_apply_is_refused(
    engine: Engine, sandbox: SandboxServer, admin: SandboxAdmin, sql: psycopg.Connection
) -> None:
    old, _ = await failed_run(engine, sandbox, admin)
    with pytest.raises(ActionRefused, match="never reached step 'nope'") as unknown:
        await engine.fork(old, from_step="nope", by="ana")
    assert unknown.value.reason == "unknown_step"
    with pytest.raises(UnknownRun):
        await engine.fork("run_nope", by="ana")
    with pytest.raises(InvalidInput, match="by"):
        await engine.fork(old, by="  ")

    forked = await engine.fork(old, by="ana")
    with pytest.raises(ActionRefused, match="not finished") as active:
        await engine.fork(forked.run_id, by="ana")  # still active: cancel it first
    assert active.value.reason == "not_forkable"
    async with engine.running():
        assert await engine.wait(forked.run_id, timeout=30) == "completed"
    with pytest.raises(ActionRefused, match="completed: nothing to retry"):
        await engine.fork(forked.run_id, by="ana")
    assert [h["event"] for h in history(sql, old, "run_forked")] == ["run_forked"]
