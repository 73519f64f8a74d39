"""``onward bench metrics``: ``/metrics`` scraped during the throughput drain, and its cost.

On a scratch database, the drain of ``onward bench throughput`` (N runs of three no-op steps,
started through the library in this process, then drained by W worker processes) is run
``3 x reps`` times, the modes rotated: **scraped** -- counting on, every worker serving its
metrics on a port (``--metrics-port``), scraped every ``scrape_every`` seconds while the drain
runs and once after it; **counting** -- counting on, nothing served (the increments alone);
**off** -- ``ONWARD_METRICS=off`` (every increment returns at once). After each scraped drain
the counters are set beside the bench's own totals: runs started (this process's counter: the
starts were made here) against N, steps done and runs completed (summed over the workers'
scrapes) against the database's rows. Printed: steps/s of each drain, the median of each mode
and its share of *off*, and the machine's ceiling from the same sitting (the minimal psycopg
claim/settle loop of the throughput bench, median of ``reps``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import psycopg
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from onward import metrics
from onward.bench import median, percentile
from onward.bench import throughput as tp
from onward.bench.ceiling import polling
from onward.bench.db import scratch_database

Sample = tuple[str, dict[str, str], float]


def _scrape(client: httpx.Client, url: str) -> list[Sample]:
    """Every sample of one scrape, parsed by prometheus-client's own parser."""
    text = client.get(url).raise_for_status().text
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _sum(scrapes: list[list[Sample]], name: str, **labels: str) -> int:
    """``name`` summed over every process and every sample whose labels include ``labels``."""
    return int(
        sum(
            value
            for samples in scrapes
            for n, ls, value in samples
            if n == name and labels.items() <= ls.items()
        )
    )


class _Scraper(threading.Thread):
    """Scrapes every URL every ``every`` seconds until stopped, timing each scrape."""

    def __init__(self, urls: list[str], every: float) -> None:
        super().__init__(daemon=True)
        self.urls, self.every = urls, every
        self.stopped = threading.Event()
        self.ms: list[float] = []
        self.failures = 0

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.stopped.is_set():
                for url in self.urls:
                    t0 = time.perf_counter()
                    try:  # fetched, not parsed: parsing is the Prometheus server's CPU
                        client.get(url).raise_for_status()
                    except httpx.HTTPError:
                        self.failures += 1
                        continue
                    self.ms.append((time.perf_counter() - t0) * 1000)
                self.stopped.wait(self.every)


def _started_here() -> float:
    return REGISTRY.get_sample_value("onward_runs_started_total") or 0.0


MODES = ("scraped", "counting", "off")


def _drain(url: str, o: dict[str, Any], org: str, mode: str) -> dict[str, Any]:
    n = o["runs"]
    scraped = mode == "scraped"
    counting = "off" if mode == "off" else "on"
    metrics.configure(counting)  # the starts made here count, or not
    children = tp._spawn_workers(
        url, org, {**o, "metrics": counting, "metrics_port": 0 if scraped else None}
    )
    try:
        urls = (
            [f"http://127.0.0.1:{c.ready['metrics_port']}/metrics" for c in children]
            if scraped
            else []
        )
        started0 = _started_here()
        asyncio.run(tp._starts(url, org, n, o["starters"], o["conns"]))
        started = _started_here() - started0
        scraper = _Scraper(urls, o["scrape_every"])
        with polling(url) as poll:
            t0 = time.perf_counter()
            for c in children:
                c.send("go")
            if scraped:
                scraper.start()
            tp._wait_finished(poll, org, timeout=120 + n * 0.05)
            elapsed = time.perf_counter() - t0
        scraper.stopped.set()
        if scraped:
            scraper.join()
        with httpx.Client(timeout=5) as client:
            final = [_scrape(client, u) for u in urls]
        for c in children:
            c.send("stop")
        done = [c.finish() for c in children]
    finally:
        for c in children:
            c.kill()
        metrics.configure("on")
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM steps WHERE org_id = %(org)s AND status = 'done'),"
            " (SELECT count(*) FROM runs WHERE org_id = %(org)s AND status = 'completed')",
            {"org": org},
        ).fetchone()
    steps, completed = (int(row[0]), int(row[1])) if row else (0, 0)
    res: dict[str, Any] = {
        "metrics": mode,
        "runs": n,
        "steps": steps,
        "elapsed_s": round(elapsed, 3),
        "steps_per_s": round(steps / elapsed, 1),
        # CPU the workers spent from "go" to "stop": a cost the machine's load hardly moves
        "cpu_ms_per_step": round(sum(d["cpu_s"] for d in done) * 1000 / max(steps, 1), 4),
    }
    if scraped:
        res["counters"] = {
            "runs_started": {"metrics": int(started), "bench": n},
            "steps_done": {
                "metrics": _sum(final, "onward_steps_total", outcome="done"),
                "bench": steps,
            },
            "runs_completed": {
                "metrics": _sum(final, "onward_runs_finished_total", outcome="completed"),
                "bench": completed,
            },
            "settles_refused": {"metrics": _sum(final, "onward_settles_refused_total"), "bench": 0},
        }
        res["scrapes"] = {
            "during": len(scraper.ms),
            "failed": scraper.failures,
            "ms_p50": round(median(scraper.ms), 2),
            "ms_p99": round(percentile(scraper.ms, 99), 2),
        }
    return res


