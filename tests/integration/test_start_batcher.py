"""Concurrent ``Engine.start`` calls written together (``onward.start.StartBatcher``): one
statement and one commit for the starts that wait while others are written, and for each
caller the answer it would have had alone -- on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from onward import Automation, ContactErased, InvalidInput
from onward.config import ConfigError, Settings
from onward.engine import Engine
from onward.errors import IntakeLimited, UnknownAutomation
from onward.start import Started

FLOW = Automation("greet").step("hello", "set", values={"greeting": "'hi ' + input.name"}).build()
TP = "00-4bf92f3577b34da6a3ce929d0e0e47{:02d}-00f067aa0ba902b7-01"


def _count(sql: psycopg.Connection, query: str, *args: Any) -> int:
    row = sql.execute(query, args).fetchone()
    assert row is not None
    return int(row["n"])


def _transactions(sql: psycopg.Connection) -> int:
    """How many transactions wrote the runs other than ``warm``: the rows one transaction
    inserts share its id (``xmin``) -- exact, and blind to other databases' work."""
    return _count(sql, "SELECT count(DISTINCT xmin::text) AS n FROM runs WHERE start_key <> 'warm'")


@pytest.fixture
async def alone(settings: Settings) -> AsyncIterator[Engine]:
    """An engine whose every start is its own statement (``ONWARD_START_BATCHES=0``)."""
    async with Engine.open(
        dataclasses.replace(settings, start_batches=0), migrate=False, start_queue=False
    ) as eng:
        yield eng


