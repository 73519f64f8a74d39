"""Durations written by people: ``"90s"``, ``"5m"``, ``"1h30m"``, ``"2d"``, or a number of seconds."""

from __future__ import annotations

import math
import re

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
MAX_SECONDS = 100 * 365.25 * 86400.0  # beyond this PostgreSQL timestamps overflow soon
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(value: str | float | int) -> float:
    """Seconds in ``value``. Raises ``ValueError`` with the offending text when malformed."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"not a duration: {value!r} (a duration must be finite)")
        if value > MAX_SECONDS:
            raise ValueError(f"duration {value!r}s is longer than 100 years")
        if value < 0:
            raise ValueError(f"a duration cannot be negative: {value!r}")
        return float(value)
    text = value.strip().replace(" ", "")
    if not text:
        raise ValueError("empty duration")
    pos, total = 0, 0.0
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if pos != len(text):
        raise ValueError(f"not a duration: {value!r} (use e.g. 90s, 5m, 1h30m, 2d)")
    if total > MAX_SECONDS:
        raise ValueError(f"duration {value!r} is longer than 100 years")
    return total