def run(
    admin_url: str,
    *,
    quick: bool = False,
    runs: int | None = None,
    workers: int | None = None,
    reps: int | None = None,
) -> dict[str, Any]:
    o: dict[str, Any] = {
        "runs": runs or (30 if quick else 2_000),
        "workers": workers or (1 if quick else 2),
        "conns": 2 if quick else 10,
        "batch": 32 if quick else 128,
        "capacity": 32 if quick else 128,
        "loop_batch": 32,
        "starters": 4 if quick else 16,
        "reps": reps or (1 if quick else 3),
        "scrape_every": 0.2,
    }
    drains: list[dict[str, Any]] = []
    with scratch_database(admin_url, "metrics") as url:
        orgs = [f"m{i}{mode}" for i in range(o["reps"]) for mode in MODES]
        asyncio.run(tp._publish(url, orgs))
        for i in range(o["reps"]):
            # rotate which goes first, so no mode always meets a warmer (or busier) machine
            for mode in MODES[i % 3 :] + MODES[: i % 3]:
                drains.append(_drain(url, o, f"m{i}{mode}", mode))
        loops = sorted(
            (tp._loop_tier(url, "minimal", o, rep) for rep in range(o["reps"])),
            key=lambda r: r["steps_per_s"],
        )
    ceiling = loops[len(loops) // 2]
    per_mode = {m: median([d["steps_per_s"] for d in drains if d["metrics"] == m]) for m in MODES}
    cpu = {m: median([d["cpu_ms_per_step"] for d in drains if d["metrics"] == m]) for m in MODES}
    off = per_mode["off"]
    counters_ok = all(
        c["metrics"] == c["bench"] for d in drains for c in d.get("counters", {}).values()
    )
    return {
        "bench": "metrics",
        "options": o,
        "drains": drains,
        "steps_per_s": per_mode,
        "over_off": {m: round(v / off, 3) if off else None for m, v in per_mode.items()},
        "cpu_ms_per_step": cpu,
        "ceiling": {
            "steps_per_s": ceiling["steps_per_s"],
            "all": [r["steps_per_s"] for r in loops],
            "conns": ceiling["conns"],
        },
        "counters_match": counters_ok,
    }


def render(res: dict[str, Any]) -> str:
    o = res["options"]
    lines = [
        f"metrics: {o['runs']} runs x {tp.STEPS} no-op set steps, {o['workers']} worker "
        f"processes x {o['conns']} connections; {o['reps']} alternations of the drain: "
        f"scraped (counting, each worker scraped every {o['scrape_every']} s), counting (not "
        "served), off (ONWARD_METRICS=off)",
        "",
        f"{'drain':<8} {'metrics':<8} {'steps':>6} {'s':>7} {'steps/s':>8} {'CPU ms/st':>9}"
        "  scrapes during (p50 / p99 ms)",
    ]
    for i, d in enumerate(res["drains"]):
        sc = d.get("scrapes")
        extra = (
            f"  {sc['during']} ({sc['ms_p50']:.1f} / {sc['ms_p99']:.1f}), {sc['failed']} failed"
            if sc
            else ""
        )
        lines.append(
            f"{i + 1:<8} {d['metrics']:<8} {d['steps']:>6} {d['elapsed_s']:>7.2f} "
            f"{d['steps_per_s']:>8.0f} {d['cpu_ms_per_step']:>9.3f}{extra}"
        )
    lines += [
        "",
        "median steps/s: "
        + ", ".join(
            f"{m} {v:.0f} ({res['over_off'][m]:.3f} of off)" for m, v in res["steps_per_s"].items()
        ),
        "median worker CPU ms/step: "
        + ", ".join(f"{m} {v:.3f}" for m, v in res["cpu_ms_per_step"].items()),
        f"ceiling (psycopg loop, minimal SQL, {res['ceiling']['conns']} conns, same sitting): "
        f"{res['ceiling']['steps_per_s']:.0f} steps/s (reps {res['ceiling']['all']})",
        "",
        "counters scraped after each scraped drain, beside the bench's own totals:",
        f"  {'drain':<6} {'counter':<18} {'/metrics':>9} {'bench':>7}",
    ]
    for i, d in enumerate(res["drains"]):
        for name, c in d.get("counters", {}).items():
            mark = "" if c["metrics"] == c["bench"] else "  MISMATCH"
            lines.append(f"  {i + 1:<6} {name:<18} {c['metrics']:>9} {c['bench']:>7}{mark}")
    lines.append("")
    lines.append(
        "counters match the bench's totals"
        if res["counters_match"]
        else "COUNTERS DO NOT MATCH the bench's totals"
    )
    return "\n".join(lines)


__all__ = ["render", "run"]
