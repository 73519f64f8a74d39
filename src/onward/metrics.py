"""Prometheus metrics (R18, B5): counters this process keeps, gauges the elected leader measures.

Every onward process (``up``, ``api``, ``worker``) exports its *own* metrics, in prometheus
-client's default registry, and Prometheus sums them over its targets (``sum by (lane)
(rate(onward_steps_total[5m]))``). Not prometheus-client's multiprocess mode: that mode merges
the files of processes forked on *one* host under a shared directory (gunicorn's workers),
while onward's processes are independent, on several machines, each its own scrape target --
and it forbids custom collectors, which both kinds below are. A process that restarts starts
its counters at zero; ``rate()`` and ``increase()`` read that as a counter reset.

* **Counters and histograms** are increments in this process's memory, at the line where the
  transition they count was written (the worker's settle, the sweep, the relay, a start): no
  statement and no round trip is added to the database's hot path. A transition counts where
  it was *written*: a run started through the API counts in the API process, its steps in the
  workers that settled them. They are plain counts -- an int in a dict keyed by the label
  values; for a histogram, a list of per-bucket counts (the bucket found by ``bisect``) and a
  sum -- read by a collector at scrape time, which hands prometheus-client the same families
  (names, help, labels, cumulative buckets, ``_sum``, ``_count``, ``_created``) its ``Counter``
  and ``Histogram`` exported, in its own text format. Not those classes: a lock per increment
  and a loop over the buckets per observation made a step's two increments 1.75-1.84 us,
  now 0.43-0.44 us (README, "Counts, not prometheus-client's classes").
* **Health gauges** (the R16/R18 checks of ``onward doctor``: timers overdue, the oldest ready
  step per lane, effects claimed but not settled, runs with no way forward, open circuits, the
  relay's backlog) are measured by the elected sweeper every ``ONWARD_METRICS_SECONDS``, with
  the same queries as the doctor (``doctor.measurements``), and exported only by that process:
  a scrape reads the last measurement, never the database. ``onward_health_measured_timestamp
  _seconds`` says when; a process that loses the election stops exporting them.

``ONWARD_METRICS=off`` turns every increment into a return and removes ``/metrics``;
``ONWARD_METRICS=/path`` serves it elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from bisect import bisect_left
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import prometheus_client.metrics
from prometheus_client import REGISTRY, Gauge, make_asgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from onward.errors import ConfigError

if TYPE_CHECKING:
    from onward.db import Pool

log = logging.getLogger("onward.metrics")

#: False: ``ONWARD_METRICS=off`` (every increment returns at once)
enabled = True
#: where the API serves the metrics; None: nowhere (``ONWARD_METRICS=off``)
path: str | None = "/metrics"


def configure(setting: str) -> str | None:
    """Apply ``ONWARD_METRICS`` (read at import; the CLI applies its settings again): ``off``
    switches counting off and serves nothing; a path moves ``/metrics``; ``on``: ``/metrics``.
    Returns the path served, or None."""
    global enabled, path
    value = setting.strip()
    enabled = value.lower() not in ("off", "0", "false", "no")
    path = (value if value.startswith("/") else "/metrics") if enabled else None
    return path


configure(os.environ.get("ONWARD_METRICS") or "/metrics")


# -- what this process counts -----------------------------------------------------------------
#
# Plain counts (the module's docstring says why), made metric families by ``_Counts``, a
# collector in the default registry, when a scrape asks.
#
# Threads: no lock, on purpose (the hot path). Every increment runs on the process's event
# loop, one thread, and so does a scrape (the API's route; ``serving``'s uvicorn, in that
# loop): they never interleave. A scrape from another thread (a test, prometheus-client's own
# server) copies each dict and list before reading it (one C call under the GIL: no dict
# changes size while it is read) and may see an observation's bucket counted before its sum;
# only a program counting from several threads at once could lose an increment to a ``+=``
# race -- onward does not.

#: label values (``()`` for a counter without labels)
Key = tuple[str, ...]


def _use_created() -> bool:
    """Whether prometheus-client exports ``_created`` samples (it does unless switched off by
    ``PROMETHEUS_DISABLE_CREATED_SERIES`` or ``disable_created_metrics()``): as its own
    counters and histograms did, these follow that switch."""
    return bool(getattr(prometheus_client.metrics, "_use_created", True))


class _Counter:
    """A counter's counts by label values, and when each was first counted (its ``_created``,
    as prometheus-client's ``labels()`` made a child at first use). One without labels counts
    from import, so it is exported (at 0) from the start, as prometheus-client's was."""

    def __init__(self, name: str, documentation: str, labels: Iterable[str] = ()) -> None:
        self.name, self.documentation, self.labels = name, documentation, tuple(labels)
        self.counts: dict[Key, float] = {}
        self.created: dict[Key, float] = {}
        if not self.labels:
            self.inc((), 0)

    def inc(self, key: Key, n: float = 1) -> None:
        try:
            self.counts[key] += n
        except KeyError:  # its first count: the child prometheus-client's labels() would make
            self.created[key] = time.time()
            self.counts[key] = n

    def family(self, created: bool) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        stamps = self.created
        for key, n in list(self.counts.items()):
            family.add_metric(key, float(n), stamps[key] if created else None)
        return family


