"""Flow control end to end (R5): a concurrency cap defers instead of waiting in a lease, a
circuit opens on failures, parks instead of burning retries, probes once and resumes every
parked step, and a budget parks a model call that does not fit and resumes when raised."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest

from onward import Automation, LeaseLost, budgets, ids, leases
from onward.engine import Engine
from onward.leases import Token
from onward.sandbox import SandboxServer
from onward.sweep import Sweeper
from onward.testing import eventually, history

pytestmark = pytest.mark.usefixtures("admin")  # every test starts on a clean sandbox


async def connect(engine: Engine, sandbox: SandboxServer, connection: str, provider: str) -> None:
    await engine.integrations.add_connection(
        engine.org_id,
        connection,
        provider=provider,
        base_url=sandbox.url,
        account="acct_1",
        secret="acct_1",
    )


async def faults(sandbox: SandboxServer, provider: str, **knobs: Any) -> None:
    async with httpx.AsyncClient(base_url=sandbox.url) as client:
        (await client.post(f"/_admin/faults/{provider}", json=knobs)).raise_for_status()


# one email a run, to the mailbox connection, retried quickly
MAIL = Automation("mail").step(
    "send",
    "email.send",
    connection="mailbox",
    to="{input.to}",
    subject="s",
    body="b",
    retry={"max_attempts": 3, "base": 0.05, "cap": 0.1},
)


def statuses(sql: psycopg.Connection[Any], run_ids: list[str]) -> dict[str, str]:
    rows = sql.execute(
        "SELECT run_id, status FROM runs WHERE run_id = ANY(%s)", (run_ids,)
    ).fetchall()
    return {r["run_id"]: r["status"] for r in rows}


async def test_a_concurrency_cap_defers_steps_with_no_attempt_spent(
    engine: Engine, sql: psycopg.Connection[Any], sandbox: SandboxServer
) -> None:
    await connect(engine, sandbox, "crm", "crm")
    await engine.set_limit("connection:crm", max_concurrent=1)
    await faults(sandbox, "crm", latency_ms=300)
    flow = Automation("upsert").step(
        "crm", "crm.upsert", connection="crm", external_id="{input.id}"
    )
    await engine.publish(flow.build())
    runs = [
        (await engine.start("upsert", {"id": f"c{i}"}, event_id=f"u{i}")).run_id for i in range(4)
    ]
    async with engine.running():
        for run_id in runs:
            assert await engine.wait(run_id, timeout=60) == "completed"
    deferred = [h for r in runs for h in history(sql, r, "step_deferred")]
    assert deferred, "with a cap of 1 and four calls of 300 ms, some were held back"
    assert all(h["detail"]["limit"] == "connection:crm" for h in deferred)
    failures = sql.execute("SELECT max(failures) AS f FROM steps WHERE run_id = ANY(%s)", (runs,))
    assert failures.fetchone() == {"f": 0}  # deferrals spend no attempt


async def test_a_circuit_opens_parks_probes_once_and_resumes_every_parked_step(
    engine: Engine, sql: psycopg.Connection[Any], sandbox: SandboxServer
) -> None:
    await connect(engine, sandbox, "mailbox", "email")
    for key in ("provider:email", "connection:mailbox"):  # both see every failure
        await engine.configure_circuit(key, threshold=2, window_seconds=60, cooldown_seconds=1)
    await faults(sandbox, "email", error_rate=1.0)
    await engine.publish(MAIL.build())
    runs = [
        (await engine.start("mail", {"to": f"m{i}@example.test"}, event_id=f"m{i}")).run_id
        for i in range(5)
    ]
    async with engine.running():

        async def all_parked() -> Any:
            got = statuses(sql, runs)
            return got if set(got.values()) == {"parked"} and len(got) == 5 else None

        await eventually(all_parked, timeout=30, what="every run parked on the circuit")
        reasons = sql.execute(
            "SELECT DISTINCT wait_kind FROM steps WHERE run_id = ANY(%s)", (runs,)
        ).fetchall()
        assert reasons == [{"wait_kind": "circuit"}]
        # the provider recovers; after the cool-down one probe goes through and closes it
        await faults(sandbox, "email")
        for run_id in runs:
            assert await engine.wait(run_id, timeout=30, or_parked=False) == "completed"
    opened = [h for r in runs for h in history(sql, r, "circuit_opened")]
    probes = [h for r in runs for h in history(sql, r, "circuit_half_open")]
    closed = [h for r in runs for h in history(sql, r, "circuit_closed")]
    # one probe per circuit that had steps parked on it (the connection's, the provider's, or
    # both: then the first probe to run takes the other circuit too), and every other parked
    # step resumed when its circuit closed
    assert len(opened) >= 1 and 1 <= len(probes) <= 2
    assert len(closed) >= len(runs) - len(probes)
    # no step burnt its retries: at most the failures before the circuit opened
    rows = sql.execute("SELECT failures FROM steps WHERE run_id = ANY(%s)", (runs,)).fetchall()
    assert max(r["failures"] for r in rows) <= 2
    assert {c["key"]: c["state"] for c in await engine.circuits()} == {
        "connection:mailbox": "closed",
        "provider:email": "closed",
    }


async def test_a_step_parked_on_a_circuit_that_closed_before_the_park_resumes_on_the_sweep(
    engine: Engine, sql: psycopg.Connection[Any], sandbox: SandboxServer
) -> None:
    """The race the chaos run found: a step reads its circuit open and parks a statement later,
    after the probe's close resumed the steps parked when it ran. The state that race leaves --
    a step parked on a closed circuit -- is made here by closing the circuit in SQL without its
    resume; the sweeper's backstop (circuits.sql resume_stranded) resumes it."""
    await connect(engine, sandbox, "mailbox", "email")
    await engine.configure_circuit(
        "connection:mailbox", threshold=1, window_seconds=60, cooldown_seconds=3600
    )
    await faults(sandbox, "email", error_rate=1.0)
    await engine.publish(MAIL.build())
    run_id = (await engine.start("mail", {"to": "s@example.test"}, event_id="s1")).run_id
    async with engine.running(sweeper=False):

        async def parked() -> bool:
            return statuses(sql, [run_id]) == {run_id: "parked"}

        await eventually(parked, timeout=30, what="the run parked on the circuit")
    await faults(sandbox, "email")
    sql.execute(
        "UPDATE circuits SET state = 'closed', failures = 0 WHERE key = 'connection:mailbox'"
    )
    async with engine.running():
        assert await engine.wait(run_id, timeout=30, or_parked=False) == "completed"
    (closed,) = history(sql, run_id, "circuit_closed")
    assert closed["detail"] == {"circuit": "connection:mailbox", "stranded": True}
    assert history(sql, run_id, "circuit_half_open") == []  # no probe: the cool-down is 1 h


