"""Flow control from the outside (R5): ``onward limits|circuits|budgets|lanes`` (real
subprocesses) and ``/v1/limits|circuits|budgets|lanes`` over real HTTP (``ApiServer``, a real
uvicorn), against the test's database. Good input is stored and listed back; bad input is
refused -- exit 2 with one ``onward: ...`` line and no traceback, or 422 -- and stores nothing.
The lanes shown are the ones ``ONWARD_LANES`` / ``ONWARD_LANE_POLICY`` configure, and
``onward doctor --json`` reports per lane the ready, running and parked steps, and the open
circuits."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
import pytest

from onward import Automation
from onward.api import ApiServer, create_app
from onward.config import Settings
from onward.engine import Engine
from onward.sandbox import SandboxAdmin, SandboxServer
from onward.testing import api_key, auth, eventually, run_onward
from onward.testing.kinds import SLEEP_KIND

DEFAULT_LANES = [
    {"lane": name, "served": True, "capacity": capacity, "lease_seconds": lease,
     "max_attempts": attempts, "base": base, "cap": cap}
    for name, capacity, lease, attempts, base, cap in (
        ("fast", 64, 30.0, 5, 0.5, 30.0),
        ("io", 32, 30.0, 5, 1.0, 300.0),
        ("slow", 8, 120.0, 2, 10.0, 300.0),
        ("wait", 64, 30.0, 5, 1.0, 300.0),
    )
]  # fmt: skip


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], needle: str) -> str:
    """Exit 2 with one line ``onward: ...`` on stderr containing ``needle``, no traceback and
    nothing on stdout; that line."""
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("onward: "), result.stderr
    assert needle in lines[0], lines[0]
    assert result.stdout == ""
    return lines[0]


def stored(sql: psycopg.Connection[Any]) -> dict[str, list[dict[str, Any]]]:
    """What the flow-control tables hold (their settings, not their timestamps)."""
    return {
        "limits": list(
            sql.execute(
                "SELECT org_id, key, max_concurrent, calls, per_seconds FROM limits ORDER BY key"
            ).fetchall()
        ),
        "circuits": list(
            sql.execute(
                "SELECT org_id, key, state, threshold, window_seconds, cooldown_seconds "
                "FROM circuits ORDER BY key"
            ).fetchall()
        ),
        "budgets": list(
            sql.execute(
                "SELECT org_id, scope, unit, per_day::float8 AS per_day FROM budgets "
                "ORDER BY scope, unit"
            ).fetchall()
        ),
    }


def cli_json(db_url: str, *args: str, env: dict[str, str] | None = None) -> Any:
    return json.loads(ok(run_onward(db_url, *args, "--json", env=env)))


# -- the command line ----------------------------------------------------------------------------


def test_cli_limits_are_set_listed_replaced_and_removed_and_bad_ones_store_nothing(
    db_url: str, sql: psycopg.Connection[Any]
) -> None:
    assert ok(run_onward(db_url, "limits", "list")).strip() == "no limits"
    assert cli_json(db_url, "limits", "list") == []

    line = ok(
        run_onward(
            db_url, "limits", "set", "connection:crm", "--concurrent", "2", "--calls", "5",
            "--per", "1",
        )
    )  # fmt: skip
    assert line.strip() == "connection:crm: max_concurrent=2 calls=5 per_seconds=1.0"
    ok(run_onward(db_url, "limits", "set", "provider:email", "--concurrent", "4"))
    ok(run_onward(db_url, "limits", "set", "org", "--calls", "100", "--per", "60"))
    assert cli_json(db_url, "limits", "list") == [
        {"key": "connection:crm", "max_concurrent": 2, "calls": 5, "per_seconds": 1.0, "in_use": 0},
        {"key": "org", "max_concurrent": None, "calls": 100, "per_seconds": 60.0, "in_use": 0},
        {"key": "provider:email", "max_concurrent": 4, "calls": None, "per_seconds": None,
         "in_use": 0},
    ]  # fmt: skip
    text = ok(run_onward(db_url, "limits", "list")).splitlines()
    assert text == [
        "connection:crm  at most 2 at once (0 now), 5 per 1s",
        "org  100 per 60s",
        "provider:email  at most 4 at once (0 now)",
    ]
    # set replaces what the key had: the rate of connection:crm is gone
    ok(run_onward(db_url, "limits", "set", "connection:crm", "--concurrent", "3"))
    before = stored(sql)
    assert before["limits"][0] == {
        "org_id": "default",  # the command line's organisation (no ONWARD_ORG)
        "key": "connection:crm",
        "max_concurrent": 3,
        "calls": None,
        "per_seconds": None,
    }

    bad = {
        "limit key 'nope:x'": ("nope:x", "--concurrent", "2"),
        "limit key 'connection:'": ("connection:", "--concurrent", "2"),
        "give max_concurrent": ("org",),
        "a rate needs both calls and per_seconds": ("org", "--calls", "5"),
        "a rate needs both": ("org", "--per", "1"),
        "per_seconds: more than 0": ("org", "--calls", "5", "--per", "0"),
        "more than 0": ("org", "--calls", "5", "--per", "-1"),
    }
    for needle, args in bad.items():
        refused(run_onward(db_url, "limits", "set", *args), needle)
    assert stored(sql) == before  # nothing stored, nothing replaced

    assert ok(run_onward(db_url, "limits", "remove", "connection:crm")).strip() == (
        "removed the limits of connection:crm"
    )
    refused(
        run_onward(db_url, "limits", "remove", "connection:crm"), "no limits for connection:crm"
    )
    assert [r["key"] for r in stored(sql)["limits"]] == ["org", "provider:email"]


def test_cli_circuits_are_configured_and_listed_and_bad_ones_store_nothing(
    db_url: str, sql: psycopg.Connection[Any]
) -> None:
    assert "no circuits" in ok(run_onward(db_url, "circuits", "list"))
    line = ok(
        run_onward(
            db_url, "circuits", "set", "provider:email", "--threshold", "3", "--window", "10",
            "--cooldown", "5",
        )
    )  # fmt: skip
    assert line.strip() == "provider:email: closed, opens after 3 failures in 10s, probes after 5s"
    ok(run_onward(db_url, "circuits", "set", "connection:mailbox"))  # the defaults
    listed = cli_json(db_url, "circuits", "list")
    assert [
        (c["key"], c["state"], c["threshold"], c["window_seconds"], c["cooldown_seconds"])
        for c in listed
    ] == [
        ("connection:mailbox", "closed", 5, 30.0, 30.0),
        ("provider:email", "closed", 3, 10.0, 5.0),
    ]
    assert all(c["failures"] == 0 and c["parked"] == 0 for c in listed)
    text = ok(run_onward(db_url, "circuits", "list"))
    assert "provider:email  closed  0/3 failures in 10s, cool-down 5s, 0 parked" in text

    before = stored(sql)
    bad = {
        "circuit key 'org'": ("org",),
        "circuit key 'provider:'": ("provider:",),
        "circuit key 'limit:x'": ("limit:x",),
        "window and cool-down more than 0 seconds": ("provider:email", "--window", "0"),
        "more than 0 seconds": ("provider:email", "--cooldown", "-1"),
    }
    for needle, args in bad.items():
        refused(run_onward(db_url, "circuits", "set", *args), needle)
    assert stored(sql) == before


def test_cli_budgets_are_set_and_listed_and_bad_ones_store_nothing(
    db_url: str, sql: psycopg.Connection[Any]
) -> None:
    assert ok(run_onward(db_url, "budgets", "list")).strip() == "no budgets"
    assert ok(run_onward(db_url, "budgets", "set", "*", "--usd", "25")).strip() == (
        "budget *: 25.0 usd per day"
    )
    ok(run_onward(db_url, "budgets", "set", "demo-follow-up", "--tokens", "200000"))
    listed = cli_json(db_url, "budgets", "list")
    assert [(b["scope"], b["unit"], float(b["per_day"]), b["parked"]) for b in listed] == [
        ("*", "usd", 25.0, 0),
        ("demo-follow-up", "tokens", 200000.0, 0),
    ]
    assert all(float(b["charged_today"]) == float(b["reserved"]) == 0 for b in listed)

    before = stored(sql)
    refused(run_onward(db_url, "budgets", "set", "*"), "give --usd or --tokens")
    refused(
        run_onward(db_url, "budgets", "set", "*", "--usd", "1", "--tokens", "2"),
        "give --usd or --tokens (one of them)",
    )
    assert stored(sql) == before


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("limits", "set", "org", "--concurrent", "0"), "concurrent"),
        (("limits", "set", "org", "--calls", "0", "--per", "1"), "calls"),
        (("circuits", "set", "provider:email", "--threshold", "0"), "threshold"),
        (("budgets", "set", "*", "--usd", "-1"), "0 or more"),
        (("budgets", "set", "*", "--tokens", "-5"), "0 or more"),
    ],
    ids=["concurrent-0", "calls-0", "threshold-0", "usd-negative", "tokens-negative"],
)
def test_cli_an_out_of_range_number_is_refused_in_one_line(
    db_url: str, sql: psycopg.Connection[Any], args: tuple[str, ...], needle: str
) -> None:
    before = stored(sql)
    refused(run_onward(db_url, *args), needle)
    assert stored(sql) == before


def test_cli_lanes_show_what_onward_lanes_and_onward_lane_policy_configure(db_url: str) -> None:
    assert cli_json(db_url, "lanes") == DEFAULT_LANES
    text = ok(run_onward(db_url, "lanes")).splitlines()
    assert text[1] == "io     capacity  32  lease 30s  5 attempts, backoff 1s..300s"

    # ONWARD_LANES: the lanes served and their capacity; a new name is a new lane
    assert cli_json(db_url, "lanes", env={"ONWARD_LANES": "io=3,bulk=2"}) == [
        {**DEFAULT_LANES[1], "capacity": 3},
        {"lane": "bulk", "served": True, "capacity": 2, "lease_seconds": 30.0, "max_attempts": 5, "base": 1.0,
         "cap": 300.0},
    ]  # fmt: skip
    # ONWARD_LANE_POLICY: any field of any lane, the others keep their defaults
    policy = '{"slow": {"lease_seconds": 300, "max_attempts": 1}, "io": {"base": 0.25}}'
    assert cli_json(db_url, "lanes", env={"ONWARD_LANE_POLICY": policy}) == [
        DEFAULT_LANES[0],
        {**DEFAULT_LANES[1], "base": 0.25},
        {**DEFAULT_LANES[2], "lease_seconds": 300.0, "max_attempts": 1},
        DEFAULT_LANES[3],
    ]
    both = {"ONWARD_LANES": "slow=2,bulk=4", "ONWARD_LANE_POLICY": '{"bulk": {"capacity": 6}}'}
    assert [(r["lane"], r["capacity"]) for r in cli_json(db_url, "lanes", env=both)] == [
        ("slow", 2),
        ("bulk", 6),
    ]
    text = ok(run_onward(db_url, "lanes", env=both)).splitlines()
    assert text[0] == "slow   capacity   2  lease 120s  2 attempts, backoff 10s..300s"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"ONWARD_LANE_POLICY": "{nope"}, "ONWARD_LANE_POLICY"),
        ({"ONWARD_LANE_POLICY": "[1]"}, "ONWARD_LANE_POLICY: a JSON object"),
        ({"ONWARD_LANE_POLICY": '{"slow": {"colour": 1}}'}, "lane slow: fields are"),
        ({"ONWARD_LANE_POLICY": '{"slow": 3}'}, "lane slow: fields are"),
        ({"ONWARD_LANE_POLICY": '{"io": {"capacity": 0}}'}, "lane io: capacity at least 1"),
        ({"ONWARD_LANE_POLICY": '{"io": {"lease_seconds": -1}}'}, "lease more than 0"),
        ({"ONWARD_LANE_POLICY": '{"io": {"max_attempts": "x"}}'}, "ONWARD_LANE_POLICY: lane io"),
        ({"ONWARD_LANE_POLICY": '{"Bad Lane": {"capacity": 2}}'}, "lane 'Bad Lane'"),
        ({"ONWARD_LANES": "io=0"}, "ONWARD_LANES: 'io=0'"),
        ({"ONWARD_LANES": "io"}, "ONWARD_LANES: 'io'"),
        ({"ONWARD_LANES": "IO=3"}, "lane 'IO'"),
    ],
    ids=[
        "policy-not-json",
        "policy-not-an-object",
        "policy-unknown-field",
        "policy-lane-not-an-object",
        "policy-capacity-0",
        "policy-negative-lease",
        "policy-attempts-not-a-number",
        "policy-bad-lane-name",
        "lanes-capacity-0",
        "lanes-no-capacity",
        "lanes-bad-name",
    ],
)
def test_cli_a_bad_lane_configuration_is_refused_in_one_line(
    db_url: str, env: dict[str, str], needle: str
) -> None:
    refused(run_onward(db_url, "lanes", env=env), needle)


def test_cli_a_policy_for_a_lane_not_served_is_not_silently_dropped(db_url: str) -> None:
    """``onward.lanes``' own example names ``"bulk": {"capacity": 4}`` in ONWARD_LANE_POLICY
    with no ONWARD_LANES: the lane is either added (as that example suggests) or the policy is
    refused, naming the lane -- never accepted and ignored (a misspelt lane would be too)."""
    for lane in ("bulk", "slwo"):
        env = {"ONWARD_LANE_POLICY": json.dumps({lane: {"capacity": 4}})}
        result = run_onward(db_url, "lanes", "--json", env=env)
        assert result.returncode == 0, result.stderr
        shown = {r["lane"]: (r["capacity"], r["served"]) for r in json.loads(result.stdout)}
        # shown, tuned, and marked as not served by these lanes (ONWARD_LANES names them)
        assert shown.get(lane) == (4, False), f"ONWARD_LANE_POLICY for {lane} ignored: {shown}"
        assert shown["io"] == (32, True)


# -- HTTP ----------------------------------------------------------------------------------------


@asynccontextmanager
async def served(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    """``create_app(engine)`` on a real uvicorn (any free port), and a client of it."""
    async with (
        ApiServer(create_app(engine), port=0, log_level="warning", access_log=False) as api,
        httpx.AsyncClient(
            base_url=api.url, timeout=10, headers=auth(await api_key(engine))
        ) as client,
    ):
        yield client


def rejected(response: httpx.Response, error: str = "invalid_request") -> dict[str, Any]:
    assert response.status_code == 422, (response.status_code, response.text)
    body: dict[str, Any] = response.json()
    assert body["error"] == error, body
    return body


async def test_http_limits_are_set_listed_replaced_and_removed_and_bad_ones_store_nothing(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    async with served(engine) as client:
        assert (await client.get("/v1/limits")).json() == []
        put = await client.put(
            "/v1/limits/connection:crm", json={"max_concurrent": 2, "calls": 5, "per_seconds": 1}
        )
        assert put.status_code == 200, put.text
        assert put.json() == {
            "key": "connection:crm",
            "max_concurrent": 2,
            "calls": 5,
            "per_seconds": 1.0,
            "in_use": 0,
        }
        assert (await client.put("/v1/limits/org", json={"max_concurrent": 50})).status_code == 200
        listed = (await client.get("/v1/limits")).json()
        assert [(r["key"], r["max_concurrent"], r["calls"]) for r in listed] == [
            ("connection:crm", 2, 5),
            ("org", 50, None),
        ]
        # a PUT replaces: the rate of connection:crm is gone
        replaced = await client.put(
            "/v1/limits/connection:crm", json={"calls": 10, "per_seconds": 2}
        )
        assert replaced.json()["max_concurrent"] is None and replaced.json()["calls"] == 10

        before = stored(sql)
        for path, body in [
            ("/v1/limits/nope:x", {"max_concurrent": 2}),  # not a key
            ("/v1/limits/connection:", {"max_concurrent": 2}),
            ("/v1/limits/org", {"max_concurrent": 0}),
            ("/v1/limits/org", {"calls": 0, "per_seconds": 1}),
            ("/v1/limits/org", {"calls": 5, "per_seconds": 0}),
            ("/v1/limits/org", {"calls": 5, "per_seconds": -1}),
            ("/v1/limits/org", {"max_concurrent": "two"}),
            ("/v1/limits/org", {"max_concurrent": 2, "colour": "red"}),  # unknown field
        ]:
            rejected(await client.put(path, json=body))
        for body in [{}, {"calls": 5}, {"per_seconds": 1}]:  # refused by the engine itself
            answer = rejected(await client.put("/v1/limits/org", json=body), "invalid_input")
            assert "per_seconds" in answer["detail"]
        not_json = await client.put(
            "/v1/limits/org", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert "not valid JSON" in rejected(not_json, "invalid_input")["detail"]
        assert stored(sql) == before

        assert (await client.delete("/v1/limits/connection:crm")).status_code == 204
        gone = await client.delete("/v1/limits/connection:crm")
        assert gone.status_code == 404 and gone.json()["error"] == "not_found"
        rejected(await client.delete("/v1/limits/nope:x"))
        assert [r["key"] for r in (await client.get("/v1/limits")).json()] == ["org"]


async def test_http_circuits_and_budgets_are_set_and_listed_and_bad_ones_store_nothing(
    engine: Engine, sql: psycopg.Connection[Any]
) -> None:
    async with served(engine) as client:
        assert (await client.get("/v1/circuits")).json() == []
        put = await client.put(
            "/v1/circuits/provider:email",
            json={"threshold": 3, "window_seconds": 10, "cooldown_seconds": 5},
        )
        assert put.status_code == 200, put.text
        assert {k: put.json()[k] for k in ("key", "state", "threshold", "parked")} == {
            "key": "provider:email",
            "state": "closed",
            "threshold": 3,
            "parked": 0,
        }
        assert (await client.put("/v1/circuits/connection:mailbox", json={})).status_code == 200
        listed = (await client.get("/v1/circuits")).json()
        assert [
            (c["key"], c["threshold"], c["window_seconds"], c["cooldown_seconds"]) for c in listed
        ] == [("connection:mailbox", 5, 30.0, 30.0), ("provider:email", 3, 10.0, 5.0)]

        budget = await client.put("/v1/budgets/*/usd", json={"per_day": 25})
        assert budget.status_code == 200, budget.text
        assert (budget.json()["scope"], budget.json()["unit"], budget.json()["per_day"]) == (
            "*",
            "usd",
            25.0,
        )
        tokens = await client.put("/v1/budgets/demo-follow-up/tokens", json={"per_day": 200000})
        assert tokens.status_code == 200, tokens.text
        budgets = (await client.get("/v1/budgets")).json()
        assert [(b["scope"], b["unit"], b["per_day"], b["parked"]) for b in budgets] == [
            ("*", "usd", 25.0, 0),
            ("demo-follow-up", "tokens", 200000.0, 0),
        ]

        before = stored(sql)
        for path, body in [
            ("/v1/circuits/org", {}),  # a circuit is per connection or provider
            ("/v1/circuits/provider:", {}),
            ("/v1/circuits/provider:email", {"threshold": 0}),
            ("/v1/circuits/provider:email", {"window_seconds": 0}),
            ("/v1/circuits/provider:email", {"cooldown_seconds": -1}),
            ("/v1/circuits/provider:email", {"threshold": 3, "colour": "red"}),
            ("/v1/budgets/*/eur", {"per_day": 25}),  # usd or tokens
            ("/v1/budgets/*/usd", {"per_day": -1}),
            ("/v1/budgets/*/usd", {}),
            ("/v1/budgets/*/usd", {"per_day": "lots"}),
            ("/v1/budgets/*/usd", {"per_day": 5, "currency": "usd"}),
        ]:
            rejected(await client.put(path, json=body))
        assert stored(sql) == before


async def test_http_lanes_show_what_onward_lanes_and_onward_lane_policy_configure(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONWARD_LANES", "io=3,bulk=2")
    monkeypatch.setenv("ONWARD_LANE_POLICY", '{"bulk": {"lease_seconds": 90, "max_attempts": 1}}')
    settings = Settings.from_env(database_url=db_url, org_id="test")  # what `onward api` reads
    async with (
        Engine.open(settings, migrate=False, start_queue=False) as configured,
        served(configured) as client,
    ):
        lanes = await client.get("/v1/lanes")
        assert lanes.status_code == 200
        assert lanes.json() == [
            {**DEFAULT_LANES[1], "capacity": 3},
            {"lane": "bulk", "served": True, "capacity": 2, "lease_seconds": 90.0, "max_attempts": 1,
             "base": 1.0, "cap": 300.0},
        ]  # fmt: skip
        # the same lanes the command line shows with that environment
        env = {"ONWARD_LANES": "io=3,bulk=2", "ONWARD_LANE_POLICY": settings.lane_policy or ""}
        assert await asyncio.to_thread(cli_json, db_url, "lanes", env=env) == lanes.json()


# -- the doctor ----------------------------------------------------------------------------------


async def test_doctor_json_reports_each_lane_and_the_open_circuits(
    db_url: str,
    engine: Engine,
    sql: psycopg.Connection[Any],
    sandbox: SandboxServer,
    admin: SandboxAdmin,
) -> None:
    await engine.integrations.add_connection(
        engine.org_id,
        "mailbox",
        provider="email",
        base_url=sandbox.url,
        account="acct_1",
        secret="acct_1",
    )
    await engine.configure_circuit(
        "connection:mailbox", threshold=1, window_seconds=60, cooldown_seconds=600
    )
    admin.faults("email", error_rate=1.0)
    mail = Automation("mail").step(
        "send", "email.send", connection="mailbox", to="m@example.test", subject="s", body="b"
    )
    await engine.publish(mail.build())
    await engine.publish(Automation("nap").step("nap", SLEEP_KIND, seconds=30).build())

    async with engine.running(lanes={"io": 1}):  # one io slot: backpressure shows as ready
        parked = (await engine.start("mail", {}, event_id="m1")).run_id
        assert await engine.wait(parked, timeout=30) == "parked"  # on the open circuit
        naps = [(await engine.start("nap", {}, event_id=f"n{i}")).run_id for i in range(2)]

        async def one_running_one_ready() -> bool:
            rows = sql.execute(
                "SELECT status, count(*) AS n FROM steps WHERE run_id = ANY(%s) GROUP BY status",
                (naps,),
            ).fetchall()
            return {r["status"]: r["n"] for r in rows} == {"running": 1, "ready": 1}

        await eventually(one_running_one_ready, timeout=20, what="one nap running, one ready")
        result = await asyncio.to_thread(run_onward, db_url, "doctor", "--json")

    assert result.returncode == 1, result.stderr  # an open circuit is unhealthy
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["healthy"] is False

    lanes = checks["lanes"]
    assert lanes["ok"] is True  # nothing starved past the grace
    io = lanes["value"]["io"]
    assert (io["ready"], io["running"], io["parked_circuit"], io["parked_budget"]) == (1, 1, 1, 0)
    assert 0 <= io["oldest_ready_s"] < 60
    assert "io: 1 ready" in lanes["detail"] and "1 running" in lanes["detail"]
    assert "1 on circuits" in lanes["detail"]

    circuits = checks["open_circuits"]
    assert (circuits["ok"], circuits["value"]) == (False, 1)
    assert "test/connection:mailbox open" in circuits["detail"]
