"""Batch starts (``Engine.start_many``): up to 1,000 runs in one statement and one commit, each
with its own start key and answer, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from onward import Automation, ContactErased, InvalidInput
from onward.engine import Engine
from onward.errors import UnknownAutomation
from onward.start import MAX_BATCH, Start
from onward.start import Q as START_Q

FLOW = Automation("greet").step("hello", "set", values={"greeting": "'hi ' + input.name"}).build()


def _count(sql: psycopg.Connection, query: str, *args: Any) -> int:
    row = sql.execute(query, args).fetchone()
    assert row is not None
    return int(row["n"])


def _transactions(sql: psycopg.Connection) -> int:
    """How many transactions wrote the runs other than ``warm``: the rows one transaction
    inserts share its id (``xmin``) -- exact, and blind to other databases' work."""
    return _count(sql, "SELECT count(DISTINCT xmin::text) AS n FROM runs WHERE start_key <> 'warm'")


async def test_a_thousand_starts_in_one_call_make_runs_that_complete(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(FLOW)
    starts = [Start("greet", {"name": f"n{i}"}, event_id=f"evt-{i}") for i in range(MAX_BATCH)]
    answers = await engine.start_many(starts)
    assert len(answers) == MAX_BATCH
    assert all(a.created for a in answers)
    assert [a.start_key for a in answers] == [f"greet:evt-{i}" for i in range(MAX_BATCH)]
    assert len({a.run_id for a in answers}) == MAX_BATCH
    # each run with its input, its first step, its wake and its history, in request order
    rows = sql.execute(
        "SELECT run_id, input->>'name' AS name FROM runs WHERE start_key = ANY(%s)",
        ([a.start_key for a in answers],),
    ).fetchall()
    names = {r["run_id"]: r["name"] for r in rows}
    assert [names[a.run_id] for a in answers] == [f"n{i}" for i in range(MAX_BATCH)]
    assert _count(sql, "SELECT count(*) AS n FROM steps WHERE status = 'ready'") == MAX_BATCH
    assert _count(sql, "SELECT count(*) AS n FROM outbox WHERE topic = 'step'") == MAX_BATCH
    firsts = sql.execute(
        "SELECT DISTINCT ON (run_id) run_id, event FROM history ORDER BY run_id, event_id"
    ).fetchall()
    assert len(firsts) == MAX_BATCH and {r["event"] for r in firsts} == {"run_started"}
    assert _count(sql, "SELECT count(*) AS n FROM history WHERE event = 'step_ready'") == MAX_BATCH
    async with engine.running():
        await _until_all_completed(sql, MAX_BATCH)
    done = sql.execute(
        "SELECT run_id, ctx->'vars'->>'greeting' AS g FROM runs WHERE status = 'completed'"
    ).fetchall()
    assert {r["run_id"]: r["g"] for r in done}[answers[7].run_id] == "hi n7"


async def _until_all_completed(sql: psycopg.Connection, n: int, timeout: float = 120.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while _count(sql, "SELECT count(*) AS n FROM runs WHERE status = 'completed'") < n:
        assert loop.time() < deadline, "the batch's runs did not all complete"
        await asyncio.sleep(0.1)


async def test_a_batch_is_one_commit(engine: Engine, sql: psycopg.Connection) -> None:
    await engine.publish(FLOW)
    await engine.start_many([{"automation_id": "greet", "key": "warm"}])
    await engine.start_many([Start("greet", {"i": i}) for i in range(500)])
    assert _transactions(sql) == 1
    assert _count(sql, "SELECT count(*) AS n FROM runs") == 501


async def test_duplicates_within_the_batch_and_against_existing_runs(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(FLOW)
    old = await engine.start("greet", {"name": "Old"}, key="k-old")
    answers = await engine.start_many(
        [
            {"automation_id": "greet", "payload": {"name": "A"}, "key": "k-a"},
            {"automation_id": "greet", "payload": {"name": "Old again"}, "key": "k-old"},
            {"automation_id": "greet", "payload": {"name": "A again"}, "key": "k-a"},
            {"automation_id": "greet", "payload": {"name": "Same"}},
            {"automation_id": "greet", "payload": {"name": "Same"}},
            {"automation_id": "greet", "payload": {"name": "Old thrice"}, "key": "k-old"},
        ]
    )
    created = [a.created for a in answers]
    assert created == [True, False, False, True, False, False]
    assert answers[2].run_id == answers[0].run_id
    assert answers[4].run_id == answers[3].run_id
    assert answers[1].run_id == answers[5].run_id == old.run_id
    assert ":sha256:" in answers[3].start_key
    assert _count(sql, "SELECT count(*) AS n FROM runs") == 3
    # the first start's input wins; the duplicates' are not stored
    row = sql.execute("SELECT input FROM runs WHERE run_id = %s", (answers[0].run_id,)).fetchone()
    assert row is not None and row["input"] == {"name": "A"}
    # one start_duplicate per duplicate start, after the run's run_started
    dups = sql.execute(
        "SELECT run_id, count(*) AS n FROM history WHERE event = 'start_duplicate' GROUP BY run_id"
    ).fetchall()
    assert {r["run_id"]: r["n"] for r in dups} == {
        old.run_id: 2,
        answers[0].run_id: 1,
        answers[3].run_id: 1,
    }
    for run_id in (answers[0].run_id, answers[3].run_id):
        events = [
            r["event"]
            for r in sql.execute(
                "SELECT event FROM history WHERE run_id = %s ORDER BY event_id", (run_id,)
            )
        ]
        assert events[0] == "run_started"  # the duplicate comes after, in the same commit
        assert sorted(events[1:]) == ["start_duplicate", "step_ready"]
    # a repeat of the whole batch answers the same runs, none created
    again = await engine.start_many(
        [{"automation_id": "greet", "payload": {"name": "A"}, "key": "k-a"}]
    )
    assert again[0].run_id == answers[0].run_id and not again[0].created


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"automation_id": "greet", "key": "x" * 513}, "key: at most 512"),
        ({"automation_id": "greet", "event_id": "e\x00"}, "event id"),
        ({"automation_id": "greet", "payload": {"n": float("nan")}}, "payload"),
        ({"automation_id": "greet", "payload": ["not", "an", "object"]}, "JSON object"),
        ({"automation_id": "greet", "payload": {"blob": "x" * 300_000}}, "exceeds the limit"),
        ({"automation_id": "greet", "version": 0}, "version"),
        ({"automation_id": "greet", "colour": "red"}, "unknown field"),
        ({"payload": {}}, "automation_id is required"),
        ({"automation_id": "nope"}, "no published automation 'nope'"),
        ({"automation_id": "greet", "version": 9}, "no published version 9"),
    ],
)
async def test_a_bad_start_refuses_the_batch_naming_it_and_nothing_is_stored(
    engine: Engine, sql: psycopg.Connection, bad: dict[str, Any], reason: str
) -> None:
    await engine.publish(FLOW)
    old = await engine.start("greet", {}, key="k-old")
    good = [
        {"automation_id": "greet", "key": "k-1"},
        {"automation_id": "greet", "key": "k-old"},  # a duplicate: no history row either
    ]
    unknown = "no published" in reason  # 404 over HTTP, like a single start's
    with pytest.raises(
        UnknownAutomation if unknown else InvalidInput,
        match=r"^starts\[2\]: .*" + reason.replace("(", r"\("),
    ):
        await engine.start_many([*good, bad, {"automation_id": "greet", "key": "k-3"}])
    assert [r["run_id"] for r in sql.execute("SELECT run_id FROM runs")] == [old.run_id]
    assert _count(sql, "SELECT count(*) AS n FROM history WHERE event = 'start_duplicate'") == 0
    assert _count(sql, "SELECT count(*) AS n FROM steps") == 1


