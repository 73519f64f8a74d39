"""One source for each write path (issue 9): the wake id formats live in SQL functions that
``onward.ids`` matches; history events are a closed list; a wake and the sweep firing the same
timers never wait on each other; a provider's HTTP-date ``Retry-After`` is compared with the
database's clock, never the worker's."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from onward import (
    AuthorizationError,
    Automation,
    Connector,
    RateLimited,
    ids,
    register_connector,
    run_effect,
    step_kind,
    timers,
)
from onward.engine import Engine
from onward.kinds import StepContext
from onward.sweep import Q as SWEEP_Q
from onward.testing import eventually, history, steps


def test_wake_ids_built_in_python_equal_the_sql_functions(sql: psycopg.Connection) -> None:
    for run_id, seq, attempt in [("run_0190abc", 1, 1), ("run_x", 12, 7), ("r:with:colons", 3, 2)]:
        row = sql.execute(
            "SELECT onward_step_wake_id(%s, %s, %s) AS id", (run_id, seq, attempt)
        ).fetchone()
        assert row is not None and row["id"] == ids.step_wake_id(run_id, seq, attempt)
    for org_id, timer_id, wake_n in [("default", 1, 1), ("acme", 9_000_000_000, 3)]:
        row = sql.execute(
            "SELECT onward_timer_wake_id(%s, %s, %s) AS id", (org_id, timer_id, wake_n)
        ).fetchone()
        assert row is not None and row["id"] == ids.timer_wake_id(org_id, timer_id, wake_n)


async def test_every_wake_in_the_outbox_has_the_python_format(
    engine: Engine, sql: psycopg.Connection
) -> None:
    """Starts, timers and timer fires write their wakes through the SQL functions; the ids in
    the outbox are exactly what ``onward.ids`` builds for the same rows."""
    await engine.publish(
        Automation("ids")
        .step("w", "wait_for", duration="0.2s")
        .step("b", "set", values={"n": "2"})
        .build()
    )
    run_id = (await engine.start("ids", {}, event_id="e1")).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    rows = sql.execute("SELECT topic, job_id FROM outbox ORDER BY outbox_id").fetchall()
    (timer,) = sql.execute("SELECT timer_id, wake_n FROM timers").fetchall()
    assert [(r["topic"], r["job_id"]) for r in rows][:3] == [
        ("step", ids.step_wake_id(run_id, 1, 1)),  # the start invites attempt 1
        ("timer", ids.timer_wake_id("test", timer["timer_id"], timer["wake_n"])),
        ("step", ids.step_wake_id(run_id, 1, 2)),  # the fired timer invites attempt 2
    ]


def test_history_refuses_an_event_not_in_the_closed_list(sql: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match="history_log_event_known"):
        sql.execute(
            "INSERT INTO history_log (org_id, run_id, event) VALUES ('o', 'r', 'step_teleported')"
        )


def test_code_from_before_0029_still_writes_history_through_the_view(
    sql: psycopg.Connection,
) -> None:
    """A process of a release before migration 0029 (a rolling deploy) inserts into, updates
    and deletes from `history`, now a view: its writes land in history_log, as the engine's
    role, inside a statement's CTE as its settle wrote them."""
    sql.execute("SET ROLE onward_engine")
    try:
        made = sql.execute(
            """WITH h AS (
                   INSERT INTO history (org_id, run_id, event, seq, step_id, attempt, worker)
                   SELECT 'o', 'old-1', 'step_done', s, 'a', 1, 'old-worker'
                   FROM generate_series(1, 2) AS s
                   RETURNING event_id, at
               )
               SELECT count(*) AS n, count(event_id) AS ids, count(at) AS ats FROM h"""
        ).fetchone()
        assert made == {"n": 2, "ids": 2, "ats": 2}
        logged = sql.execute(
            "SELECT seq, worker FROM history_log WHERE run_id = 'old-1' ORDER BY event_id"
        ).fetchall()
        assert [(r["seq"], r["worker"]) for r in logged] == [(1, "old-worker"), (2, "old-worker")]
        sql.execute(
            "UPDATE history SET detail = '{\"redacted\": \"erased\"}' WHERE run_id = 'old-1'"
        )
        details = sql.execute("SELECT detail FROM history_log WHERE run_id = 'old-1'").fetchall()
        assert [r["detail"] for r in details] == [{"redacted": "erased"}] * 2
        sql.execute("DELETE FROM history WHERE run_id = 'old-1' AND seq = 1")
        left = sql.execute("SELECT seq FROM history_log WHERE run_id = 'old-1'").fetchall()
        assert [r["seq"] for r in left] == [2]
    finally:
        sql.execute("RESET ROLE")


