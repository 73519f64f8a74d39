"""Lane policies (``onward.lanes``): defaults, capacities from ``--lanes``, JSON overrides, new
lanes, and refusals of what cannot be served."""

from __future__ import annotations

import pytest

from onward import lanes
from onward.errors import ConfigError


def test_the_default_lanes_and_the_slow_lane_retries_little() -> None:
    got = lanes.policies()
    assert list(got) == ["fast", "io", "slow", "wait"]
    assert got["slow"].retry.max_attempts == 2 < got["io"].retry.max_attempts
    assert got["slow"].lease_seconds > got["fast"].lease_seconds


def test_capacities_name_the_lanes_served_and_a_new_name_adds_a_lane() -> None:
    got = lanes.policies({"io": 4, "bulk": 2})
    assert list(got) == ["io", "bulk"]
    assert (got["io"].capacity, got["bulk"].capacity) == (4, 2)
    assert got["bulk"].retry == lanes.NEW_LANE.retry


def test_overrides_apply_per_lane_field() -> None:
    got = lanes.policies(
        None, '{"slow": {"lease_seconds": 300, "max_attempts": 1}, "io": {"capacity": 3}}'
    )
    assert (got["slow"].lease_seconds, got["slow"].retry.max_attempts) == (300.0, 1)
    assert got["slow"].retry.base == lanes.DEFAULTS["slow"].retry.base  # the rest kept
    assert got["io"].capacity == 3


def test_a_configured_lease_applies_to_every_lane_it_does_not_override() -> None:
    got = lanes.policies(None, '{"slow": {"lease_seconds": 9}}', lease_seconds=3.0)
    assert got["fast"].lease_seconds == got["io"].lease_seconds == 3.0
    assert got["slow"].lease_seconds == 9.0


@pytest.mark.parametrize(
    "capacities, overrides, problem",
    [
        ({"Bad-Name": 1}, None, "lower-case"),
        (None, "[1]", "JSON object"),
        (None, '{"slow": {"speed": 1}}', "fields are"),
        (None, '{"slow": {"max_attempts": 0}}', "slow"),
        (None, '{"io": {"capacity": 0}}', "capacity at least 1"),
    ],
)
def test_bad_lane_settings_are_refused(capacities, overrides, problem) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=problem):
        lanes.policies(capacities, overrides)
