"""Migrating runs between versions (R11): runs finish on the version they started on; an
explicit migration moves them (a step map, a removed-step policy), only at a safe point, each
move one history row; a bad migration is refused with its reason; published versions cannot be
changed in the database. Real PostgreSQL, a real in-process worker."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import onward.testing.kinds  # noqa: F401  (registers test.sleep)
from onward import testing
from onward.engine import Engine
from onward.errors import MigrationRefused
from onward.testing import eventually, history

ID = "mig"


def doc(
    tag: str,
    *,
    reply: str | None = "reply",
    pause: str = "1h",
    sleep: float = 1.0,
) -> dict[str, Any]:
    """start -> (pause | reply | work) ; work -> pause ; pause, reply -> finish (sets tag)."""
    cases = [{"when": "input.path == 'chain'", "next": "work"}]
    if reply:
        cases.append({"when": "input.path == 'signal'", "next": reply})
    steps: list[dict[str, Any]] = [
        {"id": "start", "kind": "branch", "with": {"cases": cases, "default": "pause"}},
        {"id": "work", "kind": "test.sleep", "with": {"seconds": sleep}, "next": "pause"},
        {"id": "pause", "kind": "wait_for", "with": {"duration": pause}, "next": "finish"},
    ]
    if reply:
        steps.append(
            {
                "id": reply,
                "kind": "wait_signal",
                "with": {"signals": ["reply"], "deadline": "1h"},
                "next": "finish",
            }
        )
    steps.append({"id": "finish", "kind": "set", "with": {"values": {"tag": f"'{tag}'"}}})
    return {"id": ID, "steps": steps}


async def publish_v3(engine: Engine, **kw: Any) -> None:
    for n in (1, 2, 3):
        assert (await engine.publish(doc(f"v{n}", **kw))).version == n


def step_of(sql: psycopg.Connection[Any], run_id: str) -> dict[str, Any]:
    row = sql.execute(
        "SELECT s.*, r.version AS run_version, r.status AS run_status FROM steps s "
        "JOIN runs r USING (org_id, run_id) WHERE s.run_id = %s ORDER BY s.seq DESC LIMIT 1",
        (run_id,),
    ).fetchone()
    assert row is not None
    return row


def run(sql: psycopg.Connection[Any], run_id: str) -> dict[str, Any]:
    return testing.run_row(sql, run_id)


async def at(sql: psycopg.Connection[Any], run_ids: list[str], status: str, step: str) -> None:
    async def check() -> bool:
        return all(
            (s := step_of(sql, r))["status"] == status and s["step_id"] == step for r in run_ids
        )

    await eventually(check, timeout=30, what=f"runs {status} at {step}")


async def finished(engine: Engine, run_ids: list[str]) -> list[str]:
    return [await engine.wait(r, timeout=30, or_parked=False) for r in run_ids]


async def start(engine: Engine, path: str, n: int, tag: str, **kw: Any) -> list[str]:
    return [
        (await engine.start(ID, {"path": path}, key=f"{tag}-{path}-{i}", **kw)).run_id
        for i in range(n)
    ]


async def test_runs_in_flight_finish_on_their_version_while_a_new_one_is_published(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await publish_v3(engine, pause="2s")
    async with engine.running():
        timed = await start(engine, "wait", 2, "a")
        waiting = await start(engine, "signal", 2, "a")
        chained = await start(engine, "chain", 2, "a")
        await at(sql, timed, "waiting", "pause")
        await at(sql, waiting, "waiting", "reply")
        await at(sql, chained, "running", "work")  # mid-chain: in its sleep
        v4 = await engine.publish(doc("v4", pause="2s"))
        assert v4.version == 4
        for i, r in enumerate(waiting):
            await engine.signal(f"reply-{i}", "reply", run_id=r)
        olds = timed + waiting + chained
        assert await finished(engine, olds) == ["completed"] * 6
        new = await start(engine, "signal", 1, "b")
        await at(sql, new, "waiting", "reply")
        await engine.signal("reply-new", "reply", run_id=new[0])
        assert await finished(engine, new) == ["completed"]
    for r in olds:
        row = run(sql, r)
        assert (row["version"], row["ctx"]["vars"]["tag"]) == (3, "v3")
        assert history(sql, r, "run_migrated") == []
    assert (run(sql, new[0])["version"], run(sql, new[0])["ctx"]["vars"]["tag"]) == (4, "v4")


async def test_a_migration_with_a_map_moves_waiting_runs_and_they_complete_on_the_new_version(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await publish_v3(engine)
    async with engine.running():
        timed = await start(engine, "wait", 2, "a")
        waiting = await start(engine, "signal", 2, "a")
        await at(sql, timed, "waiting", "pause")
        await at(sql, waiting, "waiting", "reply")
        # v4 renames reply (same definition: its wait is kept) and shortens pause (a changed
        # wait: it re-enters under the new definition)
        await engine.publish(doc("v4", reply="await_reply", pause="1s"))
        timers_before = {
            r: sql.execute(
                "SELECT timer_id, due_at, wake_n FROM timers WHERE run_id = %s", (r,)
            ).fetchall()
            for r in waiting
        }
        plan = await engine.migrate_runs(ID, 3, 4, {"reply": "await_reply"}, dry_run=True)
        assert plan["outcomes"] == {"moved": 2, "reentered": 2}
        assert {p["to_step"] for p in plan["plan"] if p["from_step"] == "reply"} == {"await_reply"}
        assert all(run(sql, r)["version"] == 3 for r in timed + waiting)  # the dry run moved none
        op = await engine.migrate_runs(ID, 3, 4, {"reply": "await_reply"}, by="ops@example")
        assert op["status"] == "done" and op["outcomes"] == {"moved": 2, "reentered": 2}
        for r in waiting:
            s = step_of(sql, r)
            assert (s["step_id"], s["status"], s["version"], s["run_version"]) == (
                "await_reply",
                "waiting",
                4,
                4,
            )
            assert (
                sql.execute(
                    "SELECT timer_id, due_at, wake_n FROM timers WHERE run_id = %s AND fired_at IS NULL",
                    (r,),
                ).fetchall()
                == timers_before[r]
            )  # the deadline timer is kept as it was
        for r in timed + waiting:
            (moved,) = history(sql, r, "run_migrated")
            assert moved["detail"]["from"] == 3 and moved["detail"]["to"] == 4
            assert moved["detail"]["map"] == {"reply": "await_reply"}
            assert moved["detail"]["by"] == "ops@example"
        for i, r in enumerate(waiting):
            await engine.signal(f"reply-{i}", "reply", run_id=r)
        assert await finished(engine, timed + waiting) == ["completed"] * 4
    for r in timed + waiting:
        assert (run(sql, r)["version"], run(sql, r)["ctx"]["vars"]["tag"]) == (4, "v4")
    for r in timed:  # the 1 h timer was closed by the migration, the 1 s one fired
        fired = sql.execute(
            "SELECT fired_by FROM timers WHERE run_id = %s ORDER BY timer_id", (r,)
        ).fetchall()
        assert [f["fired_by"] for f in fired] == ["migrated", "sweep"] or [
            f["fired_by"] for f in fired
        ] == ["migrated", "wake"]
    # nothing left to move: a second migration finds no run and moves none twice
    again = await engine.migrate_runs(ID, 3, 4, {"reply": "await_reply"})
    assert again["done"] == 0
    assert all(len(history(sql, r, "run_migrated")) == 1 for r in timed + waiting)


async def test_a_removed_step_follows_each_policy(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await publish_v3(engine)
    async with engine.running():
        (a,) = await start(engine, "signal", 1, "a")
        await at(sql, [a], "waiting", "reply")
        await engine.publish(doc("v4", reply=None))  # v4 has no reply step
        with pytest.raises(MigrationRefused) as refused:
            await engine.migrate_runs(ID, 3, 4)
        assert "step 'reply' of version 3 is reachable" in str(refused.value)

        # park: the run stays on v3, parked for a person
        plan = await engine.migrate_runs(ID, 3, 4, removed_step_policy="park", dry_run=True)
        assert plan["outcomes"] == {"parked": 1}
        op = await engine.migrate_runs(ID, 3, 4, removed_step_policy="park")
        assert op["outcomes"] == {"parked": 1}
        s = step_of(sql, a)
        assert (s["status"], s["wait_kind"], s["run_status"], s["run_version"]) == (
            "parked",
            "migration",
            "parked",
            3,
        )
        assert history(sql, a, "run_migrated") == []
        assert len(history(sql, a, "run_parked")) == 1
        assert sql.execute(
            "SELECT count(*) AS n FROM timers WHERE run_id = %s AND fired_at IS NULL", (a,)
        ).fetchone() == {"n": 0}

        # skip-to: the parked run's step ends skipped, finish is its next step, it completes
        op = await engine.migrate_runs(ID, 3, 4, removed_step_policy="skip-to:finish")
        assert op["outcomes"] == {"skipped_to": 1}
        assert await finished(engine, [a]) == ["completed"]
        assert (run(sql, a)["version"], run(sql, a)["ctx"]["vars"]["tag"]) == (4, "v4")
        assert [h["step_id"] for h in history(sql, a, "step_skipped")] == ["reply"]
        assert len(history(sql, a, "run_migrated")) == 1

        # cancel: a run started on v3 now, waiting at reply, is cancelled
        (b,) = await start(engine, "signal", 1, "b", version=3)
        await at(sql, [b], "waiting", "reply")
        op = await engine.migrate_runs(ID, 3, 4, removed_step_policy="cancel")
        assert op["outcomes"] == {"cancelled": 1}
        row = run(sql, b)
        assert (row["status"], row["version"]) == ("cancelled", 3)
        assert history(sql, b, "run_migrated") == []


async def test_a_run_in_flight_is_moved_only_at_its_next_safe_point(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await publish_v3(engine, sleep=1.5)
    async with engine.running():
        chained = await start(engine, "chain", 2, "a")
        await at(sql, chained, "running", "work")
        await engine.publish(doc("v4", sleep=1.5))
        plan = await engine.migrate_runs(ID, 3, 4, dry_run=True)
        assert plan["outcomes"] == {"deferred": 2}
        assert all("in flight" in p["reason"] for p in plan["plan"])
        seen: list[dict[str, Any]] = []
        op = await engine.migrate_runs(
            ID, 3, 4, pass_pause_s=0.2, on_batch=lambda row, handled: seen.extend(handled)
        )
        assert op["status"] == "done" and op["outcomes"] == {"moved": 2}
        assert op["pass"] > 1
        assert {r["outcome"] for r in seen if r["run_id"] == chained[0]} >= {"deferred", "moved"}
        for r in chained:
            s = step_of(sql, r)
            assert (s["step_id"], s["status"], s["run_version"]) == ("pause", "waiting", 4)
            assert len(history(sql, r, "run_migrated")) == 1
            # it moved after its sleep settled, never while it ran
            (moved,) = history(sql, r, "run_migrated")
            (done,) = history(sql, r, "step_done", seq=2)
            assert moved["event_id"] > done["event_id"]


async def test_a_run_still_in_flight_after_the_last_pass_stays_and_is_reported_deferred(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await publish_v3(engine, sleep=30)
    async with engine.running():
        (r,) = await start(engine, "chain", 1, "a")
        await at(sql, [r], "running", "work")
        await engine.publish(doc("v4"))
        op = await engine.migrate_runs(ID, 3, 4, max_passes=2, pass_pause_s=0.1)
        assert (op["status"], op["outcomes"], op["pass"]) == ("done", {"deferred": 1}, 2)
        assert run(sql, r)["version"] == 3 and history(sql, r, "run_migrated") == []


async def test_a_bad_migration_is_refused_with_its_reasons_and_nothing_moves(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    await publish_v3(engine)
    await engine.publish(doc("v4", reply=None))
    # on v3, ready at start: reply is reachable from it
    (r,) = await start(engine, "signal", 1, "a", version=3)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"step_map": {"nope": "finish"}}, "version 3 has no step 'nope'"),
        ({"step_map": {"reply": "nope"}}, "version 4 has no step 'nope'"),
        ({}, "step 'reply' of version 3 is reachable"),
        ({"removed_step_policy": "skip-to:nowhere"}, "version 4 has no step 'nowhere'"),
        ({"removed_step_policy": "explode"}, "choose park, skip-to:STEP or cancel"),
        ({"to_version": 9}, "to version 9 of automation 'mig' is not published"),
        ({"from_version": 7}, "from version 7 of automation 'mig' is not published"),
        ({"to_version": 3}, "from and to are the same version (3)"),
    ]
    for kw, reason in cases:
        args = {"from_version": 3, "to_version": 4, **kw}
        with pytest.raises(MigrationRefused) as refused:
            await engine.migrate_runs(ID, **args)
        assert reason in str(refused.value), (kw, str(refused.value))
    assert run(sql, r)["version"] == 3
    assert sql.execute("SELECT count(*) AS n FROM operations").fetchone() == {"n": 0}
    # a mapped step is not "left unmapped"; with it mapped the migration goes ahead
    op = await engine.migrate_runs(ID, 3, 4, {"reply": "finish"})
    assert op["outcomes"] == {"moved": 1}


async def test_a_published_version_refuses_update_and_delete_and_republishing_still_works(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    v1 = await engine.publish(doc("v1"))
    with pytest.raises(psycopg.errors.RestrictViolation, match="is published and cannot"):
        sql.execute("UPDATE automation_versions SET max_steps = 1 WHERE automation_id = %s", (ID,))
    with pytest.raises(psycopg.errors.RestrictViolation, match="is published and cannot"):
        sql.execute("DELETE FROM automation_versions WHERE automation_id = %s", (ID,))
    row = sql.execute(
        "SELECT count(*) AS n, min(max_steps) AS m FROM automation_versions WHERE automation_id = %s",
        (ID,),
    ).fetchone()
    assert row == {"n": 1, "m": 1000}
    again = await engine.publish(doc("v1"))
    assert (again.version, again.created) == (v1.version, False)
    v2 = await engine.publish(doc("v2"))
    assert (v2.version, v2.created) == (2, True)