async def test_history_of_a_start_and_an_advance_is_in_order(
    engine: Engine, sql: psycopg.Connection
) -> None:
    """A start writes run_started before its step's step_ready; a settle writes step_done
    before its successor's step_ready (the successor's lane is not served here, so it is
    announced, not claimed eagerly)."""
    await engine.publish(
        Automation("order")
        .step("a", "set", values={"n": "1"})
        .step("b", "wait_for", duration="1s")
        .build()
    )
    run_id = (await engine.start("order", {}, event_id="o1")).run_id
    async with engine.running(lanes={"fast": 4}):

        async def at_step_2() -> bool:
            return 2 in [s["seq"] for s in steps(sql, run_id)]

        await eventually(at_step_2, what=f"{run_id} at step 2")
    events = [(r["event"], r["step_id"]) for r in history(sql, run_id)]
    assert events == [
        ("run_started", None),
        ("step_ready", "a"),
        ("step_done", "a"),
        ("step_ready", "b"),
    ]


async def test_a_wake_never_waits_on_timers_the_sweep_holds(
    engine: Engine, db_url: str, sql: psycopg.Connection
) -> None:
    """The sweep locks due timers (claim_due) and fires them in its transaction; a wake that
    fires the same timers meanwhile skips them instead of waiting -- so the two can never
    deadlock -- and every timer fires exactly once."""
    await engine.publish(Automation("dl").step("w", "wait_for", duration="0.01s").build())
    for i in range(20):
        await engine.start("dl", {}, event_id=f"dl{i}")
    async with engine.running(lanes={"wait": 32, "io": 4, "fast": 4}, sweeper=False, relay=False):
        await _eventually_count(sql, "SELECT count(*) AS n FROM timers", 20)
    due = [(r["org_id"], r["timer_id"]) for r in sql.execute("SELECT org_id, timer_id FROM timers")]
    sweep_conn = await psycopg.AsyncConnection.connect(db_url, row_factory=dict_row)
    async with sweep_conn, sweep_conn.transaction():
        cur = await sweep_conn.execute(
            SWEEP_Q.claim_due, {"org_ids": ["test"], "per_org": 50, "batch": 500}
        )
        assert len(await cur.fetchall()) == 20
        async with await psycopg.AsyncConnection.connect(
            db_url, row_factory=dict_row, autocommit=True
        ) as wake_conn:
            await wake_conn.execute("SET lock_timeout = '2s'")
            # reversed order: the order in which the old statement could deadlock
            fired_by_wake = await timers.fire(wake_conn, list(reversed(due)), by="wake")
        assert fired_by_wake == []
        fired_by_sweep = await timers.fire(sweep_conn, due, by="sweep")
        assert len(fired_by_sweep) == 20
    fired = sql.execute("SELECT fired_by, count(*) AS n FROM timers GROUP BY 1").fetchall()
    assert fired == [{"fired_by": "sweep", "n": 20}]
    once = sql.execute("SELECT count(*) AS n FROM history WHERE event = 'timer_fired'").fetchone()
    assert once == {"n": 20}


async def _eventually_count(sql: psycopg.Connection, query: str, n: int) -> None:
    async def check() -> bool:
        row = sql.execute(query).fetchone()
        return row is not None and row["n"] >= n

    await eventually(check, what=query)


