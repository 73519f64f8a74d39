"""`onward bench throughput --quick` (one run, and the scaling curve) as real commands; `start`,
`metrics`, `storage` and `intake` are in test_bench_cli_load.py (two files: with `--dist
loadfile` each runs in one test process, and the two share the suite's two).

These prove the commands work and their figures hang together; they assert no timing target
(the benches never run as timed tests: these machines are shared and noisy)."""

from __future__ import annotations

from dataclasses import replace

import psycopg

from onward.bench.ceiling import db_counters, wal_by_relation, wal_full_pages
from onward.bench.throughput import render
from onward.testing import run_onward
from tests.integration.benches import bench as _bench


def _setting(db_url: str, name: str) -> str:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    assert row is not None
    return str(row[0])


def _checkpoints_requested(db_url: str) -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT checkpoints_req FROM pg_stat_bgwriter").fetchone()
    assert row is not None
    return int(row[0])


def test_bench_throughput_quick_drains_every_run_beside_its_ceiling(db_url: str) -> None:
    checkpoints = _checkpoints_requested(db_url)
    res = _bench(db_url, "throughput", "--quick", "--pairs", "2", "--json")
    # a CHECKPOINT before each of the two drains and the ceiling's five tiers (at least: the
    # suite's other tests may ask for more)
    assert _checkpoints_requested(db_url) - checkpoints >= 7
    runs, steps_per_run = res["options"]["runs"], res["steps_per_run"]
    eng = res["engine"]
    # every run drained, every step executed once, none lost
    assert eng["runs"] == runs and eng["steps"] == runs * steps_per_run
    assert eng["claimed"] == runs and eng["eager"] == runs * (steps_per_run - 1)
    assert eng["lost"] == 0
    assert eng["steps_per_s"] > 0 and eng["runs_per_s"] > 0
    assert 0 < eng["run_latency_ms_p50"] <= eng["run_latency_ms_p99"]
    # measured, not guessed: settles are grouped, so at most one statement per step, and the
    # commits counted from pg_stat_database are positive and no more than one per step plus
    # the relay's and the sweep's own
    settles = eng["statements"]["leases.settle_advance"]["per_step"]
    assert 0 < settles <= 1.0
    assert 0 < eng["commits_per_step"] < 1.5 and eng["xids_per_step"] > 0
    assert "runs" in eng["tables"] and "steps" in eng["tables"]
    # one history event per step, on the step row: a claim writes none, a settle's event is its
    # step row's (no history_log row in an eager drain), a run's completion rides on its last
    assert eng["history_events_per_step"] == 1.0
    assert eng["history_rows_per_step"] <= 0.05
    # where the WAL went: the records of the window by relation add up to its bytes (less the
    # pages' own headers and padding), the steps', runs' and history's rows among them
    by_rel = eng["wal_by_relation"]
    assert eng["wal_inspect_error"] is None
    assert {"steps", "steps_pkey", "runs", "runs_pkey"} <= set(by_rel)
    assert 0.8 * eng["wal_bytes_per_step"] <= sum(by_rel.values()) <= eng["wal_bytes_per_step"]
    assert eng["worker_rss_mb"] and all(0 < mb < 1024 for mb in eng["worker_rss_mb"])
    assert res["starts"]["starts_per_s"] > 0
    # the ceiling: the same number of steps by the plain loops, in the same sitting
    loop, sql = res["ceiling"]["loop"], res["ceiling"]["engine_sql"]
    for tier in (loop, sql):
        assert tier["steps"] == runs * steps_per_run and tier["steps_per_s"] > 0
        assert 1.0 <= tier["commits_per_step"] < 2.0
    grouped = res["ceiling"]["grouped"]  # settles grouped per statement: under one commit a step
    assert grouped["steps"] == runs * steps_per_run and grouped["commits_per_step"] < 1.0
    assert res["ratio"] == round(eng["steps_per_s"] / loop["steps_per_s"], 3)
    for p in res["ceiling"]["pgbench"]:  # empty only where no pgbench is installed
        assert "error" not in p, p
        assert p["tps"] > 0
    live = res["live"]
    assert live["runs"] == runs and live["latency_ms_p50"] > 0
    assert set(res["targets"]) >= {"steps_per_s_ok", "rss_ok"}
    # the goals: two alternations, the sitting's own first, each ratio within its alternation,
    # judged on the medians (of two: their mean)
    goals = res["goals"]
    first, second = goals["alternations"]
    assert first["drain_steps_per_s"] == eng["steps_per_s"]
    # each drain between two grouped ceilings, its ratio against their mean; the sitting's
    # own second one is the table's grouped row
    assert first["grouped_after_steps_per_s"] == grouped["steps_per_s"]
    assert first["live_steps_per_s"] == live["steps_per_s"]
    for alt in (first, second):
        before, after = alt["grouped_before_steps_per_s"], alt["grouped_after_steps_per_s"]
        assert before > 0 and after > 0
        assert alt["grouped_steps_per_s"] == round((before + after) / 2, 1)
        assert alt["drain_over_grouped"] == round(
            alt["drain_steps_per_s"] / alt["grouped_steps_per_s"], 3
        )
        assert alt["live_over_drain"] == round(
            alt["live_steps_per_s"] / alt["drain_steps_per_s"], 3
        )
        assert alt["history_events_per_step"] == 1.0  # the second drain ran every step too
        # of its WAL, the full-page images (a checkpoint in the drain): a part, never more
        assert 0 <= alt["wal_full_page_bytes_per_step"] <= alt["wal_bytes_per_step"]
        # each drain begun after a CHECKPOINT of its own (this role may: a superuser)
        assert alt["checkpoint_before"] is True
    m = goals["median"]
    assert m["wal_bytes_per_step"] == round(
        (first["wal_bytes_per_step"] + second["wal_bytes_per_step"]) / 2, 3
    )
    assert goals["met"]["wal_bytes_per_step"] == (m["wal_bytes_per_step"] <= 1200)
    assert goals["met"]["live_over_drain"] == (m["live_over_drain"] >= 0.6)
    text = render(res)  # the same figures as the command prints them
    assert "goals, on the medians of 2 alternation(s)" in text
    assert "of the WAL a step, full-page images" in text
    assert "grouped, the mean of before and after each drain," in text
    assert "each drain begun after a CHECKPOINT)" in text
    # which server the figures are of (the embedded one, or the URL's)
    server = psycopg.conninfo.conninfo_to_dict(db_url)
    version = _setting(db_url, "server_version")
    assert res["server"] == f"PostgreSQL {version} at {server['host']}:{server.get('port', 5432)}"
    assert f"; server {res['server']}" in text.splitlines()[0]
    wal_line = next(line for line in text.splitlines() if "WAL bytes a step" in line)
    assert (
        wal_line.endswith("met") and ("NOT met" in wal_line) != goals["met"]["wal_bytes_per_step"]
    )


