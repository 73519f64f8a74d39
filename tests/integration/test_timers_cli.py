"""``onward timers`` (R6): preview a rule before publishing it; recompute pending timers. A
problem with what was asked is one line and exit 2."""

from __future__ import annotations

import json

import psycopg
import pytest

from onward import Automation
from onward.engine import Engine
from onward.testing import eventually
from onward.testing.processes import run_onward


def test_preview_marks_both_berlin_transitions(db_url: str) -> None:
    spring = run_onward(
        db_url,
        "timers",
        "preview",
        "--rule",
        "02:30 every day",
        "--zone",
        "Europe/Berlin",
        "--after",
        "2026-03-28T12:00:00Z",
        "--count",
        "2",
    )
    assert spring.returncode == 0, spring.stderr
    assert "2026-03-29T03:30:00+02:00  = 2026-03-29T01:30:00+00:00  (DST gap: moved forward)" in (
        spring.stdout
    )
    autumn = run_onward(
        db_url,
        "timers",
        "preview",
        "--rule",
        "cron 30 2 * * *",
        "--zone",
        "Europe/Berlin",
        "--after",
        "2026-10-24T12:00:00Z",
        "--count",
        "2",
        "--json",
    )
    items = json.loads(autumn.stdout)
    assert [(i["utc"], i["substitution"]) for i in items] == [
        ("2026-10-25T00:30:00+00:00", "fold"),
        ("2026-10-26T01:30:00+00:00", None),
    ]


def test_preview_shows_one_runs_spread(db_url: str) -> None:
    result = run_onward(
        db_url,
        "timers",
        "preview",
        "--rule",
        "09:00 on weekdays",
        "--zone",
        "Europe/Berlin",
        "--after",
        "2026-11-27T19:00:00Z",
        "--count",
        "1",
        "--spread",
        "10m",
        "--key",
        "run_x",
        "--json",
    )
    (item,) = json.loads(result.stdout)
    assert item["local"] == "2026-11-30T09:00:00+01:00"
    assert 0 <= item["offset_s"] < 600 and item["due_at"] > item["utc"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["preview", "--rule", "09:00 on weekdays", "--zone", "Mars/X"], "unknown time zone"),
        (["preview", "--rule", "teatime", "--zone", "UTC"], "is not a rule"),
        (
            ["preview", "--rule", "09:00 daily", "--zone", "UTC", "--after", "2026-01-01T09:00"],
            "give an offset",
        ),
        (["recompute", "--zone", "UTC"], "say which timers"),
        (["recompute", "--all", "--zone", "UTC"], "--all recomputes every timer as it is"),
        (["recompute", "--run", "r1", "--zone", "Mars/X"], "unknown time zone"),
    ],
)
def test_bad_requests_are_one_line_and_exit_2(db_url: str, args: list[str], needle: str) -> None:
    result = run_onward(db_url, "timers", *args)
    assert result.returncode == 2, result
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


async def test_recompute_a_contacts_timers_from_the_cli(
    engine: Engine, db_url: str, sql: psycopg.Connection
) -> None:
    await engine.publish(
        Automation("cli_tz")
        .step("wait", "wait_until", rule="09:00 on weekdays", zone="Europe/Berlin")
        .build()
    )
    run_id = (await engine.start("cli_tz", {}, contact_id="maya")).run_id
    async with engine.running():

        async def waiting() -> bool:
            return await engine.status(run_id) == "waiting"

        await eventually(waiting, what="the run waiting")
    move = ("--org", "test", "timers", "recompute", "--contact", "maya")
    result = run_onward(db_url, *move, "--zone", "America/New_York", "--json")
    assert result.returncode == 0, result.stderr
    done = json.loads(result.stdout)
    assert (done["examined"], done["moved"]) == (1, 1)
    row = sql.execute("SELECT intent, wake_n FROM timers WHERE run_id = %s", (run_id,)).fetchone()
    assert row is not None and row["intent"]["zone"] == "America/New_York" and row["wake_n"] == 2
    # the same inputs again: examined, nothing moves
    again = json.loads(run_onward(db_url, *move, "--zone", "America/New_York", "--json").stdout)
    assert (again["examined"], again["moved"], again["unchanged"]) == (1, 0, 1)
