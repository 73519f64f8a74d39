"""A signal and its step's deadline racing across two real worker processes, 200 times: exactly
one winner each time, and the loser recorded (R9).

Two worker processes (``w1``, ``w2``: worker + relay, both standing for the sweeper election,
sweep 0.2 s) run an automation whose step waits on the signal ``reply`` with a 1.5 s deadline.
The deadline timer is fired by whichever comes first: its delayed wake in either worker
(``fired_by 'wake'``) or the elected sweeper (``'sweep'``). This test process runs no worker; it
only delivers signals (``Engine.signal``). Each run's signal is delivered at its deadline
timer's due instant (by the database's clock) plus an offset spread evenly over -150..+150 ms,
so about half of the deliveries meet a timer that is firing at that very moment. Delivering at
instants only shapes the load; every outcome is waited for by polling the rows.

For every run exactly one of:

* **the signal won**: the step's output says ``timed_out: false``, the signal is ``consumed``,
  the deadline timer was closed by it (``fired_by 'signal'``), one ``signal_consumed`` history
  row and no ``timer_fired`` row for that timer;
* **the deadline won**: ``timed_out: true``, the timer ``fired_by`` ``wake`` or ``sweep`` (one
  ``timer_fired`` row), the signal recorded ``late`` (the run still going) or ``refused`` (the
  run had finished) with its ``signal_late`` / ``signal_refused`` history row, and no
  ``signal_consumed`` row.

Both kinds of winner must occur (the race was real); nothing may be applied twice or lost, and
neither side may fail on the way (an intake error, or a worker's fire aborted as a deadlock
victim).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from datetime import datetime
from typing import Any

import psycopg
import pytest

from onward import Automation, SignalRefused
from onward.engine import Engine
from onward.testing import Processes, assert_nothing_applied_twice, eventually, lost_runs
from tests.acceptance.procs import worker_settings

pytestmark = pytest.mark.acceptance

RUNS = 200
DEADLINE_S = 1.5
SPREAD_S = 0.15  # offsets from the due instant: -SPREAD_S .. +SPREAD_S, evenly

FLOW = (
    Automation("race")
    .step("wait", "wait_signal", signals=["reply"], deadline=f"{DEADLINE_S}s")
    .step("after", "set", values={"done": "true"})
    .build()
)

DEADLINE_TIMERS = """
SELECT t.run_id, t.timer_id, t.due_at, clock_timestamp() AS db_now
FROM timers t
WHERE t.purpose = 'deadline' AND NOT (t.run_id = ANY (%(seen)s::text[]))
"""


def _offsets(n: int) -> list[float]:
    """``n`` offsets spread evenly over -SPREAD_S..+SPREAD_S, in a shuffled order (so the offset
    does not follow the order in which the runs began to wait)."""
    step = 2 * SPREAD_S / (n - 1)
    offsets = [-SPREAD_S + i * step for i in range(n)]
    random.Random(9).shuffle(offsets)
    return offsets


class Deliveries:
    """Finds each run's deadline timer as its step begins to wait (polling), and delivers the
    run's signal at the timer's due instant plus the run's offset."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.offsets = _offsets(RUNS)
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.answers: dict[str, str] = {}  # run_id -> status intake answered (or 'refused')
        self.behind: list[float] = []  # seconds a delivery started after its instant

    async def scan(self) -> int:
        """Schedule the delivery of every run whose deadline timer appeared since the last
        scan; how many runs have a delivery scheduled."""
        loop = asyncio.get_running_loop()
        async with self.engine.pool.connection() as conn:
            cur = await conn.execute(DEADLINE_TIMERS, {"seen": list(self.tasks)})
            rows = await cur.fetchall()
        read_at = loop.time()
        for row in rows:
            offset = self.offsets[len(self.tasks)]
            due: datetime = row["due_at"]
            at = read_at + (due - row["db_now"]).total_seconds() + offset
            task = asyncio.create_task(self.deliver(row["run_id"], at))
            self.tasks[row["run_id"]] = task
        return len(self.tasks)

    async def deliver(self, run_id: str, at: float) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, at - loop.time()))  # load shaping: delivered at an instant
        self.behind.append(loop.time() - at)
        try:
            got = await self.engine.signal(f"sig-{run_id}", "reply", run_id=run_id)
        except SignalRefused:
            self.answers[run_id] = "refused"
        else:
            self.answers[run_id] = got.status


