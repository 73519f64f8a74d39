"""Publishing versions (R11) on a real PostgreSQL: immutable, numbered, deduplicated by content;
an invalid document stores nothing; a run finishes on the version it started on."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from onward import Automation, InvalidAutomation
from onward.automations import parse_text
from onward.engine import Engine
from onward.testing import eventually, history, run_row, steps


def v1() -> dict[str, Any]:
    return (
        Automation("greet")
        .step("hello", "set", values={"greeting": "'hi ' + input.name"})
        .step("pause", "wait_for", duration="1s")
        .step("bye", "set", values={"farewell": "'bye v1'"})
        .build()
    )


def v2() -> dict[str, Any]:
    return (
        Automation("greet")
        .step("hello", "set", values={"greeting": "'hello ' + input.name"})
        .step("pause", "wait_for", duration="1s")
        .step("bye2", "set", values={"farewell": "'bye v2'"})
        .build()
    )


V1_STEP_IDS = {"hello", "pause", "bye"}
V2_STEP_IDS = {"hello", "pause", "bye2"}

V1_YAML = """
id: greet
budget: {max_steps: 1000, max_age: 30d}   # the defaults, written out
steps:
  - {id: hello, kind: set, with: {values: {greeting: "'hi ' + input.name"}}, next: pause}
  - {id: pause, kind: wait_for, with: {duration: 1s}, next: bye}
  - {id: bye, kind: set, with: {values: {farewell: "'bye v1'"}}}
"""


def counts(sql: psycopg.Connection) -> dict[str, int]:
    row = sql.execute(
        "SELECT (SELECT count(*) FROM automations) AS automations,"
        " (SELECT count(*) FROM automation_versions) AS versions,"
        " (SELECT count(*) FROM organisations) AS organisations"
    ).fetchone()
    assert row is not None
    return dict(row)


async def test_publish_numbers_versions_and_deduplicates_by_content(
    engine: Engine, sql: psycopg.Connection
) -> None:
    first = await engine.publish(v1())
    assert (first.automation_id, first.version, first.created) == ("greet", 1, True)

    again = await engine.publish(v1())
    assert (again.version, again.created, again.digest) == (1, False, first.digest)

    # the same content written differently (YAML, defaults spelled out) is the same version
    same_yaml = await engine.publish(parse_text(V1_YAML))
    assert (same_yaml.version, same_yaml.created) == (1, False)

    second = await engine.publish(v2())
    assert (second.version, second.created) == (2, True)
    assert second.digest != first.digest

    rows = sql.execute(
        "SELECT version, digest, document FROM automation_versions ORDER BY version"
    ).fetchall()
    assert [(r["version"], r["digest"]) for r in rows] == [(1, first.digest), (2, second.digest)]
    assert [s["id"] for s in rows[0]["document"]["steps"]] == ["hello", "pause", "bye"]
    latest = sql.execute("SELECT latest_version FROM automations WHERE automation_id = 'greet'")
    assert latest.fetchone() == {"latest_version": 2}


async def test_an_invalid_document_stores_nothing(engine: Engine, sql: psycopg.Connection) -> None:
    before = counts(sql)
    bad = Automation("broken").step("a", "set", values={"x": "1 +"}).goto("b", "nowhere").build()
    with pytest.raises(InvalidAutomation) as info:
        await engine.publish(bad)
    assert len(info.value.problems) == 2, info.value.problems
    assert counts(sql) == before

    # an invalid new version of a published automation leaves the published one untouched
    await engine.publish(v1())
    before = counts(sql)
    broken_v2 = {**v1(), "steps": [*v1()["steps"], {"id": "extra", "kind": "nope"}]}
    with pytest.raises(InvalidAutomation, match="nope"):
        await engine.publish(broken_v2)
    assert counts(sql) == before
    latest = sql.execute("SELECT latest_version FROM automations WHERE automation_id = 'greet'")
    assert latest.fetchone() == {"latest_version": 1}


async def test_a_run_finishes_on_the_version_it_started_on(
    engine: Engine, sql: psycopg.Connection
) -> None:
    assert (await engine.publish(v1())).version == 1
    old = await engine.start("greet", {"name": "Maya"}, event_id="e-old")

    async with engine.running():
        # the run is parked on its wait_for step when the new version is published
        await eventually(
            lambda: _is(engine, old.run_id, "waiting"),
            what="run waiting on its timer",
        )
        assert (await engine.publish(v2())).version == 2
        new = await engine.start("greet", {"name": "Sam"}, event_id="e-new")
        assert await engine.wait(old.run_id, timeout=20) == "completed"
        assert await engine.wait(new.run_id, timeout=20) == "completed"

    old_run, new_run = run_row(sql, old.run_id), run_row(sql, new.run_id)
    assert old_run["version"] == 1
    assert new_run["version"] == 2
    assert old_run["ctx"]["vars"] == {"greeting": "hi Maya", "farewell": "bye v1"}
    assert new_run["ctx"]["vars"] == {"greeting": "hello Sam", "farewell": "bye v2"}

    def executed(run_id: str) -> list[str]:
        return [s["step_id"] for s in steps(sql, run_id) if s["status"] == "done"]

    assert executed(old.run_id) == ["hello", "pause", "bye"]
    assert set(executed(old.run_id)) <= V1_STEP_IDS
    assert executed(new.run_id) == ["hello", "pause", "bye2"]
    assert set(executed(new.run_id)) <= V2_STEP_IDS
    (started,) = history(sql, old.run_id, "run_started")
    assert started["detail"]["version"] == 1
    # v2 really was published while the old run was still unfinished
    (completed,) = [e for e in history(sql, old.run_id, "step_done") if e["detail"]]
    assert completed["detail"] == {"run": "completed"}
    (v2_row,) = sql.execute(
        "SELECT published_at FROM automation_versions WHERE version = 2"
    ).fetchall()
    assert v2_row["published_at"] < completed["at"]


async def test_republishing_an_older_document_makes_it_current_again(
    engine: Engine, sql: psycopg.Connection
) -> None:
    """Publish A, then B, then A again (a revert): new runs must start on A's content.

    Whatever number the revert gets, "publish" must not answer "unchanged" while new runs keep
    starting on B."""
    await engine.publish(v1())
    await engine.publish(v2())
    reverted = await engine.publish(v1())
    started = await engine.start("greet", {"name": "Kim"}, event_id="after-revert")
    row = sql.execute(
        "SELECT r.version, v.digest FROM runs r JOIN automation_versions v"
        " USING (org_id, automation_id, version) WHERE r.run_id = %s",
        (started.run_id,),
    ).fetchone()
    assert row is not None
    assert row["digest"] == reverted.digest, (
        f"publish answered version {reverted.version} (created={reverted.created}) "
        f"but a new run started on version {row['version']} with other content"
    )


async def _is(engine: Engine, run_id: str, status: str) -> bool:
    return await engine.status(run_id) == status
