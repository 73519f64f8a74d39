"""`onward doctor` and `onward bench --quick` as real commands against a real database."""

from __future__ import annotations

import json
import subprocess

import psycopg

from onward.testing import run_onward


def _onward(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_onward(db_url, *args, timeout=300, log_level="info")


def test_doctor_reports_each_invariant_and_fails_on_a_lost_run(
    db_url: str, sql: psycopg.Connection
) -> None:
    out = _onward(db_url, "doctor", "--json")
    report = json.loads(out.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["runs_without_way_forward"]["ok"] and checks["overdue_timers"]["ok"]
    # the command consumes no wakes, so the queue check made a NOTIFY round trip of its own
    assert checks["queue_postgres"] == {
        "name": "queue_postgres",
        "ok": True,
        "value": 0,
        "detail": "healthy",
    }
    # nothing runs here, so no sweeper is elected: unhealthy, exit 1
    assert not checks["sweeper_elected"]["ok"] and out.returncode == 1
    sql.execute(
        """INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind,
                             status, max_steps, deadline_at, updated_at)
           VALUES ('default', 'run_lost', 'a', 1, 'k', 'caller', 'waiting', 10,
                   now() + interval '1 day', now() - interval '1 hour')"""
    )
    report = json.loads(_onward(db_url, "doctor", "--json").stdout)
    lost = {c["name"]: c for c in report["checks"]}["runs_without_way_forward"]
    assert not lost["ok"] and "run_lost" in lost["detail"]


def test_bench_sweep_quick_prints_flat_figures(db_url: str) -> None:
    out = _onward(db_url, "bench", "sweep", "--quick", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert [s["backlog"] for s in result["sizes"]] == [1_000, 10_000]
    assert all(s["fired_per_batch"] == 240 for s in result["sizes"])
    assert any("timers_due" in line for line in result["explain"])
    # which server the figures are of, named by the command for a bench that does not itself
    assert result["server"] == _server_of(db_url)


def test_bench_text_begins_with_the_server_it_measured(db_url: str) -> None:
    out = _onward(db_url, "bench", "sweep", "--quick")
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()[:2]
    assert first == f"server: {_server_of(db_url)}"
    assert second.startswith("sweep")  # the bench's own text follows


def _server_of(db_url: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    assert row is not None
    return f"PostgreSQL {row[0]} at {info['host']}:{info.get('port', 5432)}"


def test_bench_latency_quick_measures_both_modes(db_url: str) -> None:
    out = _onward(db_url, "bench", "latency", "--quick", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    modes = {m["queue"]: m for m in res["modes"]}
    assert modes["postgres"]["fired_by"].get("wake", 0) > 0
    assert modes["none"]["fired_by"] == {"sweep": 20}
    # the burst: every timer due in the same second fired once, by the fast path or the sweep
    bursts = {b["queue"]: b for b in res["burst"]}
    assert set(bursts) == {"postgres", "redis"}
    for b in bursts.values():
        assert b["timers"] == 50 and sum(b["fired_by"].values()) == 50
        assert set(b["fired_by"]) <= {"wake", "sweep"}
        assert 0 <= b["lateness_ms_p50"] <= b["lateness_ms_p99"] <= b["lateness_ms_max"]
        assert sum(b["fired_per_second_after_t"]) == 50
        assert b["workers"]["lost"] == 0
    # with PostgreSQL the relay published each wake after its instant, and the fire followed
    published = bursts["postgres"]["published_ms"]
    assert published is not None and published["p50"] >= 0
