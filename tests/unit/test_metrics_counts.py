"""The counts behind ``/metrics`` (``onward.metrics``): plain in-process counts read by a
collector at scrape time. Each test drives the public functions and reads the exposition as a
scraper does (``generate_latest``, parsed by prometheus-client's own parser): exact counter
values, cumulative buckets, ``_sum``, ``_count`` and ``_created``, the same samples
prometheus-client's own ``Counter`` and ``Histogram`` give for the same observations, the
names, types and help texts unchanged, and nothing moving with ``ONWARD_METRICS=off``.

The counts are the process's: other tests in this process may have counted too. Every test
counts under label values of its own (a fresh lane, outcome, ``by``) and reads the counters
without labels as differences."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator

import prometheus_client
import prometheus_client.metrics
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from onward import metrics

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

# The exposition's contract: family -> (type, help, label names, finite buckets)
SPEC: dict[str, tuple[str, str, tuple[str, ...], tuple[float, ...]]] = {
    "onward_runs_started": (
        "counter",
        "Runs this process started (a new run; a duplicate start is not one)",
        (),
        (),
    ),
    "onward_run_starts_duplicate": (
        "counter",
        "Starts acknowledged as duplicates of a run already started",
        (),
        (),
    ),
    "onward_runs_finished": (
        "counter",
        "Runs that ended, by outcome, counted by the process whose transition ended them",
        ("outcome",),
        (),
    ),
    "onward_steps": (
        "counter",
        "Step transitions this process's worker wrote, by lane and outcome "
        "(done, skipped, waiting, retried, deferred, failed, cancelled, parked)",
        ("lane", "outcome"),
        (),
    ),
    "onward_settles_refused": (
        "counter",
        "Settles the fence refused: the attempt was stale (its lease had been taken over)",
        ("lane",),
        (),
    ),
    "onward_leases_lost": (
        "counter",
        "Steps whose heartbeat found the lease taken over; the handler was stopped, "
        "nothing written",
        ("lane",),
        (),
    ),
    "onward_leases_rescued": (
        "counter",
        "Steps whose lease lapsed, made ready again by the sweep",
        (),
        (),
    ),
    "onward_timers_fired": (
        "counter",
        "Timers fired, by what fired them (wake or sweep)",
        ("by",),
        (),
    ),
    "onward_outbox_published": (
        "counter",
        "Outbox rows the relay published as wakes",
        (),
        (),
    ),
    "onward_step_duration_seconds": (
        "histogram",
        "From a step's claim to its transition written, by lane",
        ("lane",),
        (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    ),
    "onward_timer_lateness_seconds": (
        "histogram",
        "Timer lateness: fired_at - due_at by the database clock, by what fired it",
        ("by",),
        (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600),
    ),
    "onward_queue_lag_seconds": (
        "histogram",
        "From a step becoming ready to its claim, by the database clock, by lane "
        "(steps continued eagerly by the worker that settled the step before never queue)",
        ("lane",),
        (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
    ),
}


def scrape(registry: CollectorRegistry = REGISTRY) -> Samples:
    """Every ``onward_`` sample of the text exposition, parsed by prometheus-client's parser
    (not the process's CPU and GC metrics, which move by themselves)."""
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("onward_")
    }


def mine(samples: Samples, label: str, value: str) -> Samples:
    """The samples whose label ``label`` is ``value`` (this test's own series)."""
    return {k: v for k, v in samples.items() if (label, value) in k[1]}


def no_created(samples: Samples) -> Samples:
    return {k: v for k, v in samples.items() if not k[0].endswith("_created")}


def fresh() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return (name, frozenset(labels.items()))