def _by_run(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["run_id"], []).append(row)
    return out


def verdict(
    run_id: str,
    output: dict[str, Any],
    signal: dict[str, Any],
    timer: dict[str, Any],
    events: list[dict[str, Any]],
    answer: str | None,
) -> tuple[str, list[str]]:
    """Who won this run's race, and what contradicts exactly one winner (empty: nothing)."""
    seen = Counter(e["event"] for e in events)
    fired_rows = [
        e
        for e in events
        if e["event"] == "timer_fired" and int(e["detail"]["timer_id"]) == timer["timer_id"]
    ]
    mine = [e for e in events if (e["detail"] or {}).get("signal_id") == signal["signal_id"]]
    problems: list[str] = []
    if output.get("timed_out") is False:
        winner = "signal"
        if signal["status"] != "consumed":
            problems.append(f"signal status {signal['status']!r}, not consumed")
        if timer["fired_by"] != "signal":
            problems.append(f"deadline timer fired_by {timer['fired_by']!r}, not 'signal'")
        consumed = [e for e in mine if e["event"] == "signal_consumed"]
        if len(consumed) != 1 or seen["signal_consumed"] != 1:
            problems.append(f"{seen['signal_consumed']} signal_consumed rows, not 1")
        elif consumed[0]["detail"].get("deadline") != "lost":
            problems.append(f"signal_consumed detail {consumed[0]['detail']}: deadline not 'lost'")
        if fired_rows:
            problems.append(f"a timer_fired row for the deadline timer: {fired_rows}")
        if output.get("signal") != "reply" or output.get("signal_id") != signal["signal_id"]:
            problems.append(f"step output {output} does not name the signal")
        if answer != "consumed":
            problems.append(f"intake answered {answer!r}, not consumed")
    elif output.get("timed_out") is True:
        winner = "deadline"
        if timer["fired_by"] not in ("wake", "sweep"):
            problems.append(f"deadline timer fired_by {timer['fired_by']!r}, not wake/sweep")
        if len(fired_rows) != 1:
            problems.append(f"{len(fired_rows)} timer_fired rows for the deadline timer, not 1")
        status = signal["status"]
        if status not in ("late", "refused"):
            problems.append(f"signal status {status!r}, not late/refused")
        else:
            recorded = [e for e in mine if e["event"] == f"signal_{status}"]
            if len(recorded) != 1:
                problems.append(f"{len(recorded)} signal_{status} rows, not 1")
            if answer != status:
                problems.append(f"intake answered {answer!r}, the row says {status!r}")
        if seen["signal_consumed"]:
            problems.append(f"{seen['signal_consumed']} signal_consumed rows, not 0")
        if seen["signal_late"] + seen["signal_refused"] != 1:
            problems.append(
                f"{seen['signal_late']} signal_late + {seen['signal_refused']} signal_refused rows"
            )
    else:
        winner = "none"
        problems.append(f"step output {output}: neither timed out nor woken by the signal")
    return winner, [f"{run_id}: {p}" for p in problems]