class _Histogram:
    """A histogram's counts by label values: per child, one count per bucket (not cumulative;
    the last bucket is +Inf) then the sum of the observations. An observation goes to the first
    bucket whose upper bound is not below it (``bisect_left``), as prometheus-client's did."""

    def __init__(
        self, name: str, documentation: str, labels: Iterable[str], buckets: Iterable[float]
    ) -> None:
        self.name, self.documentation, self.labels = name, documentation, tuple(labels)
        self.bounds = tuple(float(b) for b in buckets)  # the finite upper bounds, ascending
        if list(self.bounds) != sorted(self.bounds) or math.inf in self.bounds:
            raise ValueError(f"{name}: finite buckets, ascending (+Inf is implicit)")
        self.les = [floatToGoString(b) for b in (*self.bounds, math.inf)]
        self.children: dict[Key, list[float]] = {}
        self.created: dict[Key, float] = {}

    def child(self, key: Key) -> list[float]:
        """``key``'s counts, made at its first use (as prometheus-client's ``labels()``)."""
        counts = self.children.get(key)
        if counts is None:
            self.created[key] = time.time()
            counts = self.children[key] = [0] * (len(self.bounds) + 1) + [0.0]
        return counts

    def observe(self, key: Key, value: float) -> None:
        try:
            counts = self.children[key]
        except KeyError:
            counts = self.child(key)
        counts[bisect_left(self.bounds, value)] += 1
        counts[-1] += value

    def family(self, created: bool) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, child in list(self.children.items()):
            counts = list(child)  # one copy: the buckets, the count and the sum of one moment
            cumulative, acc = [], 0.0
            for le, n in zip(self.les, counts, strict=False):  # the sum, last, is left over
                acc += n
                cumulative.append((le, acc))
            family.add_metric(key, cumulative, float(counts[-1]))
            if created:  # after _count and _sum, as prometheus-client's Histogram puts it
                family.samples.append(
                    Sample(
                        f"{self.name}_created",
                        dict(zip(self.labels, key, strict=True)),
                        self.created[key],
                    )
                )
        return family


class _Counts(Collector):
    """The counters and histograms above as metric families, built at each scrape."""

    def __init__(self, metrics: Iterable[_Counter | _Histogram]) -> None:
        self.metrics = tuple(metrics)

    def describe(self) -> Iterator[Metric]:
        """Their names, without samples: what the registry checks for duplicates."""
        for m in self.metrics:
            yield (CounterMetricFamily if isinstance(m, _Counter) else HistogramMetricFamily)(
                m.name, m.documentation, labels=m.labels
            )

    def collect(self) -> Iterator[Metric]:
        created = _use_created()
        for m in self.metrics:
            yield m.family(created)