RETRY_AT: dict[str, datetime] = {}


@step_kind("test.rate_limited_until", lane="io", replace=True)
async def _rate_limited_until(step: StepContext) -> None:
    if step.attempt == 1:
        raise RateLimited("429", retry_at=RETRY_AT[step.run_id])


async def test_retry_after_date_is_compared_with_the_database_clock(
    engine: Engine, sql: psycopg.Connection
) -> None:
    """A provider says "retry at <date>": the step becomes ready at that instant by the
    database's clock, whatever this process's clock says."""
    await engine.publish(Automation("ra").step("call", "test.rate_limited_until").build())
    db_now = sql.execute("SELECT now() AS t").fetchone()["t"]  # type: ignore[index]
    later, past = db_now + timedelta(hours=1), db_now - timedelta(hours=1)
    run_later = (await engine.start("ra", {}, event_id="later")).run_id
    run_past = (await engine.start("ra", {}, event_id="past")).run_id
    RETRY_AT[run_later], RETRY_AT[run_past] = later, past
    async with engine.running(lanes={"io": 4}):
        assert await engine.wait(run_past, timeout=30) == "completed"
    (row,) = steps(sql, run_later)
    assert row["status"] == "ready" and row["available_at"] == later
    (retry,) = history(sql, run_later, "step_retry")
    assert retry["detail"]["delay_s"] == pytest.approx(3600, abs=60)


@pytest.mark.parametrize(
    ("call", "prefix"),
    [
        ("onward_step_wake_id(x::text, 1, 2)", "'wake:'"),
        ("onward_timer_wake_id('o', x::bigint, 3)", "'timer:o:'"),
    ],
)
def test_wake_id_functions_are_inlined(sql: psycopg.Connection, call: str, prefix: str) -> None:
    """They sit on the hot path (every start and every announced step): the planner must
    inline them into plain concatenation, not call a function per row."""
    plan = sql.execute(f"EXPLAIN VERBOSE SELECT {call} FROM generate_series(1, 2) AS x").fetchall()
    output = " ".join(str(row["QUERY PLAN"]) for row in plan)
    assert "onward_" not in output and prefix in output, output


_RESTORED_DURING: list[Engine] = []


@step_kind("test.restored_during_failure")
async def _restored_during_failure(step: StepContext) -> None:
    """Its call is refused for the connection's credentials -- and the customer reconnects
    before the step's park is written (the race: read broken, restore commits, then park)."""
    engine = _RESTORED_DURING[0]
    if step.attempt == 1:
        await engine.integrations.mark_broken(step.org_id, "mailbox", "revoked")
        await engine.integrations.restore(step.org_id, "mailbox")
        raise AuthorizationError("credentials refused", connection="mailbox")


async def test_a_step_refused_while_its_connection_is_restored_goes_on_instead_of_parking(
    engine: Engine, sql: psycopg.Connection
) -> None:
    """A restore that commits between a step's refused call and its park would find nothing
    parked to resume, and the park after it nothing to wake it. The park reads the connection
    under a share lock (connections.sql lock_for_park): restored, the step is ready again at
    once (a deferral, no attempt spent) and the run completes."""
    _RESTORED_DURING[:] = [engine]
    await engine.integrations.add_connection(
        "test", "mailbox", provider="email", base_url="http://127.0.0.1:9", account="a", secret="s"
    )
    await engine.publish(Automation("restored").step("a", "test.restored_during_failure").build())
    run_id = (await engine.start("restored", {}, event_id="r1")).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    events = [r["event"] for r in history(sql, run_id)]
    assert "step_parked" not in events and "step_deferred" in events, events
    (row,) = sql.execute("SELECT failures, attempt FROM steps WHERE run_id = %s", (run_id,))
    assert (row["failures"], row["attempt"]) == (0, 2), row


_REFUSED_BEFORE_RESTORE: list[Engine] = []


