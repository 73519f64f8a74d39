"""A step's ``timeout``: the kind's call is stopped when it runs out, the attempt fails with
"timed out after", and the retry policy takes it from there. Real PostgreSQL, a real in-process
worker; the first attempt of ``test.sleep`` would sleep a minute, the second not at all."""

from __future__ import annotations

from typing import Any

import psycopg

import onward.testing.kinds  # noqa: F401  (registers test.sleep)
from onward.engine import Engine
from onward.testing import history, steps


def slow(timeout: Any, max_attempts: int) -> dict[str, Any]:
    return {
        "id": f"slow{max_attempts}",
        "steps": [
            {
                "id": "nap",
                "kind": "test.sleep",
                "with": {"seconds": 60, "retry_seconds": 0},
                "timeout": timeout,
                "retry": {"max_attempts": max_attempts, "base": 0.05, "cap": 0.05},
                "next": "after",
            },
            {"id": "after", "kind": "set", "with": {"values": {"done": "true"}}},
        ],
    }


async def run_until(engine: Engine, doc: dict[str, Any], status: str) -> str:
    """Publish ``doc``, start one run of it and work until it ends with ``status``."""
    await engine.publish(doc)
    async with engine.running():
        run_id = (await engine.start(doc["id"], {}, key=doc["id"])).run_id
        assert await engine.wait(run_id, timeout=30) == status
    return run_id


async def test_a_step_that_runs_out_of_time_fails_its_attempt_and_is_retried(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    run_id = await run_until(engine, slow("300ms", 2), "completed")
    (nap,) = steps(sql, run_id, "nap")
    assert nap["status"] == "done" and nap["attempt"] == 2
    assert nap["output"]["slept"] == 0  # the second attempt, not the minute of the first
    retried = [h for h in history(sql, run_id, seq=1) if "timed out" in str(h["detail"])]
    assert len(retried) == 1
    assert "step nap timed out after 0.3s" in str(retried[0]["detail"])


async def test_a_step_out_of_time_and_of_attempts_fails_its_run(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    run_id = await run_until(engine, slow(0.2, 1), "failed")  # seconds as a number
    (nap,) = steps(sql, run_id, "nap")
    assert nap["status"] == "failed" and nap["attempt"] == 1
    assert not steps(sql, run_id, "after")  # the run went no further
