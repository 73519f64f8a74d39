"""The queue port. A queue only wakes workers; PostgreSQL is the record of progress.

Adapters: ``postgres`` (LISTEN/NOTIFY, the default: no extra service), ``redis`` (BullMQ
semantics: delayed jobs, job-id dedup) and ``none`` (no wake-ups at all: workers poll and the
sweep fires timers, so every run still finishes, only later).

What every adapter may do, and consumers must tolerate: lose a wake, deliver one twice, deliver
wakes out of order. Consumers treat a wake as a hint: a ``step`` wake makes the worker try a
claim in that lane (nothing claimable: nothing happens); a ``timer`` wake fires that timer if it
is still unfired (``fired_at IS NULL``). A duplicate therefore never applies a transition twice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

TOPICS = ("step", "timer")


@dataclass(frozen=True)
class Wake:
    """One wake-up. ``job_id`` follows the rules in ``onward.ids`` (attempt / wake number)."""

    job_id: str
    topic: str
    lane: str
    org_id: str
    payload: dict[str, Any] = field(default_factory=dict)
    delay_s: float = 0.0

    def to_json(self) -> str:
        # compact JSON, written by orjson in C (UTF-8 as is, not \u-escaped)
        return orjson.dumps(
            {
                "job_id": self.job_id,
                "topic": self.topic,
                "lane": self.lane,
                "org_id": self.org_id,
                "payload": self.payload,
            },
            option=orjson.OPT_NON_STR_KEYS,
        ).decode()

    @classmethod
    def from_json(cls, raw: str | bytes) -> Wake:
        data = orjson.loads(raw)
        return cls(
            job_id=data["job_id"],
            topic=data["topic"],
            lane=data["lane"],
            org_id=data["org_id"],
            payload=data.get("payload") or {},
        )


OnWake = Callable[[Wake], None]
"""Called for every wake delivered. Must not block: it only records the hint."""

OnReconnect = Callable[[], None]
"""Called after the consumer reconnected: wakes sent while it was away may be lost, so the
worker should poll every lane once."""


class Queue(ABC):
    name: str = "abstract"
    supports_delay: bool = False
    """True: the relay hands delayed wakes to the queue at once (with ``delay_s``). False: the
    relay keeps them in the outbox until due and publishes them then."""

    async def start(self) -> None:
        """Connect and check the configuration (may raise ``QueueMisconfigured``)."""

    @abstractmethod
    async def publish(self, wakes: Sequence[Wake]) -> None:
        """Publish wakes. Raises on failure: the relay then leaves the rows unsent."""

    @abstractmethod
    async def consume(
        self, lanes: Sequence[str], on_wake: OnWake, on_reconnect: OnReconnect | None = None
    ) -> None:
        """Deliver wakes for these lanes to ``on_wake`` until cancelled; reconnect on errors."""

    async def health(self) -> list[str]:
        """Problems that can lose wakes silently, found by proving delivery rather than trusting
        it (redis: reachable, ``noeviction``; postgres: listeners connected, a NOTIFY round trip
        within a bound, the NOTIFY queue not held). Empty: healthy. ``onward doctor`` shows it."""
        return []

    async def close(self) -> None:
        """Release connections."""
