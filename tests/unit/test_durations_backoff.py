"""Durations written by people, and retry delays (R5): exponential backoff with full jitter,
where a provider's Retry-After wins. Pure logic, no database."""

from __future__ import annotations

import math
import random

import pytest

from onward.backoff import full_jitter, retry_delay
from onward.durations import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("  2d ", 172800.0),
        ("1w", 604800.0),
        ("250ms", 0.25),
        ("1.5h", 5400.0),
        ("1m30s500ms", 90.5),
        ("0s", 0.0),
        (0, 0.0),
        (5, 5.0),
        (2.5, 2.5),
    ],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)
    assert isinstance(parse_duration(text), float)


@pytest.mark.parametrize(
    "text",
    ["", "   ", "5 parsecs", "5", "abc", "s", "5x", "m5", "1h-5m", "-5s", "5s!", "1,5h", "5 S"],
)
def test_parse_duration_refuses_malformed_text_and_quotes_it(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    if text.strip():
        assert repr(text) in str(info.value)


@pytest.mark.parametrize("value", [-1, -0.5, True, False])
def test_parse_duration_refuses_negative_numbers_and_booleans(value: float) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_parse_duration_refuses_non_finite_numbers(value: float) -> None:
    # YAML spells these ``.nan`` / ``.inf``; PostgreSQL's make_interval() refuses them
    # ("interval out of range"), so accepting one at publish time breaks the run later.
    with pytest.raises(ValueError):
        parse_duration(value)


# -- backoff ---------------------------------------------------------------------------------
SAMPLES = 4000


@pytest.mark.parametrize(
    ("attempt", "base", "cap"),
    [(1, 1.0, 300.0), (2, 1.0, 300.0), (3, 0.5, 300.0), (6, 1.0, 20.0), (30, 1.0, 300.0)],
)
def test_full_jitter_stays_in_zero_to_ceiling(attempt: int, base: float, cap: float) -> None:
    random.seed(attempt)
    ceiling = min(cap, base * 2 ** (attempt - 1))
    delays = [full_jitter(attempt, base, cap) for _ in range(SAMPLES)]
    assert all(0.0 <= d < ceiling for d in delays), (min(delays), max(delays), ceiling)
    # full jitter spreads over the whole range: not a fixed delay, not "ceiling/2 + jitter"
    assert min(delays) < 0.02 * ceiling
    assert max(delays) > 0.98 * ceiling
    mean = sum(delays) / len(delays)
    assert mean == pytest.approx(ceiling / 2, rel=0.06)


def test_full_jitter_ceiling_grows_exponentially_until_the_cap() -> None:
    random.seed(7)
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 256.0), (10, 300.0)]:
        top = max(full_jitter(attempt, 1.0, 300.0) for _ in range(SAMPLES))
        assert 0.95 * ceiling < top < ceiling, (attempt, top, ceiling)


def test_retry_delay_uses_full_jitter_without_retry_after() -> None:
    random.seed(3)
    delays = {retry_delay(4, base=1.0, cap=300.0) for _ in range(200)}
    assert all(0.0 <= d < 8.0 for d in delays)
    assert len(delays) > 150  # spread out, not synchronised


@pytest.mark.parametrize("retry_after", [0.0, 0.5, 42.0, 3600.0])
def test_retry_after_wins_over_the_schedule(retry_after: float) -> None:
    # even beyond the cap, and even on the first attempt: the provider knows its limits
    for attempt in (1, 3, 20):
        assert retry_delay(attempt, base=1.0, cap=300.0, retry_after=retry_after) == retry_after


def test_a_negative_retry_after_is_ignored() -> None:
    random.seed(5)
    d = retry_delay(2, base=1.0, cap=300.0, retry_after=-1.0)
    assert 0.0 <= d < 2.0


def test_retries_after_an_outage_are_spread_not_synchronised() -> None:
    """1,000 steps that failed together on their 4th attempt come back spread over the whole
    jitter window [0, 8 s): roughly uniform (each eighth of the window holds 8-17 %), mean near
    half the ceiling, and no two at the same instant."""
    import random as stdlib_random
    import statistics

    rng = stdlib_random.Random(20261201)
    delays = [
        retry_delay(4, base=1.0, cap=300.0, jitter=lambda lo, hi: rng.uniform(lo, hi))
        for _ in range(1000)
    ]
    ceiling = 8.0
    assert all(0.0 <= d < ceiling for d in delays)
    assert abs(statistics.mean(delays) - ceiling / 2) < 0.35
    assert statistics.pstdev(delays) > ceiling * 0.25  # uniform on [0, 8): ~2.31
    buckets = [0] * 8
    for d in delays:
        buckets[int(d)] += 1
    assert all(80 <= b <= 170 for b in buckets), buckets
    assert len({round(d, 6) for d in delays}) == len(delays)