async def test_signal_and_deadline_racing_across_two_workers_have_exactly_one_winner_each_time(
    db_url: str, engine: Engine, sql: psycopg.Connection[Any], processes: Processes
) -> None:
    await engine.publish(FLOW)
    settings = worker_settings(db_url, sweep=0.2)
    workers = [processes.worker(settings, name, sweeper=True) for name in ("w1", "w2")]
    for w in workers:
        await w.ready()

    deliveries = Deliveries(engine)

    async def start_all() -> list[str]:
        return [
            (await engine.start("race", {"i": i}, event_id=f"evt-{i}")).run_id for i in range(RUNS)
        ]

    starting = asyncio.create_task(start_all())

    async def all_scheduled() -> bool:
        for w in workers:
            assert w.alive(), f"{w.name} exited:\n{w.tail(3000)}"
        return await deliveries.scan() >= RUNS

    # every run's step waits (its deadline timer exists): its delivery is then scheduled
    await eventually(all_scheduled, timeout=30, interval=0.02, what="every step to wait")
    run_ids = await starting
    assert set(deliveries.tasks) == set(run_ids)
    outcomes = await asyncio.gather(*deliveries.tasks.values(), return_exceptions=True)
    failed = [f"{type(e).__name__}: {e}" for e in outcomes if isinstance(e, BaseException)]
    assert failed == [], f"{len(failed)} deliveries failed:\n" + "\n".join(failed[:5])

    async def all_completed() -> bool:
        row = sql.execute(
            "SELECT count(*) AS n FROM runs WHERE automation_id = 'race' AND status = 'completed'"
        ).fetchone()
        return row is not None and row["n"] == RUNS

    await eventually(all_completed, timeout=30, what=f"all {RUNS} runs to complete")
    for w in workers:
        assert w.alive(), f"{w.name} exited:\n{w.tail(3000)}"

    outputs = {
        r["run_id"]: r["output"]
        for r in sql.execute("SELECT run_id, output FROM steps WHERE step_id = 'wait'").fetchall()
    }
    signals = {
        r["run_id"]: r for r in sql.execute("SELECT * FROM signals").fetchall() if r["run_id"]
    }
    timers = _by_run(
        list(sql.execute("SELECT * FROM timers WHERE purpose = 'deadline'").fetchall())
    )
    events = _by_run(
        list(
            sql.execute(
                "SELECT run_id, event, seq, detail FROM history WHERE event IN "
                "('signal_consumed', 'signal_late', 'signal_refused', 'timer_fired') "
                "ORDER BY event_id"
            ).fetchall()
        )
    )
    assert len(signals) == RUNS and len(outputs) == RUNS

    wins: Counter[str] = Counter()
    detail: Counter[str] = Counter()
    problems: list[str] = []
    for run_id in run_ids:
        (timer,) = timers[run_id]  # one deadline timer per run
        winner, wrong = verdict(
            run_id,
            outputs[run_id],
            signals[run_id],
            timer,
            events.get(run_id, []),
            deliveries.answers.get(run_id),
        )
        wins[winner] += 1
        detail[f"{winner}: timer {timer['fired_by']}, signal {signals[run_id]['status']}"] += 1
        problems += wrong

    behind = sorted(deliveries.behind)
    print(
        f"\nsignal vs deadline, {RUNS} races: signal won {wins['signal']}, deadline won "
        f"{wins['deadline']}; {dict(detail)}; deliveries started behind their instant by "
        f"p50 {behind[len(behind) // 2] * 1000:.1f} ms, max {behind[-1] * 1000:.1f} ms"
    )
    assert problems == [], "\n".join(problems[:40])
    assert wins["signal"] + wins["deadline"] == RUNS
    assert wins["signal"] >= 1 and wins["deadline"] >= 1, f"no race happened: {dict(wins)}"
    assert_nothing_applied_twice(sql)
    assert lost_runs(sql) == set()
    for w in workers:
        assert w.stop() == 0
    # intake and a firing wait on each other's locks in one order: neither may be aborted as a
    # deadlock victim (a fire that was is retried by the sweep, so the rows above hold anyway)
    for w in workers:
        assert not w.find("deadlock detected"), f"{w.name}:\n{w.tail(3000)}"
