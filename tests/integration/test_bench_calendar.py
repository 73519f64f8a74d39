"""`onward bench monday --quick` and `onward bench recompute --quick` as real commands.

These prove the commands work and their figures hang together; they assert no timing target
(the benches never run as timed tests: these machines are shared and noisy)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def _bench(db_url: str, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "onward.cli", "--database-url", db_url, "bench", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_bench_monday_quick_fires_every_timer_at_its_own_instant(db_url: str) -> None:
    res = _bench(db_url, "monday", "--quick", "--json")
    n, spread = res["options"]["runs"], res["options"]["spread_s"]
    modes = {(m["queue"], m["spread_s"] > 0): m for m in res["modes"]}
    assert set(modes) == {("postgres", True), ("postgres", False), ("none", True), ("none", False)}
    for (queue, spread_on), m in modes.items():
        # every run waited for the one instant (plus its own offset) and completed once
        assert m["timers"] == n and sum(m["fired_by"].values()) == n
        assert m["slack_s"] >= 0 and m["rule"].count(":") == 2
        assert 0 <= m["due_window_s"] < (spread if spread_on else 1e-6) + 1e-3
        if spread_on:
            assert m["spread_s"] == spread and m["timers_per_s_of_window"] == n / spread
        # lateness past each timer's own instant: never negative, ordered
        assert 0 <= m["lateness_ms_p50"] <= m["lateness_ms_p99"] <= m["lateness_ms_max"]
        assert m["lateness_ms_p50"] <= m["completed_ms_p50"]
        assert 0 < m["peak_fired_per_s"] <= n and 0 < m["peak_completed_per_s"] <= n
        assert sum(m["fired_per_second"]) == n
        assert 0 <= m["queue_depth_p50"] <= m["queue_depth_max"] <= n
        assert m["samples"] > 0 and m["all_completed_after_t_s"] >= 0
        assert m["workers"]["lost"] == 0 and m["workers"]["claimed"] >= 2 * n
        if queue == "none":  # no wakes: only the sweep fires
            assert set(m["fired_by"]) == {"sweep"}
        else:
            assert set(m["fired_by"]) <= {"wake", "sweep"} and m["fired_by"].get("wake", 0) > 0
    ceiling = res["ceiling"]
    assert ceiling["timers"] == n and ceiling["fired_per_s"] > 0
    assert res["sweep_per_tick_one_org"] > 0
    assert set(res["targets"]) == {"spread_p99_ms_below", "spread_p99_ok"}


def test_bench_recompute_quick_moves_nothing_then_everything(db_url: str) -> None:
    res = _bench(db_url, "recompute", "--quick", "--json")
    m = res["timers"]
    unchanged, moves = res["unchanged"], res["moves"]
    # the SQL-made intents are exactly what calendar.plan gives: nothing moves
    assert unchanged["examined"] == m and unchanged["unchanged"] == m
    assert unchanged["moved"] == 0 and unchanged["no_occurrence"] == 0
    # planned by "older tz data" an hour off: every timer moves, each once, with its history
    # row and a delayed wake of the new wake number
    assert moves["examined"] == moves["moved"] == m
    assert moves["check"] == {"at_new_instant": m, "history_rows": m, "wakes": m}
    for r in (unchanged, moves):
        assert r["seconds"] > 0 and r["timers_per_s"] > 0 and r["ratio_to_ceiling"] > 0
    c = res["ceiling"]
    assert c["read_per_s"] > 0 and c["plan_per_s"] > 0
    assert c["read_then_plan_per_s"] < min(c["read_per_s"], c["plan_per_s"])