async def test_an_unknown_automation_with_an_existing_key_is_a_duplicate(engine: Engine) -> None:
    # as with a single start: the key's run answers, whatever the start names
    await engine.publish(FLOW)
    old = await engine.start("greet", {}, key="k-old")
    single = await engine.start("nope", {}, key="k-old")
    [batch] = await engine.start_many([{"automation_id": "nope", "key": "k-old"}])
    assert single.run_id == batch.run_id == old.run_id and not batch.created


@pytest.mark.parametrize("n", [0, MAX_BATCH + 1])
async def test_empty_and_over_a_thousand_are_refused(
    engine: Engine, sql: psycopg.Connection, n: int
) -> None:
    await engine.publish(FLOW)
    with pytest.raises(InvalidInput, match=f"1 to {MAX_BATCH} starts in a batch \\({n} given"):
        await engine.start_many([Start("greet", {"i": i}) for i in range(n)])
    assert _count(sql, "SELECT count(*) AS n FROM runs") == 0


async def test_an_erased_contact_refuses_the_batch(engine: Engine, sql: psycopg.Connection) -> None:
    await engine.publish(FLOW)
    await engine.erase_contact("c_erased", by="dpo")
    starts = [
        Start("greet", {"i": 0}, contact_id="c_ok"),
        Start("greet", {"i": 1}),
        Start("greet", {"i": 2}, contact_id="C_Erased"),  # the same contact, another case
    ]
    with pytest.raises(ContactErased, match=r"^starts\[2\]: contact 'C_Erased' was erased"):
        await engine.start_many(starts)
    assert _count(sql, "SELECT count(*) AS n FROM runs") == 0
    answers = await engine.start_many(starts[:2])
    assert [a.created for a in answers] == [True, True]
    row = sql.execute("SELECT contact_id FROM runs WHERE run_id = %s", (answers[0].run_id,))
    assert row.fetchone() == {"contact_id": "c_ok"}


