"""Retry delays: exponential backoff with full jitter; a provider's Retry-After wins."""

from __future__ import annotations

import random
from collections.abc import Callable

Jitter = Callable[[float, float], float]


def full_jitter(
    attempt: int, base: float = 1.0, cap: float = 300.0, *, jitter: Jitter = random.uniform
) -> float:
    """A delay in [0, min(cap, base * 2**(attempt-1))): spreads retries after an outage so
    the provider does not come back to a wall of synchronised requests."""
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    return jitter(0, ceiling)


def retry_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    retry_after: float | None = None,
    jitter: Jitter = random.uniform,
) -> float:
    if retry_after is not None and retry_after >= 0:
        return float(retry_after)
    return full_jitter(attempt, base, cap, jitter=jitter)