def cumulative(
    name: str, les: tuple[float, ...], counts: list[int], total: float, **labels: str
) -> Samples:
    """A histogram's expected samples: ``counts`` per bucket (not cumulative; the last is
    +Inf), ``total`` the sum."""
    out: Samples = {}
    acc = 0
    for le, n in zip((*les, math.inf), counts, strict=True):
        acc += n
        le_s = "+Inf" if le == math.inf else repr(float(le))
        out[key(f"{name}_bucket", **labels, le=le_s)] = float(acc)
    out[key(f"{name}_count", **labels)] = float(acc)
    out[key(f"{name}_sum", **labels)] = total
    return out


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], object]]:
    """``metrics.configure``, undone after the test."""
    monkeypatch.setattr(metrics, "enabled", metrics.enabled)
    monkeypatch.setattr(metrics, "path", metrics.path)
    metrics.configure("on")
    yield metrics.configure


def test_the_families_keep_their_names_types_help_and_labels(
    counting: Callable[[str], object],
) -> None:
    lane, by, outcome = fresh(), fresh(), fresh()
    metrics.step_settled(lane, "done", True)
    metrics.step_settled(lane, "done", False)
    metrics.lease_lost(lane)
    metrics.run_finished(outcome)
    metrics.timers_fired(by, [{"lateness_s": 1.0}])
    metrics.step_timed(lane, 1.0)
    metrics.claimed([{"lane": lane, "queue_lag_s": 1.0}])
    families = {
        f.name: f
        for f in text_string_to_metric_families(generate_latest(REGISTRY).decode())
        if f.name.startswith("onward_")
    }
    for name, (kind, text, labels, buckets) in SPEC.items():
        family = families[name]
        assert (family.type, family.documentation) == (kind, text), name
        for s in family.samples:
            want = set(labels) | ({"le"} if s.name.endswith("_bucket") else set())
            assert set(s.labels) == want, (name, s)
        if kind == "histogram":
            les = [s.labels["le"] for s in family.samples if s.name == f"{name}_bucket"]
            per_child = [*(repr(float(b)) for b in buckets), "+Inf"]
            assert les[: len(per_child)] == per_child, name
        if not getattr(prometheus_client.metrics, "_use_created", True):
            continue  # PROMETHEUS_DISABLE_CREATED_SERIES
        # prometheus-client's _created, a gauge family of its own in the text format
        created = families[f"{name}_created"]
        assert created.type == "gauge" and created.documentation == text
        series = {frozenset(s.labels.items()) for s in created.samples}
        counted = {
            frozenset((k, v) for k, v in s.labels.items() if k != "le") for s in family.samples
        }
        assert series == counted, name
    assert families["onward_sweeper_leader"].type == "gauge"


def test_counters_count_exactly_what_was_written(counting: Callable[[str], object]) -> None:
    lane, other, outcome = fresh(), fresh(), fresh()
    before = scrape()
    for _ in range(3):
        metrics.step_settled(lane, "done", True)
    metrics.step_settled(lane, "waiting", True)
    metrics.step_settled(other, "done", True)
    metrics.step_settled(lane, "done", False)
    metrics.step_settled(lane, "done", False)
    metrics.lease_lost(lane)
    metrics.run_finished(outcome)
    metrics.run_finished(outcome, 4)
    metrics.run_finished(f"{outcome}-none", 0)  # nothing ended: no series either
    metrics.run_started(True)
    metrics.run_started(True)
    metrics.run_started(False)
    metrics.rescued(5)
    metrics.rescued(0)
    metrics.published(7)
    after = scrape()

    assert no_created(mine(after, "lane", lane)) == {
        key("onward_steps_total", lane=lane, outcome="done"): 3.0,
        key("onward_steps_total", lane=lane, outcome="waiting"): 1.0,
        key("onward_settles_refused_total", lane=lane): 2.0,
        key("onward_leases_lost_total", lane=lane): 1.0,
    }
    assert after[key("onward_steps_total", lane=other, outcome="done")] == 1.0
    assert no_created(mine(after, "outcome", outcome)) == {
        key("onward_runs_finished_total", outcome=outcome): 5.0
    }
    assert not mine(after, "outcome", f"{outcome}-none")
    for name, delta in (
        ("onward_runs_started_total", 2.0),
        ("onward_run_starts_duplicate_total", 1.0),
        ("onward_leases_rescued_total", 5.0),
        ("onward_outbox_published_total", 7.0),
    ):
        assert after[key(name)] - before[key(name)] == delta, name
        assert key(name.replace("_total", "_created")) in after  # from import, as before
    # what ``onward bench metrics`` reads in its own process
    assert (
        REGISTRY.get_sample_value("onward_runs_started_total")
        == after[key("onward_runs_started_total")]
    )
    # one _created per series, a time near now, fixed at the series' first count
    created = mine(after, "lane", lane)
    stamp = created[key("onward_steps_created", lane=lane, outcome="done")]
    assert abs(stamp - time.time()) < 600
    metrics.step_settled(lane, "done", True)
    again = scrape()
    assert again[key("onward_steps_created", lane=lane, outcome="done")] == stamp
    assert again[key("onward_steps_total", lane=lane, outcome="done")] == 4.0