async def test_the_traceparent_is_kept_by_every_run(
    engine: Engine, sql: psycopg.Connection
) -> None:
    await engine.publish(FLOW)
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await engine.start_many([Start("greet", {"i": i}) for i in range(3)], traceparent=tp)
    rows = sql.execute("SELECT DISTINCT traceparent FROM runs").fetchall()
    assert rows == [{"traceparent": tp}]


async def test_concurrent_overlapping_batches_make_one_run_per_key(
    engine: Engine, sql: psycopg.Connection
) -> None:
    """Two tasks, each batch naming the same keys in opposite orders (runs are inserted in
    start-key order, so neither deadlocks), with single starts racing them too."""
    await engine.publish(FLOW)
    keys = [f"k-{i:04d}" for i in range(400)]

    async def batch(order: list[str]) -> list[Any]:
        return await engine.start_many([Start("greet", {"k": k}, key=k) for k in order])

    for _ in range(3):  # a few rounds: the race differs each time
        results = await asyncio.gather(
            batch(keys),
            batch(list(reversed(keys))),
            batch(keys[::2] + keys[1::2]),
            *(engine.start("greet", {"k": k}, key=k) for k in keys[::50]),
        )
        a, b, c = results[0], results[1], results[2]
        by_key = {s.start_key: s.run_id for s in a}
        assert {s.start_key: s.run_id for s in b} == by_key
        assert {s.start_key: s.run_id for s in c} == by_key
        for single in results[3:]:
            assert by_key[single.start_key] == single.run_id
        rows = sql.execute(
            "SELECT start_key, run_id FROM runs WHERE start_key = ANY(%s)", (keys,)
        ).fetchall()
        assert {r["start_key"]: r["run_id"] for r in rows} == by_key
        keys = [f"{k}-next" for k in keys]
    dups = _count(sql, "SELECT count(*) AS n FROM history WHERE event = 'start_duplicate'")
    assert dups == 3 * (3 * 400 + 8 - 400)


async def test_a_key_committed_after_the_batch_began_is_answered_by_a_second_read(
    engine: Engine, sql: psycopg.Connection, db_url: str
) -> None:
    """Another transaction inserts key k-2 and commits while the batch's statement waits on its
    row: ON CONFLICT skips it and the statement's snapshot does not see it, so the batch finds
    it with find_duplicates (and writes its start_duplicate there)."""
    await engine.publish(FLOW)
    other = await psycopg.AsyncConnection.connect(db_url)
    try:
        await other.execute(
            START_Q.start_run,
            {
                "org_id": engine.org_id,
                "run_id": "run_other",
                "automation_id": "greet",
                "version": None,
                "start_key": "k-2",
                "start_key_kind": "caller",
                "input": Jsonb({}),
                "contact_id": None,
                "traceparent": None,
            },
        )  # not committed yet
        batch = asyncio.create_task(
            engine.start_many([Start("greet", key=k) for k in ("k-1", "k-2", "k-2", "k-3")])
        )
        await _until_waiting_on_a_lock(sql)
        assert not batch.done()
        await other.commit()
        answers = await batch
    finally:
        await other.close()
    assert [(a.start_key, a.created) for a in answers] == [
        ("k-1", True),
        ("k-2", False),
        ("k-2", False),
        ("k-3", True),
    ]
    assert answers[1].run_id == answers[2].run_id == "run_other"
    assert _count(sql, "SELECT count(*) AS n FROM runs") == 3
    dups = sql.execute("SELECT run_id FROM history WHERE event = 'start_duplicate'").fetchall()
    assert dups == [{"run_id": "run_other"}] * 2


async def _until_waiting_on_a_lock(sql: psycopg.Connection, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    query = (
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE %s"
    )
    # the statement as sent begins with the line naming it (db/sql.py `load`)
    while _count(sql, query, "-- start.sql: start_many%") == 0:
        assert loop.time() < deadline, "the batch never waited on the other transaction's row"
        await asyncio.sleep(0.02)
