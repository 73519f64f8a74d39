"""A run's context keeps only the outputs its automation's expressions read (issue 16): the
run row does not grow with every step, every output stays on its step row, and a migration to
a version that reads more fills the context from the step rows. Real PostgreSQL, a real
in-process worker."""

from __future__ import annotations

from typing import Any

import psycopg

import onward.testing.kinds  # noqa: F401  (registers test.sleep, which says nothing of what it reads)
from onward.engine import Engine
from onward.testing import eventually, run_row, steps


def chain(third: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "ctx",
        "steps": [
            {"id": "a", "kind": "set", "with": {"values": {"x": "1"}}, "next": "b"},
            {"id": "b", "kind": "set", "with": {"values": {"y": "steps.a.x + 1"}}, "next": "c"},
            third,
        ],
    }


async def run_to_end(engine: Engine, doc: dict[str, Any], key: str) -> str:
    await engine.publish(doc)
    async with engine.running():
        run_id = (await engine.start(doc["id"], {}, key=key)).run_id
        assert await engine.wait(run_id, timeout=30) == "completed"
    return run_id


async def test_the_context_keeps_the_outputs_expressions_read_and_every_step_row_its_own(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    run_id = await run_to_end(
        engine, chain({"id": "c", "kind": "set", "with": {"values": {"z": "3"}}}), "k1"
    )
    ctx = run_row(sql, run_id)["ctx"]
    assert ctx["vars"] == {"x": 1, "y": 2, "z": 3}
    assert ctx["steps"] == {"a": {"x": 1}}  # b reads a; nothing reads b or c
    for step_id, output in (("a", {"x": 1}), ("b", {"y": 2}), ("c", {"z": 3})):
        (row,) = steps(sql, run_id, step_id)
        # a `set` step's output is its variables, stored once (migration 0032)
        assert (row["status"], row["output"], row["vars"]) == ("done", None, output)


async def test_a_kind_that_does_not_say_what_it_reads_keeps_every_output(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    third = {"id": "c", "kind": "test.sleep", "with": {"seconds": 0}}
    run_id = await run_to_end(engine, chain(third), "k2")
    assert set(run_row(sql, run_id)["ctx"]["steps"]) == {"a", "b", "c"}


async def test_an_expression_reading_steps_as_a_whole_keeps_every_output(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    third = {"id": "c", "kind": "set", "with": {"values": {"n": "size(steps)"}}}
    run_id = await run_to_end(engine, chain(third), "k3")
    ctx = run_row(sql, run_id)["ctx"]
    assert set(ctx["steps"]) == {"a", "b", "c"}
    assert ctx["vars"]["n"] == 2  # a and b were in the context when c ran


def paused(tag_expr: str, pause: str) -> dict[str, Any]:
    return {
        "id": "mctx",
        "steps": [
            {"id": "a", "kind": "set", "with": {"values": {"x": "7"}}, "next": "pause"},
            {"id": "pause", "kind": "wait_for", "with": {"duration": pause}, "next": "fin"},
            {"id": "fin", "kind": "set", "with": {"values": {"tag": tag_expr}}},
        ],
    }


async def test_a_migration_to_a_version_that_reads_more_fills_the_context_from_the_steps(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await engine.publish(paused("'v1'", "1h"))  # v1 reads no output
    async with engine.running():
        run_id = (await engine.start("mctx", {}, key="m1")).run_id

        async def waiting() -> bool:
            return run_row(sql, run_id)["status"] == "waiting"

        await eventually(waiting, timeout=30, what="the run waits at pause")
        assert run_row(sql, run_id)["ctx"]["steps"] == {}
        await engine.publish(paused("steps.a.x * 2", "1s"))  # v2 reads a's
        op = await engine.migrate_runs("mctx", 1, 2, {})
        assert op["status"] == "done" and op["done"] == 1
        assert run_row(sql, run_id)["ctx"]["steps"] == {"a": {"x": 7}}
        assert await engine.wait(run_id, timeout=30) == "completed"
    row = run_row(sql, run_id)
    assert (row["version"], row["ctx"]["vars"]["tag"]) == (2, 14)