def test_histograms_bucket_sum_and_count_exactly(counting: Callable[[str], object]) -> None:
    lane, by = fresh(), fresh()
    # dyadic values: their sums are exact in any order
    for v in (0.0, 2**-10, 0.25, 0.375, 1.0, 300.0, 512.0):
        metrics.step_timed(lane, v)
    metrics.claimed(
        [
            {"lane": lane, "queue_lag_s": 0.5},
            {"lane": lane, "queue_lag_s": None},  # no lag known: 0
            {"lane": lane, "queue_lag_s": -2.0},  # clocks: never below 0
            {"lane": lane, "queue_lag_s": 4096.0},
        ]
    )
    metrics.timers_fired(by, [{"lateness_s": 0.0625}, {"lateness_s": 3600.0}, {"lateness_s": 8}])
    got = no_created(scrape())

    _, _, _, step_b = SPEC["onward_step_duration_seconds"]
    # 0.001 | 0.0025 0.005 0.01 0.025 0.05 0.1 | 0.25 | 0.5 | 1 | 2.5 5 10 30 60 | 300 | +Inf
    counts = [2, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1]
    assert (
        mine(got, "lane", lane).items()
        >= cumulative(
            "onward_step_duration_seconds", step_b, counts, 813.6259765625, lane=lane
        ).items()
    )
    _, _, _, lag_b = SPEC["onward_queue_lag_seconds"]
    counts = [2, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]
    assert (
        mine(got, "lane", lane).items()
        >= cumulative("onward_queue_lag_seconds", lag_b, counts, 4096.5, lane=lane).items()
    )
    assert len(mine(got, "lane", lane)) == (len(step_b) + 3) + (len(lag_b) + 3)
    _, _, _, late_b = SPEC["onward_timer_lateness_seconds"]
    counts = [0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0]
    assert mine(got, "by", by) == {
        **cumulative("onward_timer_lateness_seconds", late_b, counts, 3608.0625, by=by),
        key("onward_timers_fired_total", by=by): 3.0,
    }

    # a sweep that fired nothing: its series exist, at 0 (as prometheus-client's labels() made)
    idle = fresh()
    metrics.timers_fired(idle, [])
    assert no_created(mine(scrape(), "by", idle)) == {
        **cumulative("onward_timer_lateness_seconds", late_b, [0] * 15, 0.0, by=idle),
        key("onward_timers_fired_total", by=idle): 0.0,
    }


