"""``onward bench NAME``: benchmarks that print their figures beside the machine's own ceiling.

These machines are shared and noisy: every bench reports medians and ratios to a ceiling
measured in the same sitting, never a single absolute time. Benches never run as timed tests;
each has a ``quick`` mode that the test suite runs only to prove the command works.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100.0 * (len(ordered) - 1))))
    return ordered[k]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0