RUNS_STARTED = _Counter(
    "onward_runs_started", "Runs this process started (a new run; a duplicate start is not one)"
)
STARTS_DUPLICATE = _Counter(
    "onward_run_starts_duplicate", "Starts acknowledged as duplicates of a run already started"
)
RUNS_FINISHED = _Counter(
    "onward_runs_finished",
    "Runs that ended, by outcome, counted by the process whose transition ended them",
    ["outcome"],
)
STEPS = _Counter(
    "onward_steps",
    "Step transitions this process's worker wrote, by lane and outcome "
    "(done, skipped, waiting, retried, deferred, failed, cancelled, parked)",
    ["lane", "outcome"],
)
SETTLES_REFUSED = _Counter(
    "onward_settles_refused",
    "Settles the fence refused: the attempt was stale (its lease had been taken over)",
    ["lane"],
)
LEASES_LOST = _Counter(
    "onward_leases_lost",
    "Steps whose heartbeat found the lease taken over; the handler was stopped, nothing written",
    ["lane"],
)
LEASES_RESCUED = _Counter(
    "onward_leases_rescued", "Steps whose lease lapsed, made ready again by the sweep"
)
TIMERS_FIRED = _Counter(
    "onward_timers_fired", "Timers fired, by what fired them (wake or sweep)", ["by"]
)
OUTBOX_PUBLISHED = _Counter("onward_outbox_published", "Outbox rows the relay published as wakes")
STEP_SECONDS = _Histogram(
    "onward_step_duration_seconds",
    "From a step's claim to its transition written, by lane",
    ["lane"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
TIMER_LATENESS = _Histogram(
    "onward_timer_lateness_seconds",
    "Timer lateness: fired_at - due_at by the database clock, by what fired it",
    ["by"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600),
)
QUEUE_LAG = _Histogram(
    "onward_queue_lag_seconds",
    "From a step becoming ready to its claim, by the database clock, by lane "
    "(steps continued eagerly by the worker that settled the step before never queue)",
    ["lane"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
COUNTS = _Counts(
    (
        RUNS_STARTED,
        STARTS_DUPLICATE,
        RUNS_FINISHED,
        STEPS,
        SETTLES_REFUSED,
        LEASES_LOST,
        LEASES_RESCUED,
        TIMERS_FIRED,
        OUTBOX_PUBLISHED,
        STEP_SECONDS,
        TIMER_LATENESS,
        QUEUE_LAG,
    )
)
REGISTRY.register(COUNTS)  # before LEADER: the families in the order they were exported
LEADER = Gauge("onward_sweeper_leader", "1 while this process is the elected sweeper")


def run_started(created: bool) -> None:
    if enabled:
        (RUNS_STARTED if created else STARTS_DUPLICATE).inc(())


def run_finished(outcome: str, n: int = 1) -> None:
    if enabled and n:
        RUNS_FINISHED.inc((outcome,), n)


def step_settled(lane: str, outcome: str, ok: bool) -> None:
    """A transition the worker wrote (``ok``) or the fence refused (a stale attempt)."""
    if not enabled:
        return
    if ok:
        STEPS.inc((lane, outcome))
    else:
        SETTLES_REFUSED.inc((lane,))


def step_timed(lane: str, seconds: float) -> None:
    if enabled:
        STEP_SECONDS.observe((lane,), seconds)


def lease_lost(lane: str) -> None:
    if enabled:
        LEASES_LOST.inc((lane,))


def claimed(rows: Iterable[dict[str, Any]]) -> None:
    if enabled:
        observe = QUEUE_LAG.observe
        for row in rows:
            observe((row["lane"],), max(row.get("queue_lag_s") or 0.0, 0.0))


def timers_fired(by: str, fired: Iterable[dict[str, Any]]) -> None:
    if not enabled:
        return
    key = (by,)
    TIMER_LATENESS.child(key)  # made even when nothing fired (exported at 0), as it was
    n = 0
    for f in fired:
        TIMER_LATENESS.observe(key, max(f["lateness_s"] or 0.0, 0.0))
        n += 1
    TIMERS_FIRED.inc(key, n)


def rescued(n: int) -> None:
    if enabled:
        LEASES_RESCUED.inc((), n)


def published(n: int) -> None:
    if enabled:
        OUTBOX_PUBLISHED.inc((), n)


# -- what the leader measures ----------------------------------------------------------------

#: gauge name -> (key in ``doctor.measurements``, help)
_HEALTH = {
    "onward_runs_without_way_forward": (
        "runs_without_way_forward",
        "Unfinished runs with no durable way forward (healthy: 0; doctor's first check)",
    ),
    "onward_timers_overdue": ("overdue_timers", "Timers due longer than the grace, unfired"),
    "onward_timers_overdue_oldest_seconds": (
        "overdue_timers_oldest_s",
        "How long the oldest overdue timer has been due",
    ),
    "onward_outbox_stale": ("stale_outbox", "Wakes due longer than the grace, unpublished"),
    "onward_outbox_backlog": ("outbox_backlog", "Wakes due now that the relay has not published"),
    "onward_leases_expired": (
        "expired_leases",
        "Running steps whose lease lapsed longer than the grace ago, unrescued",
    ),
    "onward_steps_two_unfinished": (
        "two_unfinished_steps",
        "Running steps beside another unfinished step of their run (healthy: 0; an engine fault)",
    ),
    "onward_effects_unsettled": (
        "unsettled_effects",
        "Effects claimed but neither settled nor parked for review for longer than the grace",
    ),
    "onward_effects_in_review": (
        "effects_in_review",
        "Effects parked for a person to resolve (their outcome cannot be known)",
    ),
    "onward_signals_unrouted": ("unrouted_signals", "Signals no run could be routed to"),
    "onward_notifications_undelivered": (
        "undelivered_notifications",
        "Notifications undelivered longer than the grace",
    ),
}
_LANES = {
    "onward_lane_ready": ("ready", "Steps ready to claim now, by lane"),
    "onward_lane_oldest_ready_seconds": (
        "oldest_ready_s",
        "Age of the oldest step ready to claim, by lane",
    ),
    "onward_lane_running": ("running", "Steps running (claimed) in every worker, by lane"),
}


class HealthCollector(Collector):
    """Exports the leader's last measurement (nothing before one, nothing once it lost the
    election). A scrape builds the families from one snapshot, replaced whole by the leader."""

    def __init__(self) -> None:
        self.snapshot: tuple[float, dict[str, Any]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self.snapshot
        if snap is None:
            return
        at, m = snap
        yield GaugeMetricFamily(
            "onward_health_measured_timestamp_seconds",
            "When the elected sweeper last measured the health gauges (Unix time)",
            value=at,
        )
        for name, (key, text) in _HEALTH.items():
            yield GaugeMetricFamily(name, text, value=float(m[key]))
        oldest = m["outbox_backlog_oldest"]
        yield GaugeMetricFamily(
            "onward_outbox_backlog_oldest_timestamp_seconds",
            "deliver_at of the oldest unpublished due wake (Unix time; 0: none)",
            value=oldest.timestamp() if oldest is not None else 0.0,
        )
        for name, (key, text) in _LANES.items():
            family = GaugeMetricFamily(name, text, labels=["lane"])
            for row in m["lanes"]:
                family.add_metric([row["lane"]], float(row[key]))
            yield family
        parked = GaugeMetricFamily(
            "onward_lane_parked",
            "Steps parked on a circuit or a budget, by lane",
            labels=["lane", "on"],
        )
        for row in m["lanes"]:
            parked.add_metric([row["lane"], "circuit"], float(row["parked_circuit"]))
            parked.add_metric([row["lane"], "budget"], float(row["parked_budget"]))
        yield parked
        circuits = GaugeMetricFamily(
            "onward_circuits_not_closed",
            "Circuits open or half-open in any organisation, by state",
            labels=["state"],
        )
        states: dict[str, int] = {"open": 0, "half_open": 0}
        for row in m["circuits"]:
            states[row["state"]] = states.get(row["state"], 0) + 1
        for state, n in sorted(states.items()):
            circuits.add_metric([state], float(n))
        yield circuits


HEALTH = HealthCollector()
REGISTRY.register(HEALTH)


class HealthGauges:
    """The leader's side: measure every ``interval`` seconds, in a task of its own so a slow
    measurement never delays the sweep's next tick."""

    def __init__(self, pool: Pool, *, interval: float = 15.0, grace: float = 300.0) -> None:
        self.pool, self.interval, self.grace = pool, interval, grace
        self._task: asyncio.Task[None] | None = None
        self._next = 0.0
        self.measured = 0

    def leading(self, leads: bool) -> None:
        """Called after every election attempt: measure when due; forget when not leading."""
        if enabled:
            LEADER.set(1 if leads else 0)
        if not leads:
            HEALTH.snapshot = None
            self._next = 0.0
            return
        if not enabled or time.monotonic() < self._next:
            return
        if self._task is None or self._task.done():
            self._next = time.monotonic() + self.interval
            self._task = asyncio.create_task(self.measure())

    async def measure(self) -> None:
        from onward import doctor  # late: the doctor's imports are not a worker's

        try:
            async with self.pool.connection() as conn:
                m = await doctor.measurements(conn, grace=self.grace)
        except Exception as exc:  # the gauges go stale (their timestamp shows it), never the sweep
            log.warning("measuring the health gauges failed (%s); next interval", exc)
            return
        HEALTH.snapshot = (time.time(), m)
        self.measured += 1

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        HEALTH.snapshot = None
        if enabled:
            LEADER.set(0)


@contextlib.asynccontextmanager
async def serving(port: int | None, host: str = "127.0.0.1") -> AsyncIterator[int | None]:
    """Serve this process's metrics on ``host:port`` (``onward worker --metrics-port``; 0: a
    free port) while the block runs; yields the port, or None when ``port`` is None or metrics
    are off. prometheus-client's ASGI app under uvicorn *in this event loop*: a scrape renders
    in about a millisecond between two steps, with no thread of its own contending with the
    worker's loop for the GIL (prometheus-client's threaded server would)."""
    if port is None or not enabled:
        yield None
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"metrics: cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    sock.setblocking(False)
    import uvicorn  # here: a process that serves no metrics port never loads it

    class _Server(uvicorn.Server):
        """uvicorn without its own signal handling: the host process owns the signals."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    config = uvicorn.Config(
        make_asgi_app(REGISTRY),
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
        server_header=False,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sock.close()


__all__ = [
    "HEALTH",
    "HealthGauges",
    "claimed",
    "configure",
    "lease_lost",
    "published",
    "rescued",
    "run_finished",
    "run_started",
    "serving",
    "step_settled",
    "step_timed",
    "timers_fired",
]
