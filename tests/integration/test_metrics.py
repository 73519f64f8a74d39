"""``/metrics`` (R18, B5) scraped from real processes -- one ``onward api``, two ``onward worker
--metrics-port 0`` -- while runs go through them: the counters of every process add up to what
the database holds, and the leader's health gauges say what ``onward doctor --json`` says."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from onward.testing import Process, Processes, eventually_sync, run_onward

FLOW = """\
id: m-flow
steps:
  - {id: a, kind: set, with: {values: {x: "1"}}, next: pause}
  - {id: pause, kind: wait_for, with: {duration: 1s}, next: b}
  - {id: b, kind: set, lane: io, with: {values: {y: "2"}}}
"""
# its only step is in a lane no worker of the test serves: it stays ready, the gauges see it
STUCK = """\
id: m-stuck
steps:
  - {id: a, kind: set, lane: slow, with: {values: {x: "1"}}}
"""
RUNS, STUCK_RUNS = 30, 3
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of a scrape, parsed by prometheus-client's own parser."""
    reply = httpx.get(url, timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over every sample whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def by_label(scrapes: list[Samples], name: str, label: str, **labels: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    want = set(labels.items())
    for samples in scrapes:
        for (n, ls), v in samples.items():
            if n == name and want <= ls:
                out[dict(ls)[label]] += v
    return {k: v for k, v in out.items() if v}


def ok(result: Any) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return str(result.stdout)


def metrics_url(proc: Process) -> str:
    return proc.wait_for(r"metrics on (http://\S+)", timeout=60).group(1)


def test_counters_add_up_and_gauges_match_doctor(
    db_url: str, tmp_path: Path, processes: Processes, sql: psycopg.Connection[dict[str, Any]]
) -> None:
    for name, text in (("flow.yaml", FLOW), ("stuck.yaml", STUCK)):
        (tmp_path / name).write_text(text)
        ok(run_onward(db_url, "publish", str(tmp_path / name)))
    env = {
        "ONWARD_METRICS_SECONDS": "0.5",
        "ONWARD_SWEEP_SECONDS": "0.2",
        "ONWARD_POLL_SECONDS": "0.2",
        "ONWARD_SHUTDOWN_GRACE_SECONDS": "2",
    }
    api = processes.onward(db_url, "api", "--port", "0", name="api", env=env)
    workers = [
        processes.onward(
            db_url,
            "worker",
            "--lanes",
            "fast=8,io=8,wait=8",
            "--metrics-port",
            "0",
            name="worker",
            env=env,
        )
        for _ in range(2)
    ]
    api_url = api.wait_for(r"API on (http://\S+)", timeout=60).group(1)
    worker_urls = [metrics_url(w) for w in workers]
    made = ok(run_onward(db_url, "keys", "create", "metrics", "--scope", "runs:write", "--json"))
    key = json.loads(made)["key"]

    with httpx.Client(
        base_url=api_url, timeout=10, headers={"Authorization": f"Bearer {key}"}
    ) as client:
        for i in range(RUNS):
            for _delivery in range(2):  # every webhook delivered twice: one run, one duplicate
                reply = client.post(
                    "/v1/hooks/m-flow", json={"i": i}, headers={"X-Event-Id": f"e{i}"}
                )
                assert reply.status_code in (200, 202), reply.text
        for i in range(STUCK_RUNS):
            reply = client.post("/v1/hooks/m-stuck", json={"i": i})
            assert reply.status_code == 202, reply.text
        mid_run = scrape(worker_urls[0])  # a scrape while runs go through answers too
        assert ("onward_sweeper_leader", frozenset()) in mid_run

    def finished() -> bool:
        row = sql.execute(
            "SELECT count(*) AS n FROM runs WHERE automation_id = 'm-flow' AND status = 'completed'"
        ).fetchone()
        return bool(row and row["n"] == RUNS)

    eventually_sync(finished, timeout=60, what="every m-flow run to complete")

    # -- counters: each process counts what it wrote; their sum is what the database holds
    from_api = scrape(api_url + "/metrics")
    assert total(from_api, "onward_runs_started_total") == RUNS + STUCK_RUNS
    assert total(from_api, "onward_run_starts_duplicate_total") == RUNS
    done_by_lane = {
        r["lane"]: float(r["n"])
        for r in sql.execute(
            "SELECT lane, count(*) AS n FROM steps WHERE status = 'done' GROUP BY lane"
        )
    }
    assert done_by_lane == {"fast": RUNS, "wait": RUNS, "io": RUNS}

    def counted() -> list[Samples]:
        scrapes = [scrape(u) for u in worker_urls]
        by_lane = by_label(scrapes, "onward_steps_total", "lane", outcome="done")
        assert by_lane == done_by_lane, by_lane
        return scrapes

    scrapes = eventually_sync(counted, timeout=10, what="the workers' step counters")
    assert sum(total(s, "onward_steps_total", outcome="done") for s in scrapes) == 3 * RUNS
    assert (
        sum(total(s, "onward_steps_total", lane="wait", outcome="waiting") for s in scrapes) == RUNS
    )
    assert sum(total(s, "onward_runs_finished_total", outcome="completed") for s in scrapes) == RUNS
    assert sum(total(s, "onward_timers_fired_total") for s in scrapes) == RUNS
    assert sum(total(s, "onward_timer_lateness_seconds_count") for s in scrapes) == RUNS
    assert sum(total(s, "onward_settles_refused_total") for s in scrapes) == 0
    transitions = sum(total(s, "onward_steps_total") for s in scrapes)
    assert sum(total(s, "onward_step_duration_seconds_count") for s in scrapes) == transitions
    claims = sql.execute(
        "SELECT count(*) AS n FROM history WHERE claimed_at IS NOT NULL AND worker IS NOT NULL"
    ).fetchone()
    assert claims is not None
    queued = sum(total(s, "onward_queue_lag_seconds_count") for s in scrapes)
    assert 0 < queued <= claims["n"]  # eager continuations never queue

    # -- gauges: one process (the elected sweeper) exports them, as doctor reports them
    stuck = sql.execute(
        "SELECT run_id FROM runs WHERE automation_id = 'm-stuck' LIMIT 1"
    ).fetchone()
    assert stuck is not None
    # a run with no durable way forward (a bug would leave one): its step gone, untouched a minute
    sql.execute("DELETE FROM steps WHERE run_id = %s", (stuck["run_id"],))
    sql.execute(
        "UPDATE runs SET updated_at = now() - interval '1 minute' WHERE run_id = %s",
        (stuck["run_id"],),
    )
    doctor = json.loads(run_onward(db_url, "doctor", "--json").stdout)
    checks = {c["name"]: c for c in doctor["checks"]}
    assert checks["runs_without_way_forward"]["value"] == 1
    lanes = checks["lanes"]["value"]
    assert lanes["slow"]["ready"] == STUCK_RUNS - 1

    def leader_matches_doctor() -> Samples | None:
        scrapes = [scrape(u) for u in worker_urls]
        leaders = [
            s for s in scrapes if ("onward_health_measured_timestamp_seconds", frozenset()) in s
        ]
        assert len(leaders) == 1, "exactly one process exports the health gauges"
        assert sum(total(s, "onward_sweeper_leader") for s in scrapes) == 1
        g = leaders[0]
        # None until a measurement taken after the step's deletion (every 0.5 s here)
        return g if total(g, "onward_runs_without_way_forward") == 1 else None

    g = eventually_sync(leader_matches_doctor, timeout=20, what="the leader's next measurement")
    for check, gauge in (
        ("runs_without_way_forward", "onward_runs_without_way_forward"),
        ("overdue_timers", "onward_timers_overdue"),
        ("stale_outbox", "onward_outbox_stale"),
        ("expired_leases", "onward_leases_expired"),
        ("two_unfinished_steps", "onward_steps_two_unfinished"),
        ("unsettled_effects", "onward_effects_unsettled"),
        ("effects_in_review", "onward_effects_in_review"),
        ("unrouted_signals", "onward_signals_unrouted"),
        ("undelivered_notifications", "onward_notifications_undelivered"),
        ("open_circuits", "onward_circuits_not_closed"),
    ):
        assert total(g, gauge) == checks[check]["value"], (check, gauge)
    for lane, row in lanes.items():
        assert total(g, "onward_lane_ready", lane=lane) == row["ready"], lane
        assert total(g, "onward_lane_running", lane=lane) == row["running"], lane
        assert total(g, "onward_lane_parked", lane=lane, on="circuit") == row["parked_circuit"]
        assert total(g, "onward_lane_parked", lane=lane, on="budget") == row["parked_budget"]
    oldest = total(g, "onward_lane_oldest_ready_seconds", lane="slow")
    assert oldest > 0 and abs(oldest - lanes["slow"]["oldest_ready_s"]) < 30
    assert {dict(ls)["lane"] for (n, ls) in g if n == "onward_lane_ready"} == set(lanes)


def test_metrics_can_be_moved_or_switched_off(db_url: str, processes: Processes) -> None:
    moved = processes.onward(
        db_url, "api", "--port", "0", name="moved", env={"ONWARD_METRICS": "/internal/metrics"}
    )
    off = processes.onward(db_url, "api", "--port", "0", name="off", env={"ONWARD_METRICS": "off"})
    moved_url = moved.wait_for(r"API on (http://\S+)", timeout=60).group(1)
    off_url = off.wait_for(r"API on (http://\S+)", timeout=60).group(1)
    assert "onward_runs_started_total" in httpx.get(moved_url + "/internal/metrics").text
    assert httpx.get(moved_url + "/metrics").status_code == 404
    assert httpx.get(off_url + "/metrics").status_code == 404


def test_a_bad_metrics_setting_is_one_line_and_exit_2(db_url: str) -> None:
    bad = run_onward(db_url, "worker", "--metrics-port", "70000")
    assert bad.returncode == 2, bad.stderr
    wrong = run_onward(db_url, "doctor", env={"ONWARD_METRICS": "sometimes"})
    assert wrong.returncode == 2 and re.search(r"ONWARD_METRICS='sometimes'", wrong.stderr)
    assert "Traceback" not in wrong.stderr
