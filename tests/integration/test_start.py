"""Idempotent start (R1) and the outbox written with the run (R2), on a real PostgreSQL."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from onward import Automation, InvalidInput, PayloadTooLarge
from onward.engine import Engine
from onward.errors import UnknownAutomation

FLOW = Automation("greet").step("hello", "set", values={"greeting": "'hi ' + input.name"}).build()


async def test_fifty_concurrent_duplicate_starts_make_one_run(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(FLOW)
    results = await asyncio.gather(
        *(engine.start("greet", {"name": "Maya"}, event_id="evt_7Hq2") for _ in range(50))
    )
    run_ids = {r.run_id for r in results}
    assert len(run_ids) == 1
    assert sum(r.created for r in results) == 1
    assert sql.execute("SELECT count(*) AS n FROM runs").fetchone()["n"] == 1
    # run + first step + its wake + history were written together
    assert sql.execute("SELECT count(*) AS n FROM steps").fetchone()["n"] == 1
    assert sql.execute("SELECT count(*) AS n FROM outbox WHERE topic = 'step'").fetchone()["n"] == 1
    dups = sql.execute(
        "SELECT count(*) AS n FROM history WHERE event = 'start_duplicate'"
    ).fetchone()
    assert dups["n"] == 49


async def test_payload_hash_key_collapses_identical_payloads(engine: Engine) -> None:
    await engine.publish(FLOW)
    a = await engine.start("greet", {"name": "Maya"})
    b = await engine.start("greet", {"name": "Maya"})
    c = await engine.start("greet", {"name": "Sam"})
    assert a.run_id == b.run_id and not b.created
    assert c.run_id != a.run_id and c.created
    assert ":sha256:" in a.start_key


async def test_too_large_payload_is_refused_and_nothing_stored(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(FLOW)
    with pytest.raises(PayloadTooLarge):
        await engine.start("greet", {"blob": "x" * (engine.settings.max_payload_bytes + 1)})
    assert sql.execute("SELECT count(*) AS n FROM runs").fetchone()["n"] == 0


async def test_unknown_automation_is_a_clear_error(engine: Engine) -> None:
    with pytest.raises(UnknownAutomation, match="nope"):
        await engine.start("nope", {})


async def test_run_completes_and_history_is_ordered(engine: Engine) -> None:
    await engine.publish(FLOW)
    started = await engine.start("greet", {"name": "Maya"}, event_id="e1")
    async with engine.running():
        assert await engine.wait(started.run_id, timeout=20) == "completed"
    view = await engine.show(started.run_id)
    events = [e["event"] for e in view["history"]]
    # one row per step attempt: the claim is on the step row until its settle records it, and
    # the run's completion rides on its last step's row
    assert events == ["run_started", "step_ready", "step_done"]
    done = view["history"][-1]
    assert done["detail"] == {"run": "completed"} and done["attempt"] == 1
    assert view["run"]["ctx"]["vars"] == {"greeting": "hi Maya"}


def _nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "ids", "problem"),
    [
        ({"name": "Ma\x00ya"}, {}, "NUL"),
        ({"name": "\ud800"}, {}, "surrogate"),
        ({"score": float("nan")}, {}, "not a number"),
        ({"score": float("inf")}, {}, "not a number"),
        ({"deep": _nested(200)}, {}, "deep"),
        ({"name": "Maya"}, {"event_id": "evt\x00"}, "event id"),
        ({"name": "Maya"}, {"key": "k\ud800"}, "key"),
        ({"name": "Maya"}, {"event_id": "e" * 257}, "event id: at most 256 characters"),
        ({"name": "Maya"}, {"key": "k" * 513}, "key: at most 512 characters"),
        ({"name": "Maya"}, {"contact_id": "c" * 321}, "contact id: at most 320 characters"),
    ],
)
async def test_what_postgres_cannot_store_is_refused_before_anything_is_written(
    engine: Engine, sql: psycopg.Connection, payload: dict, ids: dict, problem: str
) -> None:
    """The library refuses, whole and first, what jsonb/text would refuse mid-statement."""
    await engine.publish(FLOW)
    with pytest.raises(InvalidInput, match=problem):
        await engine.start("greet", payload, **ids)
    assert sql.execute("SELECT count(*) AS n FROM runs").fetchone()["n"] == 0
    assert sql.execute("SELECT count(*) AS n FROM outbox").fetchone()["n"] == 0