async def test_concurrent_starts_share_statements_and_each_gets_its_own_answer(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(FLOW)
    await engine.start("greet", {"name": "warm"}, key="warm")
    n, keys = 300, 100  # each key started three times, interleaved
    answers = await asyncio.gather(
        *(
            engine.start("greet", {"name": f"n{i % keys}"}, event_id=f"e{i % keys}")
            for i in range(n)
        )
    )
    commits = _transactions(sql)
    assert commits <= n // 10, f"{commits} commits for {n} concurrent starts"
    by_key: dict[str, set[str]] = {}
    for i, a in enumerate(answers):
        assert a.start_key == f"greet:e{i % keys}"
        by_key.setdefault(a.start_key, set()).add(a.run_id)
    assert all(len(runs) == 1 for runs in by_key.values())
    assert sum(a.created for a in answers) == keys  # the first of each key, in call order
    assert all(answers[i].created for i in range(keys))
    rows = sql.execute(
        "SELECT run_id, start_key, input->>'name' AS name FROM runs WHERE start_key <> 'warm'"
    ).fetchall()
    assert {r["start_key"]: {r["run_id"]} for r in rows} == by_key
    assert all(r["name"] == "n" + r["start_key"].removeprefix("greet:e") for r in rows)
    dups = _count(sql, "SELECT count(*) AS n FROM history WHERE event = 'start_duplicate'")
    assert dups == n - keys
    assert _count(sql, "SELECT count(*) AS n FROM outbox WHERE topic = 'step'") == keys + 1


async def test_with_batching_off_each_start_is_its_own_commit(
    alone: Engine, sql: psycopg.Connection
) -> None:
    await alone.publish(FLOW)
    await alone.start("greet", {"name": "warm"}, key="warm")
    answers = await asyncio.gather(
        *(alone.start("greet", {"name": f"n{i}"}, key=f"k{i}") for i in range(20))
    )
    assert all(a.created for a in answers)
    assert _transactions(sql) == 20


async def test_an_unknown_automation_is_refused_alone(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(FLOW)
    calls = [engine.start("greet", {"name": f"a{i}"}, key=f"a{i}") for i in range(10)]
    calls.append(engine.start("nope", {"name": "x"}, key="x"))
    calls.append(engine.start("greet", {"name": "v9"}, key="v9", version=9))
    calls += [engine.start("greet", {"name": f"b{i}"}, key=f"b{i}") for i in range(10)]
    answers = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(answers[10], UnknownAutomation) and "'nope'" in str(answers[10])
    assert isinstance(answers[11], UnknownAutomation) and "version 9 of" in str(answers[11])
    good = answers[:10] + answers[12:]
    assert all(isinstance(a, Started) and a.created for a in good)
    assert _count(sql, "SELECT count(*) AS n FROM runs") == 20
    assert _count(sql, "SELECT count(*) AS n FROM runs WHERE start_key IN ('x', 'v9')") == 0


async def test_an_erased_contact_is_refused_alone(engine: Engine, sql: psycopg.Connection) -> None:
    await engine.publish(FLOW)
    await engine.erase_contact("c_erased", by="dpo")
    answers = await asyncio.gather(
        engine.start("greet", {"i": 0}, key="k0", contact_id="c_ok"),
        engine.start("greet", {"i": 1}, key="k1", contact_id="C_Erased"),  # another case
        engine.start("greet", {"i": 2}, key="k2"),
        engine.start("greet", {"i": 3}, key="k3", contact_id="c_erased"),
        return_exceptions=True,
    )
    assert isinstance(answers[1], ContactErased) and "'C_Erased' was erased" in str(answers[1])
    assert isinstance(answers[3], ContactErased)
    ok = [a for i, a in enumerate(answers) if i in (0, 2)]
    assert all(isinstance(a, Started) and a.created for a in ok)
    rows = sql.execute("SELECT start_key, contact_id FROM runs ORDER BY start_key").fetchall()
    assert rows == [
        {"start_key": "k0", "contact_id": "c_ok"},
        {"start_key": "k2", "contact_id": None},
    ]


async def test_a_statement_one_start_breaks_is_tried_again_start_by_start(
    engine: Engine, sql: psycopg.Connection
) -> None:
    """PostgreSQL itself refuses one start (a trigger stands for any refusal the checks before
    the statement do not foresee): that caller gets the error, the others their runs."""
    await engine.publish(FLOW)
    sql.execute(
        """
        CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.start_key = 'bad' THEN RAISE EXCEPTION 'start refused by a trigger'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_bad BEFORE INSERT ON runs FOR EACH ROW EXECUTE FUNCTION refuse_bad();
        """
    )
    calls = [engine.start("greet", {"i": i}, key=f"k{i}") for i in range(8)]
    calls.insert(4, engine.start("greet", {"i": -1}, key="bad"))
    answers = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(answers[4], psycopg.errors.RaiseException)
    assert "refused by a trigger" in str(answers[4])
    good = answers[:4] + answers[5:]
    assert all(isinstance(a, Started) and a.created for a in good)
    assert _count(sql, "SELECT count(*) AS n FROM runs") == 8


async def test_bad_input_is_refused_before_it_waits(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(FLOW)
    answers = await asyncio.gather(
        engine.start("greet", {"i": 0}, key="k0"),
        engine.start("greet", {"bad": "nul \x00"}, key="k1"),
        engine.start("greet", {"i": 2}, key="k2" * 300),
        engine.start("greet", {"i": 3}, key="k3"),
        return_exceptions=True,
    )
    assert isinstance(answers[1], InvalidInput) and isinstance(answers[2], InvalidInput)
    assert isinstance(answers[0], Started) and isinstance(answers[3], Started)
    assert _count(sql, "SELECT count(*) AS n FROM runs") == 2


async def test_each_start_keeps_its_own_traceparent(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(FLOW)
    answers = await asyncio.gather(
        *(engine.start("greet", {"i": i}, key=f"k{i}", traceparent=TP.format(i)) for i in range(6)),
        engine.start("greet", {"i": 9}, key="none"),
    )
    rows = sql.execute("SELECT run_id, traceparent FROM runs").fetchall()
    kept = {r["run_id"]: r["traceparent"] for r in rows}
    assert [kept[a.run_id] for a in answers] == [TP.format(i) for i in range(6)] + [None]


async def test_a_caller_cancelled_while_waiting_does_not_disturb_the_others(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(FLOW)
    tasks = [asyncio.ensure_future(engine.start("greet", {"i": i}, key=f"k{i}")) for i in range(40)]
    tasks[17].cancel()
    answers = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(answers[17], asyncio.CancelledError)
    assert all(isinstance(a, Started) and a.created for i, a in enumerate(answers) if i != 17)
    # the cancelled start may or may not have been written (as with a cancelled start_run);
    # a repeat answers it either way
    again = await engine.start("greet", {"i": 17}, key="k17")
    assert _count(sql, "SELECT count(*) AS n FROM runs WHERE start_key = 'k17'") == 1
    assert again.start_key == "k17"


def test_start_batches_out_of_range_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONWARD_START_BATCHES", "-1")
    with pytest.raises(ConfigError, match="ONWARD_START_BATCHES=-1"):
        Settings.from_env()
    monkeypatch.setenv("ONWARD_START_BATCHES", "0")
    assert Settings.from_env().start_batches == 0


async def test_concurrent_intake_requests_are_counted_together_and_each_answered_in_order(
    settings: Settings, sql: psycopg.Connection
) -> None:
    """``Engine.admit_intake`` (the webhook routes' rate limit): 40 requests at once against
    a limit of 25 -- exactly 25 admitted, in the order they came, with fewer upserts of the
    window's row than requests (a statement trigger counts them)."""
    sql.execute(
        """
        CREATE TABLE upserts (n int);
        CREATE FUNCTION count_upsert() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
        BEGIN INSERT INTO upserts VALUES (1); RETURN NULL; END $$;
        CREATE TRIGGER count_upsert AFTER INSERT ON intake_windows
            FOR EACH STATEMENT EXECUTE FUNCTION count_upsert();
        """
    )
    limited = dataclasses.replace(settings, intake_limit=25, intake_window_seconds=3600)
    async with Engine.open(limited, migrate=False, start_queue=False) as engine:
        answers = await asyncio.gather(
            *(engine.admit_intake() for _ in range(40)), return_exceptions=True
        )
    assert not [a for a in answers if a is not None and not isinstance(a, IntakeLimited)], answers
    windows = sql.execute("SELECT requests FROM intake_windows ORDER BY window_start").fetchall()
    assert sum(w["requests"] for w in windows) == 40
    if len(windows) == 1:  # no hour boundary fell among them
        assert answers[:25] == [None] * 25
        assert all(isinstance(a, IntakeLimited) for a in answers[25:]), answers[25:]
    statements = _count(sql, "SELECT count(*) AS n FROM upserts")
    assert 1 <= statements < 40
