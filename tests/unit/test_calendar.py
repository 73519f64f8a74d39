"""Human time (R6, R8), without a database: the one DST policy on both Berlin transition days
of 2026, zones with odd offsets and shifts, "next weekday" from the weekend, months without a
31st, the rule forms, and the spread."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from onward.calendar import (
    RuleError,
    UnknownZone,
    next_occurrence,
    occurrences,
    parse_rule,
    resolve,
    spread_offset,
    zone,
)

BERLIN = zone("Europe/Berlin")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_berlin_spring_gap_moves_forward_by_the_gap() -> None:
    """29 March 2026: 02:30 does not exist -> 03:30 CEST = 01:30 UTC."""
    occ = next_occurrence(parse_rule("02:30 every day"), BERLIN, utc(2026, 3, 28, 12))
    assert occ is not None
    assert occ.utc == utc(2026, 3, 29, 1, 30)
    assert occ.local.replace(tzinfo=None) == datetime(2026, 3, 29, 3, 30)
    assert occ.substitution == "gap"


def test_berlin_autumn_fold_takes_the_first_occurrence() -> None:
    """25 October 2026: 02:30 happens twice -> the first, 02:30 CEST = 00:30 UTC."""
    occ = next_occurrence(parse_rule("02:30 every day"), BERLIN, utc(2026, 10, 24, 12))
    assert occ is not None
    assert occ.utc == utc(2026, 10, 25, 0, 30)
    assert occ.substitution == "fold"


def test_a_daily_cron_fires_once_on_the_fall_back_day() -> None:
    got = occurrences(parse_rule("cron 30 2 * * *"), BERLIN, utc(2026, 10, 24, 12), 3)
    assert [o.utc for o in got] == [
        utc(2026, 10, 25, 0, 30),  # the first 02:30 only
        utc(2026, 10, 26, 1, 30),
        utc(2026, 10, 27, 1, 30),
    ]


def test_a_cron_in_the_spring_gap_uses_the_same_policy_not_cronsims() -> None:
    """cronsim alone would say 03:00; the policy says forward by the gap: 03:30."""
    occ = next_occurrence(parse_rule("cron 30 2 * * *"), BERLIN, utc(2026, 3, 28, 12))
    assert occ is not None and occ.local.replace(tzinfo=None) == datetime(2026, 3, 29, 3, 30)


def test_half_hourly_rule_never_repeats_an_instant_across_the_gap() -> None:
    got = occurrences(parse_rule("cron */30 * * * *"), BERLIN, utc(2026, 3, 29, 0, 10), 5)
    instants = [o.utc for o in got]
    assert instants == sorted(set(instants))
    assert instants[:3] == [
        utc(2026, 3, 29, 0, 30),
        utc(2026, 3, 29, 1, 0),
        utc(2026, 3, 29, 1, 30),
    ]


def test_adelaide_half_hour_offset_southern_spring() -> None:
    """Adelaide (+09:30, DST +10:30 from the first Sunday of October 2026, 02:00 -> 03:00)."""
    adelaide = zone("Australia/Adelaide")
    occ = next_occurrence(parse_rule("02:30 every day"), adelaide, utc(2026, 10, 3, 12))
    assert occ is not None
    assert occ.local.replace(tzinfo=None) == datetime(2026, 10, 4, 3, 30)
    assert occ.utc == utc(2026, 10, 3, 17, 0) and occ.substitution == "gap"
    winter = next_occurrence(parse_rule("09:00 every day"), adelaide, utc(2026, 7, 1))
    assert winter is not None and winter.utc == utc(2026, 7, 1, 23, 30)


def test_kathmandu_quarter_hour_offset() -> None:
    occ = next_occurrence(
        parse_rule("09:00 every day"), zone("Asia/Kathmandu"), utc(2026, 10, 3, 12)
    )
    assert occ is not None and occ.utc == utc(2026, 10, 4, 3, 15) and occ.substitution is None


def test_lord_howe_thirty_minute_shift() -> None:
    """Lord Howe moves its clocks by 30 minutes: 02:15 on the spring day moves to 02:45."""
    lord_howe = zone("Australia/Lord_Howe")
    occ = next_occurrence(parse_rule("02:15 every day"), lord_howe, utc(2026, 10, 3, 12))
    assert occ is not None and occ.substitution == "gap"
    assert occ.local.replace(tzinfo=None) == datetime(2026, 10, 4, 2, 45)
    back = next_occurrence(parse_rule("01:45 every day"), lord_howe, utc(2026, 4, 4, 6))
    assert back is not None and back.substitution == "fold"
    assert back.utc == utc(2026, 4, 4, 14, 45)  # the first 01:45, still at +11:00


@pytest.mark.parametrize(
    "local_reference",
    [
        datetime(2026, 11, 27, 19, 0),  # Friday evening, after 09:00
        datetime(2026, 11, 28, 12, 0),  # Saturday
        datetime(2026, 11, 29, 23, 59),  # Sunday, a minute before midnight
    ],
)
def test_next_weekday_from_friday_evening_and_the_weekend_is_monday(
    local_reference: datetime,
) -> None:
    occ = next_occurrence(
        parse_rule("09:00 on weekdays"), BERLIN, local_reference.replace(tzinfo=BERLIN)
    )
    assert occ is not None and occ.local.replace(tzinfo=None) == datetime(2026, 11, 30, 9, 0)


def test_next_weekday_on_a_weekday_morning_is_the_same_day_and_exactly_then_is_the_next() -> None:
    monday_nine = datetime(2026, 11, 30, 9, 0, tzinfo=BERLIN)
    before = next_occurrence(
        parse_rule("09:00 on weekdays"), BERLIN, monday_nine - timedelta(seconds=1)
    )
    at = next_occurrence(parse_rule("09:00 on weekdays"), BERLIN, monday_nine)
    assert before is not None and before.local == monday_nine
    assert at is not None and at.local.replace(tzinfo=None) == datetime(2026, 12, 1, 9, 0)


def test_the_31st_skips_months_without_one_and_the_last_day_does_not() -> None:
    got = occurrences(parse_rule("09:00 on day 31"), BERLIN, utc(2026, 4, 1), 3)
    assert [o.local.date().isoformat() for o in got] == ["2026-05-31", "2026-07-31", "2026-08-31"]
    last = occurrences(parse_rule("09:00 on the last day"), BERLIN, utc(2026, 4, 1), 3)
    assert [o.local.date().isoformat() for o in last] == ["2026-04-30", "2026-05-31", "2026-06-30"]


def test_first_of_the_month_rrule_and_cron_agree() -> None:
    a = occurrences(parse_rule("08:30 on day 1"), BERLIN, utc(2026, 1, 15), 4)
    b = occurrences(parse_rule("cron 30 8 1 * *"), BERLIN, utc(2026, 1, 15), 4)
    c = occurrences(
        parse_rule("RRULE:FREQ=MONTHLY;BYMONTHDAY=1;BYHOUR=8;BYMINUTE=30;BYSECOND=0"),
        BERLIN,
        utc(2026, 1, 15),
        4,
    )
    assert [o.utc for o in a] == [o.utc for o in b] == [o.utc for o in c]
    assert a[2].utc == utc(2026, 4, 1, 6, 30)  # summer time by April


def test_an_absolute_local_time_happens_once() -> None:
    rule = parse_rule("at 2026-12-24T09:00")
    occ = next_occurrence(rule, BERLIN, utc(2026, 12, 1))
    assert occ is not None and occ.utc == utc(2026, 12, 24, 8, 0)
    assert next_occurrence(rule, BERLIN, utc(2026, 12, 25)) is None


def test_named_days() -> None:
    got = occurrences(parse_rule("07:15 on mon,wed,fri"), BERLIN, utc(2026, 11, 30), 3)
    assert [o.local.strftime("%a %H:%M") for o in got] == ["Mon 07:15", "Wed 07:15", "Fri 07:15"]


@pytest.mark.parametrize(
    ("rule", "needle"),
    [
        ("", "non-empty"),
        ("soon", "is not a rule"),
        ("25:00 every day", "not a time of day"),
        ("09:00 on day 32", "1 to 31"),
        ("09:00 on funday", "unknown day"),
        ("cron 61 * * * *", "cron"),
        ("RRULE:FREQ=SOMETIMES", "RRULE"),
        ("at 2026-13-01T09:00", "local date-time"),
        ("at 2026-12-24T09:00+01:00", "without an offset"),
    ],
)
def test_bad_rules_say_what_is_wrong(rule: str, needle: str) -> None:
    with pytest.raises(RuleError, match=needle):
        parse_rule(rule)


@pytest.mark.parametrize("name", ["Mars/Olympus_Mons", "", "../../etc/passwd", "Europe/Berlin\x00"])
def test_unknown_zones_are_refused(name: str) -> None:
    with pytest.raises(UnknownZone):
        zone(name)


def test_resolve_is_plain_outside_transitions() -> None:
    occ = resolve(datetime(2026, 6, 1, 9, 0), BERLIN)
    assert occ.utc == utc(2026, 6, 1, 7, 0) and occ.substitution is None


def test_spread_is_deterministic_in_bounds_and_off_when_zero() -> None:
    offsets = [spread_offset(f"run_{i:04d}", 600) for i in range(2000)]
    assert all(0 <= o < 600 for o in offsets)
    assert offsets == [spread_offset(f"run_{i:04d}", 600) for i in range(2000)]
    assert max(offsets) - min(offsets) > 500  # spread over the window, not clustered
    assert spread_offset("run_x", 0) == 0.0