def test_the_same_samples_as_prometheus_clients_own_metrics(
    counting: Callable[[str], object],
) -> None:
    """Every bucket bound, a hair either side of it, 0, below 0 and past the last bound,
    observed both here and by prometheus-client's ``Histogram`` (and counted by its
    ``Counter``) in a registry of their own: the same samples, bit for bit."""
    lane, by = fresh(), fresh()
    ref = CollectorRegistry()
    hists = {
        name: Histogram(name, text, labels, buckets=buckets, registry=ref)
        for name, (kind, text, labels, buckets) in SPEC.items()
        if kind == "histogram"
    }
    fired = Counter("onward_timers_fired", SPEC["onward_timers_fired"][1], ["by"], registry=ref)
    steps = Counter("onward_steps", SPEC["onward_steps"][1], ["lane", "outcome"], registry=ref)

    def values(bounds: tuple[float, ...]) -> list[float]:
        out = [0.0, -1.0, 1e9, 0.3, 7.77]
        for b in bounds:
            out += [float(b), math.nextafter(b, 0), math.nextafter(b, math.inf)]
        return out

    step_h = hists["onward_step_duration_seconds"].labels(lane)
    for v in values(SPEC["onward_step_duration_seconds"][3]):
        metrics.step_timed(lane, v)
        step_h.observe(v)
        metrics.step_settled(lane, "done", True)
        steps.labels(lane, "done").inc()
    lag = values(SPEC["onward_queue_lag_seconds"][3])
    metrics.claimed([{"lane": lane, "queue_lag_s": v} for v in lag])
    for v in lag:
        hists["onward_queue_lag_seconds"].labels(lane).observe(max(v, 0.0))
    late = values(SPEC["onward_timer_lateness_seconds"][3])
    metrics.timers_fired(by, [{"lateness_s": v} for v in late])
    for v in late:
        hists["onward_timer_lateness_seconds"].labels(by).observe(max(v, 0.0))
    fired.labels(by).inc(len(late))

    got, want = no_created(scrape()), no_created(scrape(ref))
    assert mine(got, "lane", lane) == mine(want, "lane", lane)
    assert mine(got, "by", by) == mine(want, "by", by)
    assert len(mine(want, "lane", lane)) == 1 + sum(
        len(SPEC[n][3]) + 3 for n in ("onward_step_duration_seconds", "onward_queue_lag_seconds")
    )


def test_created_samples_follow_prometheus_clients_switch(
    counting: Callable[[str], object],
) -> None:
    lane = fresh()
    metrics.step_timed(lane, 1.0)
    metrics.step_settled(lane, "done", True)
    assert {k[0] for k in mine(scrape(), "lane", lane) if k[0].endswith("_created")} == {
        "onward_step_duration_seconds_created",
        "onward_steps_created",
    }
    was = getattr(prometheus_client.metrics, "_use_created", True)
    prometheus_client.disable_created_metrics()
    try:
        got = scrape()
    finally:
        if was:
            prometheus_client.enable_created_metrics()
    assert not [k for k in got if k[0].startswith("onward_") and k[0].endswith("_created")]
    assert got[key("onward_steps_total", lane=lane, outcome="done")] == 1.0


def test_with_counting_off_nothing_moves(counting: Callable[[str], object]) -> None:
    lane, by, outcome = fresh(), fresh(), fresh()
    metrics.step_settled(lane, "done", True)  # a series that exists already
    metrics.step_timed(lane, 0.5)
    metrics.timers_fired(by, [{"lateness_s": 1.0}])
    before = scrape()
    counting("off")
    assert metrics.enabled is False and metrics.path is None
    for which in (lane, fresh()):  # an existing series and a new one
        metrics.step_settled(which, "done", True)
        metrics.step_settled(which, "done", False)
        metrics.step_timed(which, 0.5)
        metrics.lease_lost(which)
        metrics.claimed([{"lane": which, "queue_lag_s": 0.5}])
    for b in (by, fresh()):
        metrics.timers_fired(b, [{"lateness_s": 1.0}])
        metrics.timers_fired(b, [])
    metrics.run_finished(outcome)
    metrics.run_started(True)
    metrics.run_started(False)
    metrics.rescued(3)
    metrics.published(3)
    assert scrape() == before

    counting("on")
    metrics.step_settled(lane, "done", True)
    assert scrape()[key("onward_steps_total", lane=lane, outcome="done")] == 2.0