DRAFT = Automation("draft").step(
    "draft", "model.generate", connection="model", prompt="Write hello", max_tokens=60
)
BIG_DRAFT = Automation("big-draft").step(
    "draft", "model.generate", connection="model", prompt="Write hello", max_tokens=2000
)


async def test_an_exhausted_budget_parks_and_raising_it_resumes(
    engine: Engine, sql: psycopg.Connection[Any], sandbox: SandboxServer
) -> None:
    await connect(engine, sandbox, "model", "model")
    await engine.set_budget("*", "tokens", 10)  # a draft may cost up to prompt + 60 tokens
    flow = Automation("draft").step(
        "draft", "model.generate", connection="model", prompt="Write hello", max_tokens=60
    )
    await engine.publish(flow.build())
    run_id = (await engine.start("draft", {}, event_id="d1")).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "parked"
        step = sql.execute("SELECT wait_kind, error FROM steps WHERE run_id = %s", (run_id,))
        row = step.fetchone()
        assert row is not None and row["wait_kind"] == "budget"
        await engine.set_budget("*", "tokens", 1000)
        assert await engine.wait(run_id, timeout=30, or_parked=False) == "completed"
    (budget,) = await engine.budgets()
    out = sql.execute("SELECT output FROM steps WHERE run_id = %s", (run_id,)).fetchone()
    assert out is not None
    spent = out["output"]["tokens_in"] + out["output"]["tokens_out"]
    assert float(budget["charged_today"]) == spent and float(budget["reserved"]) == 0
    assert len(history(sql, run_id, "step_resumed")) == 1