@register_connector
class _RefusedBeforeRestore(Connector):
    """Its first call is refused -- and, while it was on its way, another step's refusal broke
    the connection and the customer restored it: the refusal arrives after the restore."""

    provider = "test_refused_before_restore"

    async def perform(self, idempotency_key: str, params: dict[str, Any]) -> dict[str, Any]:
        engine = _REFUSED_BEFORE_RESTORE[0]
        if not params.get("again"):
            _REFUSED_BEFORE_RESTORE.append(engine)  # once
            await engine.integrations.mark_broken("test", "flaky", "revoked (another step)")
            await engine.integrations.restore("test", "flaky")
            raise AuthorizationError("credentials refused", connection="flaky")
        return {"ok": True}


@step_kind("test.refused_before_restore")
async def _refused_before_restore_step(step: StepContext) -> dict[str, Any]:
    return await run_effect(step, "flaky", {"again": len(_REFUSED_BEFORE_RESTORE) > 1})


async def test_a_refusal_that_arrives_after_the_restore_does_not_break_the_connection_again(
    engine: Engine, sql: psycopg.Connection
) -> None:
    """A call made before the customer restored the connection, refused after the restore
    committed: marking the connection broken again would park this run -- and every later one
    that needs the connection -- behind a second restore nobody knows to make (the chaos run's
    mailbox outage: 16 runs parked after the restore). The refusal is older than the restore
    (connections.sql mark_broken, seen_at): the connection stays usable, the step goes on at
    once (C4a) and the run completes; one notification, for the first break."""
    _REFUSED_BEFORE_RESTORE[:] = [engine]
    await engine.integrations.add_connection(
        "test",
        "flaky",
        provider="test_refused_before_restore",
        base_url="http://127.0.0.1:9",
        account="a",
        secret="s",
    )
    await engine.publish(Automation("refused").step("a", "test.refused_before_restore").build())
    run_id = (await engine.start("refused", {}, event_id="r1")).run_id
    async with engine.running():
        assert await engine.wait(run_id, timeout=30) == "completed"
    (conn,) = sql.execute("SELECT status FROM connections WHERE connection_id = 'flaky'")
    assert conn["status"] == "ok"
    notes = sql.execute("SELECT count(*) AS n FROM notifications").fetchone()
    assert notes == {"n": 1}
    events = [r["event"] for r in history(sql, run_id)]
    assert "step_parked" not in events and "step_deferred" in events, events


async def test_mark_broken_changes_nothing_once_the_connection_changed_since_it_was_read(
    engine: Engine, sql: psycopg.Connection
) -> None:
    """``seen_at`` is the connection's state the refused call read: broken once it is still
    that state; a restore or new credentials since then make the refusal stale."""
    integ = engine.integrations
    await integ.add_connection(
        "test", "mailbox", provider="email", base_url="http://127.0.0.1:9", account="a", secret="s"
    )

    def state() -> tuple[str, Any]:
        row = sql.execute(
            "SELECT status, updated_at FROM connections WHERE connection_id = 'mailbox'"
        ).fetchone()
        assert row is not None
        return row["status"], row["updated_at"]

    _, read = state()
    await integ.mark_broken("test", "mailbox", "another step's refusal")
    await integ.restore("test", "mailbox")
    await integ.mark_broken("test", "mailbox", "refused before the restore", seen_at=read)
    status, restored = state()
    assert status == "ok"
    await integ.add_connection(  # new credentials: a refusal of the old ones is stale too
        "test", "mailbox", provider="email", base_url="http://127.0.0.1:9", account="a", secret="t"
    )
    await integ.mark_broken("test", "mailbox", "refused the old secret", seen_at=restored)
    status, current = state()
    assert status == "ok"
    await integ.mark_broken("test", "mailbox", "refused the current secret", seen_at=current)
    assert state()[0] == "broken"
    notes = sql.execute("SELECT subject FROM notifications ORDER BY created_at").fetchall()
    assert len(notes) == 2, notes  # the first break and the last
