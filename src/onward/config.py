"""Settings read from ``ONWARD_*`` environment variables, overridable by CLI flags.

Nothing is required for the demo: with no ``ONWARD_DATABASE_URL`` onward starts an embedded
PostgreSQL in ``ONWARD_DATA_DIR`` (default ``./.onward``), and the queue defaults to PostgreSQL
LISTEN/NOTIFY, which needs no extra service.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from onward.errors import ConfigError

QUEUES = ("postgres", "redis", "none")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not a number") from exc


def _lanes(spec: str) -> dict[str, int]:
    """``ONWARD_LANES=fast=64,io=16,bulk=4``: the lanes a worker serves and their capacity."""
    out: dict[str, int] = {}
    for part in spec.split(","):
        name, _, cap = part.strip().partition("=")
        if not cap.strip().isdigit() or int(cap) < 1:
            raise ConfigError(f"ONWARD_LANES: {part.strip()!r}: lane=capacity, a whole number >= 1")
        out[name.strip()] = int(cap)
    return out


def _retention_days(raw: str) -> float | None:
    """``ONWARD_RETENTION_DAYS``: days (at least 1), or ``forever``; unset: 30."""
    if raw.strip().lower() == "forever":
        return None
    return _env_float("ONWARD_RETENTION_DAYS", 30.0) if raw.strip() else 30.0


def _env_int(name: str, default: int) -> int:
    return int(_env_float(name, default))


def env_start_batches() -> int:
    """``ONWARD_START_BATCHES`` (``Settings.start_batches``), for the benchmarks that build
    their own settings and should measure the engine as configured."""
    return _env_int("ONWARD_START_BATCHES", 4)


def _env_port(name: str) -> int | None:
    return _env_int(name, 0) if os.environ.get(name) else None


@dataclass(frozen=True)
class Settings:
    database_url: str | None = None  # None: start the embedded PostgreSQL
    data_dir: str = ".onward"
    redis_url: str = "redis://127.0.0.1:6379/0"
    queue: str = "postgres"
    queue_prefix: str = "onward"
    redis_allow_eviction: bool = False  # downgrade the noeviction check to a loud warning
    org_id: str = "default"
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    poll_seconds: float = 2.0  # backstop poll for ready steps when no wake arrives
    sweep_seconds: float = 2.0
    #: the outbox relay (onward.outbox): rows published per transaction, and how long it
    #: sleeps when it found fewer (a transition in this process wakes it sooner). 1,000, not
    #: 200: with 2,000 timers due in one second the relay published each wake p50 ~0.3-0.7 s
    #: late at 200 and ~0.05-0.16 s at 1,000 (onward bench latency, README "Performance")
    relay_batch: int = 1000
    relay_poll_seconds: float = 0.1
    #: with the PostgreSQL queue, the relay's rounds in flight at once (onward.outbox): a timer
    #: due while a round still fires is taken by the next one. 2,000 timers due in one second,
    #: p99 lateness 164-190 ms with one round, 62-77 ms with 4 (onward bench latency, README)
    relay_rounds: int = 4
    #: a worker fires the timers whose wakes arrived (onward.worker, the Redis queue): at most
    #: this many in one statement (timers.sql fire), with at most this many statements in flight
    #: at once. With the PostgreSQL queue the relay fires them, at most this many a round.
    #: 2,000 timers due in one second over Redis, 2 workers, one sitting (2026-12-07, README):
    #: p99 lateness 78-107 ms (median of 7: 93) with 4 in flight, 98-131 ms (111) with 2,
    #: 147-165 ms with 1, 88-102 ms with 8
    timer_fire_batch: int = 500
    timer_fire_concurrency: int = 4
    #: the Redis queue's consumer (onward.queue.redis): the longest BRPOP, the delayed wakes of
    #: a lane promoted to its ready list per round trip, and the ready wakes taken in it
    redis_block_seconds: float = 0.5
    redis_promote_batch: int = 100
    redis_take_batch: int = 100
    shutdown_grace_seconds: float = 10.0
    max_payload_bytes: int = 256 * 1024
    #: concurrent ``Engine.start`` calls of one organisation are written together, one
    #: statement for every start waiting, with at most this many statements in flight at once
    #: (onward.start.StartBatcher); 0: each start its own statement (``start_run``)
    start_batches: int = 4
    default_max_steps: int = 1000
    default_max_age_seconds: float = 30 * 86400.0
    #: signs approval buttons' tokens; None: a secret the engine keeps in its database
    signing_secret: str | None = field(default=None, repr=False)
    lanes: dict[str, int] = field(
        default_factory=lambda: {"fast": 64, "io": 32, "slow": 8, "wait": 64}
    )
    #: JSON overrides of lane policies (onward.lanes): {"slow": {"max_attempts": 2}, ...}
    lane_policy: str | None = None
    #: how long a cost reservation counts without its call's charge (onward.budgets)
    budget_lease_seconds: float = 120.0
    #: finished runs are deleted this many days after they finished, unless their organisation
    #: sets its own (onward.retention); None keeps them forever (ONWARD_RETENTION_DAYS=forever)
    retention_days: float | None = 30.0
    #: intake requests (webhooks) one organisation may send per window (onward.intake.admit);
    #: 0: no limit. Over it: 429 with Retry-After
    intake_limit: int = 10_000
    intake_window_seconds: int = 10
    #: addresses user-configured HTTP may reach although not public, for every organisation
    #: (onward.outbound; ONWARD_OUTBOUND_ALLOW=127.0.0.1/32,hooks.internal:8443)
    outbound_allow: tuple[str, ...] = ()
    outbound_max_response_bytes: int = 10 * 1024 * 1024
    outbound_max_seconds: float = 30.0
    #: ``/metrics`` (the path the API serves Prometheus metrics at), another path, or ``off``
    #: (onward.metrics: no route, no counting)
    metrics: str = "/metrics"
    #: a worker-only process serves its metrics on this port (``onward worker --metrics-port``)
    metrics_port: int | None = None
    #: how often the elected sweeper measures the health gauges
    metrics_seconds: float = 15.0
    #: how long a process trusts an API key it verified and an endpoint's webhook secrets
    #: without reading them again (onward.cache); 0: read them on every request
    auth_cache_seconds: float = 1.0

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        from onward.db.embedded import default_data_dir  # late: onward.db imports this module

        s = cls(
            database_url=os.environ.get("ONWARD_DATABASE_URL") or None,
            data_dir=os.environ.get("ONWARD_DATA_DIR") or default_data_dir(),
            redis_url=os.environ.get("ONWARD_REDIS_URL", "redis://127.0.0.1:6379/0"),
            queue=os.environ.get("ONWARD_QUEUE", "postgres"),
            queue_prefix=os.environ.get("ONWARD_QUEUE_PREFIX", "onward"),
            redis_allow_eviction=os.environ.get("ONWARD_REDIS_ALLOW_EVICTION", "") in ("1", "true"),
            org_id=os.environ.get("ONWARD_ORG", "default"),
            lease_seconds=_env_float("ONWARD_LEASE_SECONDS", 30.0),
            heartbeat_seconds=_env_float("ONWARD_HEARTBEAT_SECONDS", 10.0),
            poll_seconds=_env_float("ONWARD_POLL_SECONDS", 2.0),
            sweep_seconds=_env_float("ONWARD_SWEEP_SECONDS", 2.0),
            relay_batch=_env_int("ONWARD_RELAY_BATCH", 1000),
            relay_poll_seconds=_env_float("ONWARD_RELAY_POLL_SECONDS", 0.1),
            timer_fire_batch=_env_int("ONWARD_TIMER_FIRE_BATCH", 500),
            timer_fire_concurrency=_env_int("ONWARD_TIMER_FIRE_CONCURRENCY", 4),
            relay_rounds=_env_int("ONWARD_RELAY_ROUNDS", 4),
            redis_block_seconds=_env_float("ONWARD_REDIS_BLOCK_SECONDS", 0.5),
            redis_promote_batch=_env_int("ONWARD_REDIS_PROMOTE_BATCH", 100),
            redis_take_batch=_env_int("ONWARD_REDIS_TAKE_BATCH", 100),
            shutdown_grace_seconds=_env_float("ONWARD_SHUTDOWN_GRACE_SECONDS", 10.0),
            max_payload_bytes=_env_int("ONWARD_MAX_PAYLOAD_BYTES", 256 * 1024),
            start_batches=env_start_batches(),
            signing_secret=os.environ.get("ONWARD_SIGNING_SECRET") or None,
            lane_policy=os.environ.get("ONWARD_LANE_POLICY") or None,
            budget_lease_seconds=_env_float("ONWARD_BUDGET_LEASE_SECONDS", 120.0),
            retention_days=_retention_days(os.environ.get("ONWARD_RETENTION_DAYS", "")),
            intake_limit=_env_int("ONWARD_INTAKE_LIMIT", 10_000),
            intake_window_seconds=_env_int("ONWARD_INTAKE_WINDOW_SECONDS", 10),
            outbound_allow=tuple(
                e.strip()
                for e in os.environ.get("ONWARD_OUTBOUND_ALLOW", "").split(",")
                if e.strip()
            ),
            outbound_max_response_bytes=_env_int(
                "ONWARD_OUTBOUND_MAX_RESPONSE_BYTES", 10 * 1024 * 1024
            ),
            outbound_max_seconds=_env_float("ONWARD_OUTBOUND_MAX_SECONDS", 30.0),
            metrics=os.environ.get("ONWARD_METRICS") or "/metrics",
            metrics_port=_env_port("ONWARD_METRICS_PORT"),
            metrics_seconds=_env_float("ONWARD_METRICS_SECONDS", 15.0),
            auth_cache_seconds=_env_float("ONWARD_AUTH_CACHE_SECONDS", 1.0),
        )
        if os.environ.get("ONWARD_LANES"):
            s = replace(s, lanes=_lanes(os.environ["ONWARD_LANES"]))
        s = replace(s, **{k: v for k, v in overrides.items() if v is not None})
        s.validate()
        return s

    def validate(self) -> None:
        from onward.lanes import policies  # late: onward.lanes imports the automations package

        policies(dict(self.lanes), self.lane_policy, lease_seconds=self.lease_seconds)
        from onward.vault import configured_keys  # late: onward.vault imports onward.db

        configured_keys()  # a malformed ONWARD_SECRET_KEYS stops the process at start
        if self.queue not in QUEUES:
            raise ConfigError(f"ONWARD_QUEUE={self.queue!r}: choose one of {', '.join(QUEUES)}")
        if self.retention_days is not None and not 1 <= self.retention_days <= 36_525:
            raise ConfigError(
                f"ONWARD_RETENTION_DAYS={self.retention_days:g}: between 1 and 36525 days, "
                "or forever"
            )
        if not 0 <= self.start_batches <= 64:
            raise ConfigError(
                f"ONWARD_START_BATCHES={self.start_batches}: 0 (each start alone) to 64"
            )
        if self.intake_limit < 0 or not 1 <= self.intake_window_seconds <= 3600:
            raise ConfigError(
                "ONWARD_INTAKE_LIMIT must be 0 (no limit) or more, "
                "ONWARD_INTAKE_WINDOW_SECONDS between 1 and 3600"
            )
        from onward.errors import InvalidInput
        from onward.outbound import parse_entries

        try:
            parse_entries(self.outbound_allow)
        except InvalidInput as exc:
            raise ConfigError(f"ONWARD_OUTBOUND_ALLOW: {exc}") from None
        if self.outbound_max_response_bytes < 1 or self.outbound_max_seconds <= 0:
            raise ConfigError("ONWARD_OUTBOUND_MAX_RESPONSE_BYTES and _MAX_SECONDS must be > 0")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"ONWARD_METRICS_PORT={self.metrics_port}: a port, 0 to 65535")
        if not 0 <= self.auth_cache_seconds <= 60:
            raise ConfigError("ONWARD_AUTH_CACHE_SECONDS must be between 0 and 60")
        if self.metrics_seconds <= 0:
            raise ConfigError("ONWARD_METRICS_SECONDS must be > 0")
        if self.metrics.strip().lower() not in ("off", "on") and not self.metrics.startswith("/"):
            raise ConfigError(f"ONWARD_METRICS={self.metrics!r}: a path (/metrics), on, or off")
        if min(self.relay_batch, self.redis_promote_batch, self.redis_take_batch) < 1:
            raise ConfigError(
                "ONWARD_RELAY_BATCH, ONWARD_REDIS_PROMOTE_BATCH and ONWARD_REDIS_TAKE_BATCH "
                "must be >= 1"
            )
        if min(self.timer_fire_batch, self.timer_fire_concurrency, self.relay_rounds) < 1:
            raise ConfigError(
                "ONWARD_TIMER_FIRE_BATCH, ONWARD_TIMER_FIRE_CONCURRENCY and ONWARD_RELAY_ROUNDS "
                "must be >= 1"
            )
        if not 0 < self.relay_poll_seconds <= 60 or not 0.01 <= self.redis_block_seconds <= 60:
            raise ConfigError(
                "ONWARD_RELAY_POLL_SECONDS must be > 0 and ONWARD_REDIS_BLOCK_SECONDS at least "
                "0.01, both at most 60"
            )
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ConfigError("the heartbeat interval must be shorter than the lease")
