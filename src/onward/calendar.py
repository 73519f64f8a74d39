"""Human time (R6, R8): calendar rules in an IANA zone, turned into UTC instants.

A rule says when, on a person's wall clock; a zone says whose wall clock. onward computes the
rule's local wall times with maintained libraries -- ``cronsim`` for cron, ``python-dateutil``
for RFC 5545 RRULEs, ``zoneinfo`` + ``tzdata`` for zones -- and turns each wall time into an
instant with **one function**, :func:`resolve`, which holds the one DST policy:

* a local time that does not exist (the clocks jump forward over it) moves forward by the
  length of the gap: Berlin, 29 March 2026, 02:30 -> 03:30 CEST (01:30 UTC);
* a local time that happens twice (the clocks fall back over it) is its first occurrence:
  Berlin, 25 October 2026, 02:30 -> 02:30 CEST (00:30 UTC).

Both are what PEP 495's ``fold=0`` means, so :func:`resolve` is ``zoneinfo`` itself, plus a
note of which substitution happened. The libraries' own DST handling is never used: rules are
evaluated on naive wall times (each wall time once), and every one goes through :func:`resolve`.

Rules (:func:`parse_rule`), as one string:

* ``09:00 on weekdays`` / ``09:00 every day`` / ``18:30 on weekends`` / ``07:15 on mon,wed,fri``
  / ``08:30 on day 1`` (``on day 1,15``) / ``17:00 on the last day`` -- written as RRULEs;
* ``cron 30 8 1 * *`` -- five cron fields (``cronsim``: a daily 01:30 fires once on a fall-back
  day);
* ``RRULE:FREQ=MONTHLY;BYMONTHDAY=-1;BYHOUR=17;BYMINUTE=0`` (or ``FREQ=...``), optionally after a
  ``DTSTART:YYYYMMDDTHHMMSS`` line; without one, intervals count from the start of the
  reference day (of its hour for MINUTELY and SECONDLY rules). ``BYMONTHDAY=31`` skips
  months that have no 31st (RFC 5545); ``-1`` is the
  last day;
* ``at 2026-12-24T09:00`` -- one local date-time.

The Monday 09:00 spread (R8): :func:`spread_offset` is a deterministic offset in
``[0, spread)`` from a key (the run id), so recomputing a timer lands on the same offset.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from dateutil.rrule import rrule, rrulestr

#: The largest distance a wall time can move under the DST policy (no zone's gap is longer):
#: candidates this far before the reference are still considered, and the search stops this
#: far after the first hit.
MAX_SHIFT = timedelta(hours=3)
#: A rule that yields no occurrence after this many candidates is refused as never matching.
MAX_CANDIDATES = 100_000

_DAYS = {"mon": "MO", "tue": "TU", "wed": "WE", "thu": "TH", "fri": "FR", "sat": "SA", "sun": "SU"}
_FINE_FREQ = re.compile(r"FREQ=(SECONDLY|MINUTELY)", re.IGNORECASE)
_SUGAR = re.compile(
    r"^(?P<h>\d{1,2}):(?P<m>\d{2})(?::(?P<s>\d{2}))?\s+"
    r"(?P<when>every day|daily|on weekdays|on weekends|on the last day|on day [\d,\s]+|"
    r"on [a-z,\s]+)$"
)


class RuleError(ValueError):
    """A rule or zone that cannot be used; the message says what is wrong."""


class UnknownZone(RuleError):
    """Not an IANA time zone this process knows (``zoneinfo`` + ``tzdata``)."""


@dataclass(frozen=True)
class Rule:
    """A parsed rule: ``source`` as written, ``kind`` (``rrule``, ``cron`` or ``at``) and
    ``spec``, what the library is given."""

    source: str
    kind: str
    spec: str

    def walls(self, start: datetime) -> Iterator[datetime]:
        """Naive local wall times strictly after the naive ``start``, ascending."""
        if self.kind == "at":
            at = datetime.fromisoformat(self.spec)
            if at > start:
                yield at
            return
        if self.kind == "cron":
            yield from CronSim(self.spec, start)
            return
        # Without a DTSTART, intervals count from the start of the reference day -- or of its
        # hour for rules finer than hourly, which dateutil would otherwise walk from midnight.
        fine = _FINE_FREQ.search(self.spec) is not None
        anchor = start.replace(minute=0, second=0, microsecond=0)
        rule = _rrule(self.spec, anchor if fine else anchor.replace(hour=0))
        yield from rule.xafter(start, inc=False)  # one pass: each wall time computed once


@dataclass(frozen=True)
class Occurrence:
    """One occurrence: the wall time the rule asked for, the instant it is (UTC), the local
    time it is there (``local``: differs from ``wall`` in a gap), and what the DST policy did
    (``substitution``: None, ``gap`` or ``fold``)."""

    wall: datetime
    utc: datetime
    local: datetime
    substitution: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "wall": self.wall.isoformat(),
            "local": self.local.isoformat(),
            "utc": self.utc.isoformat(),
            "substitution": self.substitution,
        }


def zone(name: str) -> ZoneInfo:
    """The IANA zone called ``name``; ``UnknownZone`` if there is none."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise UnknownZone(f"unknown time zone {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise UnknownZone(
            f"unknown time zone {name!r} (an IANA name such as Europe/Berlin)"
        ) from None


def resolve(wall: datetime, tz: ZoneInfo) -> Occurrence:
    """THE DST policy: the instant of a naive local ``wall`` time in ``tz``. A wall time in a
    gap moves forward by the gap's length; a wall time that happens twice is the first."""
    first = wall.replace(tzinfo=tz, fold=0)
    utc = first.astimezone(UTC)
    local = utc.astimezone(tz)
    if local.replace(tzinfo=None) != wall:
        substitution: str | None = "gap"
    elif wall.replace(tzinfo=tz, fold=1).utcoffset() != first.utcoffset():
        substitution = "fold"
    else:
        substitution = None
    return Occurrence(wall, utc, local, substitution)


@lru_cache(maxsize=1024)
def parse_rule(source: str) -> Rule:
    """Parse a rule (the forms are in the module docstring); ``RuleError`` says what is wrong."""
    if not isinstance(source, str) or not source.strip():
        raise RuleError("a rule is a non-empty string, e.g. '09:00 on weekdays'")
    text = " ".join(source.strip().split()) if "\n" not in source else source.strip()
    lowered = text.lower()
    if lowered.startswith("cron "):
        spec = text[5:].strip()
        try:
            CronSim(spec, datetime(2026, 1, 1))
        except CronSimError as exc:
            raise RuleError(f"cron {spec!r}: {exc}") from None
        return Rule(source, "cron", spec)
    if lowered.startswith("at "):
        try:
            at = datetime.fromisoformat(text[3:].strip())
        except ValueError:
            raise RuleError(
                f"{source!r}: 'at' takes a local date-time, e.g. at 2026-12-24T09:00"
            ) from None
        if at.tzinfo is not None:
            raise RuleError(
                f"{source!r}: give the local time without an offset; the zone says where"
            )
        return Rule(source, "at", at.isoformat())
    if lowered.startswith(("rrule:", "freq=", "dtstart")):
        _rrule(text, datetime(2026, 1, 1))  # raises RuleError
        return Rule(source, "rrule", text)
    match = _SUGAR.match(lowered)
    if match is None:
        raise RuleError(
            f"{source!r} is not a rule: use e.g. '09:00 on weekdays', '08:30 on day 1', "
            "'cron 30 8 * * 1-5', 'RRULE:FREQ=WEEKLY;BYDAY=MO;BYHOUR=9;BYMINUTE=0' or "
            "'at 2026-12-24T09:00'"
        )
    return Rule(source, "rrule", _sugar_rrule(source, match))


def _sugar_rrule(source: str, m: re.Match[str]) -> str:
    hour, minute, second = int(m["h"]), int(m["m"]), int(m["s"] or 0)
    if hour > 23 or minute > 59 or second > 59:
        raise RuleError(f"{source!r}: {m['h']}:{m['m']} is not a time of day")
    at = f"BYHOUR={hour};BYMINUTE={minute};BYSECOND={second}"
    when = m["when"]
    if when in ("every day", "daily"):
        return f"FREQ=DAILY;{at}"
    if when == "on weekdays":
        return f"FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;{at}"
    if when == "on weekends":
        return f"FREQ=WEEKLY;BYDAY=SA,SU;{at}"
    if when == "on the last day":
        return f"FREQ=MONTHLY;BYMONTHDAY=-1;{at}"
    if when.startswith("on day "):
        days = [d for d in re.split(r"[,\s]+", when[7:]) if d]
        if not days or any(not d.isdigit() or not 1 <= int(d) <= 31 for d in days):
            raise RuleError(f"{source!r}: days of the month are 1 to 31")
        return f"FREQ=MONTHLY;BYMONTHDAY={','.join(str(int(d)) for d in days)};{at}"
    names = [d for d in re.split(r"[,\s]+", when[3:]) if d]
    unknown = [d for d in names if d[:3] not in _DAYS]
    if not names or unknown:
        raise RuleError(f"{source!r}: unknown day(s) {unknown or names}; use mon, tue, ... sun")
    return f"FREQ=WEEKLY;BYDAY={','.join(dict.fromkeys(_DAYS[d[:3]] for d in names))};{at}"


def _rrule(spec: str, dtstart: datetime) -> rrule:
    try:
        parsed = rrulestr(spec, dtstart=dtstart, forceset=False, ignoretz=True)
    except (ValueError, TypeError) as exc:
        raise RuleError(f"RRULE {spec!r}: {exc}") from None
    if not isinstance(parsed, rrule):
        raise RuleError(f"RRULE {spec!r}: give one RRULE (no RDATE/EXRULE sets)")
    return parsed


def next_occurrence(rule: Rule, tz: ZoneInfo, after: datetime) -> Occurrence | None:
    """The first occurrence strictly after the instant ``after`` (aware), or None if the rule
    has none (an ``at`` in the past, an RRULE past its UNTIL/COUNT)."""
    if after.tzinfo is None:
        raise ValueError("after must be an aware datetime")
    after_utc = after.astimezone(UTC)
    start = after_utc.astimezone(tz).replace(tzinfo=None)
    # Wall times map to instants in order, except in a gap, which moves a wall time forward
    # past real ones. So: a wall time before the reference can resolve after it only across a
    # transition -- look back MAX_SHIFT only when the zone changes its offset in that window;
    # and a later wall time can resolve earlier than the best only while the best is a moved
    # one -- look ahead only up to where it was moved to.
    if (after_utc - MAX_SHIFT).astimezone(tz).utcoffset() != after_utc.astimezone(tz).utcoffset():
        start -= MAX_SHIFT
    best: Occurrence | None = None
    for n, wall in enumerate(rule.walls(start)):
        if best is not None and (
            best.substitution != "gap" or wall > best.local.replace(tzinfo=None)
        ):
            break
        if n >= MAX_CANDIDATES:
            raise RuleError(f"{rule.source!r} found no occurrence in {MAX_CANDIDATES} candidates")
        occ = resolve(wall, tz)
        if occ.utc > after_utc and (best is None or occ.utc < best.utc):
            best = occ
    return best


def occurrences(rule: Rule, tz: ZoneInfo, after: datetime, count: int) -> list[Occurrence]:
    """The next ``count`` occurrences after ``after``, in order (what ``timers preview`` shows)."""
    out: list[Occurrence] = []
    cursor = after
    while len(out) < count:
        occ = next_occurrence(rule, tz, cursor)
        if occ is None:
            break
        out.append(occ)
        cursor = occ.utc
    return out


def spread_offset(key: str, spread_s: float) -> float:
    """A deterministic offset in ``[0, spread_s)`` seconds, to millisecond precision: the same
    key (a run id) always gets the same offset, so a recomputed timer keeps its place. A
    spread under a millisecond is no spread."""
    window_ms = int(spread_s * 1000) if spread_s > 0 else 0
    if window_ms <= 0:  # no spread, or one finer than the offset's millisecond resolution
        return 0.0
    digest = hashlib.sha256(key.encode()).digest()
    return (int.from_bytes(digest[:8], "big") % window_ms) / 1000


#: The spread of a calendar wait unless its step says otherwise (R8): 10 minutes.
DEFAULT_SPREAD_S = 600.0


def plan(
    rule_source: str, zone_name: str, after: datetime, *, spread_s: float, key: str
) -> tuple[datetime, dict[str, Any]] | None:
    """When a calendar wait that began at ``after`` is due, and the intent to store with it.

    The instant is the rule's next occurrence in the zone (through :func:`resolve`) plus the
    spread offset of ``key`` (the run id). The intent holds everything that made it -- rule,
    zone, the reference instant, the spread -- so :func:`plan` with the same inputs gives the
    same instant again (recomputation), and with a new zone or rule moves it. None: the rule
    has no occurrence after ``after``."""
    occ = next_occurrence(parse_rule(rule_source), zone(zone_name), after)
    if occ is None:
        return None
    offset = spread_offset(key, spread_s)
    due = occ.utc + timedelta(seconds=offset)
    intent = {
        "rule": rule_source,
        "zone": zone_name,
        "after": after.astimezone(UTC).isoformat(),
        **occ.as_dict(),
        "spread_s": spread_s,
        "offset_s": offset,
        "due_at": due.isoformat(),
    }
    return due, intent


def preview(
    rule_source: str,
    zone_name: str,
    after: datetime,
    count: int,
    *,
    spread_s: float = 0.0,
    key: str | None = None,
) -> list[dict[str, Any]]:
    """The next ``count`` occurrences, as a person checks a schedule before publishing it:
    local and UTC, the DST substitution where one applies, and the spread -- the exact offset
    for ``key`` (a run id), or the window it falls in."""
    rule, tz = parse_rule(rule_source), zone(zone_name)
    offset = spread_offset(key, spread_s) if key is not None else None
    out = []
    for occ in occurrences(rule, tz, after, count):
        item = occ.as_dict()
        item["spread_s"] = spread_s
        if offset is not None:
            item["offset_s"] = offset
            item["due_at"] = (occ.utc + timedelta(seconds=offset)).isoformat()
        out.append(item)
    return out
