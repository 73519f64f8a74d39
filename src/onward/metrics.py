"""Prometheus metrics (R18, B5): counters this process keeps, gauges the elected leader measures.

Every onward process (``up``, ``api``, ``worker``) exports its *own* metrics, in prometheus
-client's default registry, and Prometheus sums them over its targets (``sum by (lane)
(rate(onward_steps_total[5m]))``). Not prometheus-client's multiprocess mode: that mode merges
the files of processes forked on *one* host under a shared directory (gunicorn's workers),
while onward's processes are independent, on several machines, each its own scrape target --
and it forbids the custom collector the leader's gauges are (below). A process that restarts
starts its counters at zero; ``rate()`` and ``increase()`` read that as a counter reset.

* **Counters and histograms** are increments in this process's memory, at the line where the
  transition they count was written (the worker's settle, the sweep, the relay, a start): no
  statement and no round trip is added to the database's hot path. A transition counts where
  it was *written*: a run started through the API counts in the API process, its steps in the
  workers that settled them.
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
import os
import socket
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, make_asgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

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

RUNS_STARTED = Counter(
    "onward_runs_started", "Runs this process started (a new run; a duplicate start is not one)"
)
STARTS_DUPLICATE = Counter(
    "onward_run_starts_duplicate", "Starts acknowledged as duplicates of a run already started"
)
RUNS_FINISHED = Counter(
    "onward_runs_finished",
    "Runs that ended, by outcome, counted by the process whose transition ended them",
    ["outcome"],
)
STEPS = Counter(
    "onward_steps",
    "Step transitions this process's worker wrote, by lane and outcome "
    "(done, skipped, waiting, retried, deferred, failed, cancelled, parked)",
    ["lane", "outcome"],
)
SETTLES_REFUSED = Counter(
    "onward_settles_refused",
    "Settles the fence refused: the attempt was stale (its lease had been taken over)",
    ["lane"],
)
LEASES_LOST = Counter(
    "onward_leases_lost",
    "Steps whose heartbeat found the lease taken over; the handler was stopped, nothing written",
    ["lane"],
)
LEASES_RESCUED = Counter(
    "onward_leases_rescued", "Steps whose lease lapsed, made ready again by the sweep"
)
TIMERS_FIRED = Counter(
    "onward_timers_fired", "Timers fired, by what fired them (wake or sweep)", ["by"]
)
OUTBOX_PUBLISHED = Counter("onward_outbox_published", "Outbox rows the relay published as wakes")
STEP_SECONDS = Histogram(
    "onward_step_duration_seconds",
    "From a step's claim to its transition written, by lane",
    ["lane"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
TIMER_LATENESS = Histogram(
    "onward_timer_lateness_seconds",
    "Timer lateness: fired_at - due_at by the database clock, by what fired it",
    ["by"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600),
)
QUEUE_LAG = Histogram(
    "onward_queue_lag_seconds",
    "From a step becoming ready to its claim, by the database clock, by lane "
    "(steps continued eagerly by the worker that settled the step before never queue)",
    ["lane"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
LEADER = Gauge("onward_sweeper_leader", "1 while this process is the elected sweeper")


def run_started(created: bool) -> None:
    if enabled:
        (RUNS_STARTED if created else STARTS_DUPLICATE).inc()


def run_finished(outcome: str, n: int = 1) -> None:
    if enabled and n:
        _child(RUNS_FINISHED, outcome).inc(n)


_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, remembered: the worker's per-step increments skip the
    label lookup and its lock."""
    key = (metric, *labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


def step_settled(lane: str, outcome: str, ok: bool) -> None:
    """A transition the worker wrote (``ok``) or the fence refused (a stale attempt)."""
    if not enabled:
        return
    if ok:
        _child(STEPS, lane, outcome).inc()
    else:
        _child(SETTLES_REFUSED, lane).inc()


def step_timed(lane: str, seconds: float) -> None:
    if enabled:
        _child(STEP_SECONDS, lane).observe(seconds)


def lease_lost(lane: str) -> None:
    if enabled:
        LEASES_LOST.labels(lane).inc()


def claimed(rows: Iterable[dict[str, Any]]) -> None:
    if enabled:
        for row in rows:
            _child(QUEUE_LAG, row["lane"]).observe(max(row.get("queue_lag_s") or 0.0, 0.0))


def timers_fired(by: str, fired: Iterable[dict[str, Any]]) -> None:
    if not enabled:
        return
    lateness = TIMER_LATENESS.labels(by)
    n = 0
    for f in fired:
        lateness.observe(max(f["lateness_s"] or 0.0, 0.0))
        n += 1
    TIMERS_FIRED.labels(by).inc(n)


def rescued(n: int) -> None:
    if enabled:
        LEASES_RESCUED.inc(n)


def published(n: int) -> None:
    if enabled:
        OUTBOX_PUBLISHED.inc(n)


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
