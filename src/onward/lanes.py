"""Lanes (R5): each kind of work has its own capacity, lease and retry policy.

A lane is a name; a step kind names its lane (``@step_kind(..., lane="slow")``) and a step may
override it in its document (``lane: bulk``). Each lane has a :class:`LanePolicy`:

* ``capacity`` -- how many of its steps one worker runs at once (a lane loop claims only what
  it has free slots for: backpressure);
* ``lease_seconds`` -- the step lease its claims take (a model call may run for a minute; a
  branch takes microseconds);
* ``retry`` -- attempts and backoff (base, cap) for its steps, unless the kind or the step
  says otherwise (step > kind > lane). The slow lane retries little: every model call costs.

The four lanes are built in (:data:`DEFAULTS`). ``ONWARD_LANES`` / ``--lanes`` names the lanes
a worker serves and their capacities (``fast=64,io=16,bulk=4``: a new name adds a lane), and
``ONWARD_LANE_POLICY`` (JSON) overrides any policy field per lane; every lane it names is
checked (a misspelt one is refused), and one this worker does not serve is shown as such by
``onward lanes``::

    ONWARD_LANES=fast=64,io=32,slow=8,wait=64,bulk=4
    ONWARD_LANE_POLICY='{"slow": {"lease_seconds": 300, "max_attempts": 2}, "bulk": {"max_attempts": 1}}'
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from onward.automations.document import RetryPolicy
from onward.errors import ConfigError

LANE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


@dataclass(frozen=True)
class LanePolicy:
    capacity: int
    lease_seconds: float
    retry: RetryPolicy


DEFAULTS: dict[str, LanePolicy] = {
    "fast": LanePolicy(64, 30.0, RetryPolicy(max_attempts=5, base=0.5, cap=30.0)),
    "io": LanePolicy(32, 30.0, RetryPolicy(max_attempts=5, base=1.0, cap=300.0)),
    "slow": LanePolicy(8, 120.0, RetryPolicy(max_attempts=2, base=10.0, cap=300.0)),
    "wait": LanePolicy(64, 30.0, RetryPolicy(max_attempts=5, base=1.0, cap=300.0)),
}
#: A lane named only by its capacity (``bulk=4``) gets these.
NEW_LANE = LanePolicy(8, 30.0, RetryPolicy())

_FIELDS = {"capacity", "lease_seconds", "max_attempts", "base", "cap"}


def check_name(name: str) -> str:
    if not LANE_NAME.match(name):
        raise ConfigError(f"lane {name!r}: lower-case letters, digits and _ (at most 32)")
    return name


def policies(
    capacities: dict[str, int] | None = None,
    overrides: str | dict[str, Any] | None = None,
    *,
    lease_seconds: float | None = None,
) -> dict[str, LanePolicy]:
    """The lanes a worker serves: ``capacities`` (the default lanes when None), each with its
    default policy, the overrides (JSON or a dict) applied. ``lease_seconds``: the configured
    ``ONWARD_LEASE_SECONDS``, applied to every lane whose lease no override names when it
    differs from the default 30 s (tests shorten every lease at once)."""
    try:
        raw = (
            json.loads(overrides) if isinstance(overrides, str) and overrides.strip() else overrides
        )
    except ValueError as exc:
        raise ConfigError(f"ONWARD_LANE_POLICY: not JSON: {exc}") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError("ONWARD_LANE_POLICY: a JSON object {lane: {field: value}}")
    raw = raw or {}
    names = list(capacities) if capacities is not None else list(DEFAULTS)
    # every override is checked, served or not (a misspelt lane is refused, not dropped); the
    # lanes served are named by the capacities (ONWARD_LANES / --lanes), or all named here
    # when none are given
    checked = {name: _apply(name, DEFAULTS.get(name, NEW_LANE), raw) for name in raw}
    if capacities is None:
        names += [n for n in checked if n not in names]
    out: dict[str, LanePolicy] = {}
    for name in names:
        policy = DEFAULTS.get(name, NEW_LANE)
        if lease_seconds is not None and lease_seconds != 30.0:
            policy = replace(policy, lease_seconds=lease_seconds)
        if capacities is not None and name in capacities:
            policy = replace(policy, capacity=capacities[name])
        out[name] = _apply(name, policy, raw)
    return out


def not_served(capacities: dict[str, int], overrides: str | None) -> list[str]:
    """Lanes ONWARD_LANE_POLICY tunes that these capacities do not serve (shown by
    ``onward lanes``: a worker serving other lanes ignores them)."""
    raw = json.loads(overrides) if overrides and overrides.strip() else {}
    return sorted(n for n in raw if n not in capacities)


def _apply(name: str, policy: LanePolicy, raw: dict[str, Any]) -> LanePolicy:
    """``policy`` with the overrides ``raw`` gives for lane ``name``, checked."""
    check_name(name)
    fields = raw.get(name) or {}
    if not isinstance(fields, dict) or set(fields) - _FIELDS:
        raise ConfigError(
            f"ONWARD_LANE_POLICY: lane {name}: fields are {', '.join(sorted(_FIELDS))}"
        )
    try:
        if "capacity" in fields:
            policy = replace(policy, capacity=int(fields["capacity"]))
        if "lease_seconds" in fields:
            policy = replace(policy, lease_seconds=float(fields["lease_seconds"]))
        retry = {k: fields[k] for k in ("max_attempts", "base", "cap") if k in fields}
        if retry:
            policy = replace(
                policy, retry=RetryPolicy.model_validate({**policy.retry.model_dump(), **retry})
            )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"ONWARD_LANE_POLICY: lane {name}: {exc}") from None
    if policy.capacity < 1 or policy.lease_seconds <= 0:
        raise ConfigError(f"lane {name}: capacity at least 1, lease more than 0 seconds")
    return policy


def describe(
    capacities: dict[str, int], overrides: str | None, *, lease_seconds: float | None = None
) -> list[dict[str, Any]]:
    """The lanes served (and those ``overrides`` tunes but these capacities do not serve, with
    ``served: false``), as ``onward lanes`` and ``GET /v1/lanes`` show them."""
    served = policies(capacities, overrides, lease_seconds=lease_seconds)
    tuned = policies(None, overrides, lease_seconds=lease_seconds)
    shown = [*served.items(), *((n, tuned[n]) for n in not_served(capacities, overrides))]
    return [
        {
            "lane": name,
            "served": name in served,
            "capacity": p.capacity,
            "lease_seconds": p.lease_seconds,
            "max_attempts": p.retry.max_attempts,
            "base": p.retry.base,
            "cap": p.retry.cap,
        }
        for name, p in shown
    ]