async def test_a_step_parked_after_a_raise_it_missed_resumes_by_the_sweeper(
    engine: Engine, sql: psycopg.Connection[Any], sandbox: SandboxServer
) -> None:
    """The race of a budget's raise with a park: a step's reservation fails, the raise commits
    and resumes the steps parked then -- not this one, which parks a statement later. That
    state -- a step parked on a budget that has room for it -- is made here by raising the
    budget in SQL without its resume; the sweeper's backstop (budgets.sql resume_with_room)
    resumes it, and a step whose call still does not fit stays parked."""
    await connect(engine, sandbox, "model", "model")
    await engine.set_budget("*", "tokens", 10)  # a draft may cost up to prompt + 60 tokens
    await engine.publish(DRAFT.build())
    await engine.publish(BIG_DRAFT.build())
    small = (await engine.start("draft", {}, event_id="r1")).run_id
    big = (await engine.start("big-draft", {}, event_id="r2")).run_id
    async with engine.running(sweeper=False):
        for run_id in (small, big):
            assert await engine.wait(run_id, timeout=30) == "parked"
    (parked,) = sql.execute("SELECT error FROM steps WHERE run_id = %s", (small,)).fetchall()
    assert parked["error"]["detail"]["cost"] > 10  # what must fit to resume it
    sql.execute("UPDATE budgets SET per_day = 500 WHERE scope = '*'")  # no resume
    async with engine.running():
        assert await engine.wait(small, timeout=30, or_parked=False) == "completed"
    (resumed,) = history(sql, small, "step_resumed")
    assert resumed["detail"] == {"by": "budget", "reason": "room in the budget"}
    assert statuses(sql, [big]) == {big: "parked"}  # up to 2,000 tokens: no room for it
    assert history(sql, big, "step_resumed") == []


async def test_a_step_parked_behind_reservations_resumes_when_they_are_released(
    engine: Engine, sql: psycopg.Connection[Any], sandbox: SandboxServer
) -> None:
    """A budget full of other calls' reservations (in flight) parks a draft; when those calls
    end (their reservations released, or lapsed with their worker), the draft resumes with no
    raise and no new day."""
    await connect(engine, sandbox, "model", "model")
    await engine.set_budget("*", "tokens", 200)
    sql.execute(
        "INSERT INTO budget_reservations (org_id, effect_key, scope, unit, amount, lease_until)"
        " VALUES (%s, 'another-call', '*', 'tokens', 190, now() + interval '1 hour')",
        (engine.org_id,),
    )
    await engine.publish(DRAFT.build())
    run_id = (await engine.start("draft", {}, event_id="q1")).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "parked"
        sql.execute("DELETE FROM budget_reservations WHERE effect_key = 'another-call'")
        assert await engine.wait(run_id, timeout=30, or_parked=False) == "completed"
    (budget,) = await engine.budgets()
    assert float(budget["reserved"]) == 0 and 0 < float(budget["charged_today"]) <= 200


async def test_a_stale_attempt_reserves_no_budget(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    """A reservation is fenced like a settle: an attempt whose step was taken over (its worker
    stalled past the lease) is refused with LeaseLost and writes no reservation -- one written
    after the newer attempt had charged and freed the effect's would stay for ever. The
    attempt that holds the step reserves."""
    await engine.set_budget("*", "tokens", 100)
    await engine.publish(Automation("fenced").step("one", "set", values={"x": "1"}).build())
    run_id = (await engine.start("fenced", {}, event_id="f1")).run_id
    async with engine.pool.connection() as conn:
        (first,) = await leases.claim(conn, "fast", 10, "worker-a", 30.0)
    old = Token(engine.org_id, run_id, first["seq"], first["attempt"])
    sql.execute(
        "UPDATE steps SET lease_until = now() - interval '1 s' WHERE run_id = %s", (run_id,)
    )
    assert await Sweeper(engine.pool, worker_id="sweeper").rescue() == 1
    async with engine.pool.connection() as conn:
        (second,) = await leases.claim(conn, "fast", 10, "worker-b", 30.0)
    new = Token(engine.org_id, run_id, second["seq"], second["attempt"])
    assert (old.attempt, new.attempt) == (1, 2)

    key = ids.effect_key(run_id, "one", 1)
    with pytest.raises(LeaseLost):
        await budgets.reserve(
            engine.pool, engine.org_id, "fenced", key, cost={"tokens": 10.0}, lease=30.0, held=old
        )
    assert sql.execute("SELECT count(*) AS n FROM budget_reservations").fetchone()["n"] == 0

    assert await budgets.reserve(
        engine.pool, engine.org_id, "fenced", key, cost={"tokens": 10.0}, lease=30.0, held=new
    )
    rows = sql.execute("SELECT effect_key, amount FROM budget_reservations").fetchall()
    assert [(r["effect_key"], float(r["amount"])) for r in rows] == [(key, 10.0)]