def test_bench_throughput_quick_curve_prints_one_point_per_worker_count(db_url: str) -> None:
    res = _bench(db_url, "throughput", "--quick", "--workers", "1,2", "--json")
    runs, steps_per_run = res["options"]["runs"], res["steps_per_run"]
    assert [p["workers"] for p in res["curve"]] == [1, 2]
    assert res["cores"] >= 1
    for p in res["curve"]:
        # each point drained every run once, beside the grouped ceiling of as many processes
        assert p["steps"] == runs * steps_per_run and p["lost"] == 0
        assert p["steps_per_s"] > 0 and 0 < p["commits_per_step"] < 1.5
        g = p["grouped"]
        assert g["steps"] == runs * steps_per_run and 0 < g["commits_per_step"] < 1.0
        # PostgreSQL's share of the machine: its CPU seconds over wall seconds over cores. A
        # quick drain lasts a few clock ticks of /proc's CPU counters, each server process's
        # reading is whole ticks, and under the suite other tests' backends run too: 0 is
        # possible, and so is a little over 1 (seen: 1.112). A unit slip (milliseconds read as
        # seconds) would be a thousand times off: that is what the bound catches.
        for share in (p["pg_cpu_share"], g["pg_cpu_share"]):
            assert 0 <= share < 3.0
        assert p["ratio"] == round(p["steps_per_s"] / g["steps_per_s"], 3)
    text = run_onward(
        db_url,
        "bench",
        "throughput",
        "--quick",
        "--workers",
        "1,2",
        "--capacity",
        "16",
        timeout=300,
    )
    assert text.returncode == 0, text.stderr
    assert "pg CPU" in text.stdout and "1 -> 2 workers: steps/s x" in text.stdout
    assert "lane fast=16, claim batch 16" in text.stdout  # --capacity, as given


def test_bench_workers_refuses_a_bad_count_in_one_line(db_url: str) -> None:
    for bad, why in (
        (("throughput", "--workers", "0"), "a whole number from 1 to 64"),
        (("throughput", "--workers", "1,x"), "a whole number from 1 to 64"),
        (("latency", "--workers", "1,2"), "takes one --workers count, not a list"),
        (("throughput", "--pairs", "0"), "--pairs 0: a whole number from 1 to 9"),
        (("latency", "--pairs", "2"), "bench 'latency' takes no --pairs"),
        (("throughput", "--pairs", "2", "--workers", "1,2"), "not a scaling curve"),
        (("throughput", "--capacity", "0"), "--capacity 0: a whole number from 1 to 10000"),
        (("latency", "--capacity", "8"), "bench 'latency' takes no --capacity"),
    ):
        out = run_onward(db_url, "bench", *bad, "--quick", timeout=60)
        assert out.returncode == 2, (bad, out.stderr)
        assert why in out.stderr and "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_wal_breakdown_waits_for_a_window_written_but_not_yet_flushed(db_url: str) -> None:
    """pg_walinspect refuses a window ending past the flush ("cannot accept future end LSN"),
    which a reading can be under load (the suite's run on a loaded machine read no breakdown):
    the bench waits for the flush. A commit without a flush (`synchronous_commit = off`) leaves
    its record inserted, not flushed, until the WAL writer's next round (up to 200 ms)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        # both made first: creating either commits with a flush, which would close the window
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        conn.execute("CREATE TABLE IF NOT EXISTS wal_window_probe (n int)")
        a = db_counters(db_url)
        conn.execute("SET synchronous_commit = off")
        conn.execute("INSERT INTO wal_window_probe SELECT generate_series(1, 10)")
        lsn = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert lsn is not None
        b = replace(a, wal_lsn=str(lsn[0]))
        by_rel = wal_by_relation(db_url, a, b, 1)
        fpi = wal_full_pages(db_url, a, b, 1)
    assert isinstance(by_rel, dict) and by_rel.get("wal_window_probe", 0) > 0, by_rel
    assert isinstance(fpi, float) and fpi >= 0, fpi
