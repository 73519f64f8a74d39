"""`onward bench start|metrics|storage|intake --quick` as real commands (`throughput` is in
test_bench_cli.py).

These prove the commands work and their figures hang together; they assert no timing target
(the benches never run as timed tests: these machines are shared and noisy)."""

from __future__ import annotations

from tests.integration.benches import bench as _bench


def test_bench_start_quick_counts_each_duplicate_once(db_url: str) -> None:
    res = _bench(db_url, "start", "--quick", "--json")
    n = res["requests"]
    wh = res["webhook"]
    assert wh["requests"] == n and wh["per_s"] > 0
    assert wh["statuses"] == {"202": n // 2, "200": n // 2}
    assert wh["created"] == wh["duplicates"] == wh["runs_in_database"] == n // 2
    assert wh["duplicate_run_id_mismatches"] == 0 and wh["consistent"] is True
    # the cost of authentication: the same load without a key and on the signed path
    for auth, r in (
        ("key", wh),
        ("none", res["webhook_no_key"]),
        ("signed", res["webhook_signed"]),
    ):
        assert r["auth"] == auth and r["requests"] == n and r["per_s"] > 0
        assert r["statuses"] == {"202": n // 2, "200": n // 2}, (auth, r["statuses"])
        assert r["runs_in_database"] == n // 2 and r["consistent"] is True
    assert res["auth_cost"]["key_vs_no_key"] > 0 and res["auth_cost"]["signed_vs_no_key"] > 0
    lib = res["library"]
    assert lib["new"]["created"] == lib["new"]["requests"] > 0
    assert lib["duplicate"]["created"] == 0
    assert lib["sequential"]["per_s"] > 0
    assert res["sql_loop"]["per_s"] > 0
    for p in res["pgbench"]:
        assert "error" not in p, p
        assert p["tps"] > 0


def test_bench_metrics_quick_counters_match_the_bench_totals(db_url: str) -> None:
    res = _bench(db_url, "metrics", "--quick", "--json")
    runs = res["options"]["runs"]
    modes = {m: [d for d in res["drains"] if d["metrics"] == m] for m in res["steps_per_s"]}
    assert set(modes) == {"scraped", "counting", "off"}
    assert all(len(d) == res["options"]["reps"] for d in modes.values())
    for d in modes[
        "scraped"
    ]:  # scraped from the worker processes' own ports, set beside the database's rows
        assert d["counters"]["runs_started"] == {"metrics": runs, "bench": runs}
        assert d["counters"]["steps_done"] == {"metrics": 3 * runs, "bench": 3 * runs}
        assert d["counters"]["runs_completed"] == {"metrics": runs, "bench": runs}
        assert d["scrapes"]["failed"] == 0
    assert all(d["steps"] == 3 * runs for d in res["drains"])
    assert res["counters_match"] is True
    assert all(v > 0 for v in res["steps_per_s"].values())
    assert res["ceiling"]["steps_per_s"] > 0


def test_bench_storage_quick_measures_bytes_per_completed_run(db_url: str) -> None:
    res = _bench(db_url, "storage", "--quick", "--json")
    runs = res["options"]["runs"]
    assert res["runs_completed"] == runs and res["steps"] == runs * res["steps_per_run"]
    tables = res["tables"]
    # a run is one runs row and one steps row per step, all on disk after VACUUM
    assert tables["runs"]["rows"] == 1.0 and tables["steps"]["rows"] == res["steps_per_run"]
    # history_log: the run's start (run_started, step_ready) and a step_ready for a successor
    # that was not eager; its settles' events are its step rows' (3 more rows a run if not)
    assert 2.0 <= tables["history_log"]["rows"] < 3.0
    for name in ("runs", "steps", "history_log"):
        t = tables[name]
        assert t["heap"] > 0  # each figure is rounded on its own: equal to a tenth
        assert abs(t["total"] - (t["heap"] + t["indexes"] + t["toast"])) <= 0.2
    assert abs(res["bytes_per_run"] - sum(t["total"] for t in tables.values())) <= 0.1
    assert 0 < res["bytes_per_run_compact"] <= res["bytes_per_run"]
    assert res["wal_bytes_per_run"] > 0
    assert res["runs_per_100gb"] == int(100e9 / res["bytes_per_run"])


def test_bench_intake_quick_answers_every_delivery_with_one_commit(db_url: str) -> None:
    res = _bench(db_url, "intake", "--quick", "--json")
    assert res["api_processes"] == 2
    for phase in ("open", "paced"):
        r = res[phase]
        assert r["consistent"], r  # every answer 2xx, at most one run per event id
        assert r["requests"] > 0 and r["per_s"] > 0
        assert 0 < r["latency_ms_p50"] <= r["latency_ms_p99"]
    # a new start and a duplicate of one committed earlier: one commit each (a duplicate
    # racing its original a second; each API connection's first loan sets its organisation)
    assert res["commits_per_request"] < 1.2, res
    assert res["paced"]["runs_in_database"] == res["paced"]["ids_sent"]
    assert res["ceiling_per_s"] > 0 and res["ratio"] is not None
