"""What the console reads: pages of runs (filters, keyset paging), what one run's screen shows
beside its history, the parked list, an automation's versions.

The run list pages by keyset, never by offset: a page after the first is "older than the last
run shown" (``before``) or "newer than the first" (``after``), a cursor ``created_at~run_id``.
An offset of 900,000 makes PostgreSQL read and drop 900,000 rows; a keyset page reads its own
rows only, on the index whose order is the page's order (migration 0022), whatever the page.

Filters come from a query string a person can type; :meth:`Filters.parse` refuses what does not
fit with ``InvalidInput`` naming the field (the page answers 400 with it), never a 500.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from onward.db import Pool
from onward.db.sql import Queries
from onward.errors import InvalidInput
from onward.inputs import check_text

Q = Queries(__package__, "reads.sql")

STATUSES = ("active", "waiting", "parked", "completed", "failed", "cancelled", "exceeded")
#: why a run is parked: its parked step's wait kind
PARKED_REASONS = ("review", "reconnect", "budget", "circuit", "migration")
#: time ranges a person picks from, and how far back each reaches
RANGES = {"15m": 15 * 60, "1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
PAGE = 50
MAX_TEXT = 256


@dataclass(frozen=True)
class Filters:
    status: str | None = None
    automation_id: str | None = None
    version: int | None = None
    contact_id: str | None = None
    parked: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    @classmethod
    def parse(cls, query: dict[str, str]) -> Filters:
        """From a query string: ``status``, ``automation``, ``version``, ``contact``,
        ``parked`` (a wait kind: implies status parked), ``range`` (``1h``, ``24h``, ...) or
        ``since``/``until`` (ISO 8601 instants)."""

        def text(name: str) -> str | None:
            value = (query.get(name) or "").strip()
            if not value:
                return None
            if len(value) > MAX_TEXT:
                raise InvalidInput(f"{name}: at most {MAX_TEXT} characters")
            return check_text(value, name)

        status, parked = text("status"), text("parked")
        if status is not None and status not in STATUSES:
            raise InvalidInput(f"status: one of {', '.join(STATUSES)}, not {status!r}")
        if parked is not None:
            if parked not in PARKED_REASONS:
                raise InvalidInput(f"parked: one of {', '.join(PARKED_REASONS)}, not {parked!r}")
            if status not in (None, "parked"):
                raise InvalidInput("parked: a parked reason goes with status parked only")
            status = "parked"
        version = None
        if (raw := text("version")) is not None:
            if not raw.isdigit() or not 1 <= int(raw) <= 2_147_483_647:
                raise InvalidInput(f"version: a version number, not {raw!r}")
            version = int(raw)
        since, until = _instant(text("since"), "since"), _instant(text("until"), "until")
        if (span := text("range")) is not None:
            if span not in RANGES:
                raise InvalidInput(f"range: one of {', '.join(RANGES)}, not {span!r}")
            since = datetime.now(UTC) - timedelta(seconds=RANGES[span])
        if since and until and since >= until:
            raise InvalidInput("since: must be before until")
        return cls(
            status=status,
            automation_id=text("automation"),
            version=version,
            contact_id=text("contact"),
            parked=parked,
            since=since,
            until=until,
        )

    def args(self) -> dict[str, Any]:
        return asdict(self)


def _instant(value: str | None, what: str) -> datetime | None:
    if value is None:
        return None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"{what}: an ISO 8601 instant (2026-03-29T09:00:00Z)") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Cursor:
    """A position in the list: a run's ``created_at`` and id (unique together)."""

    at: datetime
    run_id: str

    def text(self) -> str:
        return f"{self.at.isoformat()}~{self.run_id}"

    @classmethod
    def parse(cls, value: str, what: str) -> Cursor:
        at, sep, run_id = value.partition("~")
        if not sep or not run_id or len(value) > 2 * MAX_TEXT:
            raise InvalidInput(f"{what}: a cursor from a page of this list")
        parsed = _instant(at, what)
        assert parsed is not None
        return cls(parsed, check_text(run_id, what))

    @classmethod
    def of(cls, row: dict[str, Any]) -> Cursor:
        return cls(row["created_at"], row["run_id"])


@dataclass(frozen=True)
class Page:
    runs: list[dict[str, Any]]
    older: Cursor | None  # the cursor of the next page back in time, if there is one
    newer: Cursor | None  # the cursor of the page before this one, if this is not the first


async def page(
    pool: Pool,
    org_id: str,
    filters: Filters,
    *,
    before: Cursor | None = None,
    after: Cursor | None = None,
    limit: int = PAGE,
) -> Page:
    """One page of runs, newest first: the first page, or the one ``before`` (older than) or
    ``after`` (newer than) a cursor. One more row than shown says whether there is more."""
    args = {**filters.args(), "org_id": org_id, "limit": limit + 1}
    async with pool.connection() as conn:
        if after is not None:
            args.update(cursor_at=after.at, cursor_id=after.run_id)
            cur = await conn.execute(Q.page_newer, args, prepare=False)
            rows = list(await cur.fetchall())
            more_newer = len(rows) > limit
            rows = rows[:limit][::-1]
            return Page(
                rows,
                older=Cursor.of(rows[-1]) if rows else None,
                newer=Cursor.of(rows[0]) if rows and more_newer else None,
            )
        cursor = before
        args.update(
            cursor_at=cursor.at if cursor else None, cursor_id=cursor.run_id if cursor else None
        )
        cur = await conn.execute(Q.page_older, args, prepare=False)
        rows = list(await cur.fetchall())
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(
        rows,
        older=Cursor.of(rows[-1]) if rows and more else None,
        newer=Cursor.of(rows[0]) if rows and before is not None else None,
    )


async def unfinished_counts(pool: Pool, org_id: str) -> dict[str, int]:
    async with pool.connection() as conn:
        rows = await (await conn.execute(Q.unfinished_counts, {"org_id": org_id})).fetchall()
    return {r["status"]: r["runs"] for r in rows}


async def run_screen(pool: Pool, org_id: str, run_id: str) -> dict[str, Any]:
    """What a run's screen shows beyond ``Engine.show``: the run's contact, cancellation and
    fork, its effects, timers and correlation keys, and the database clock."""
    args = {"org_id": org_id, "run_id": run_id}
    async with pool.connection() as conn:
        more = await (await conn.execute(Q.run_more, args)).fetchone()
        effects = await (await conn.execute(Q.effects_of_run, args)).fetchall()
        timers = await (await conn.execute(Q.timers_of_run, args)).fetchall()
        keys = await (await conn.execute(Q.correlations_of_run, args)).fetchall()
    return {"more": more or {}, "effects": effects, "timers": timers, "correlations": keys}


async def parked(
    pool: Pool, org_id: str, *, wait_kind: str | None = None, limit: int = 200
) -> dict[str, Any]:
    """Parked runs (newest first) and the effects in review, keyed by run."""
    args = {"org_id": org_id, "wait_kind": wait_kind, "limit": limit}
    async with pool.connection() as conn:
        runs = await (await conn.execute(Q.parked, args)).fetchall()
        review = await (await conn.execute(Q.in_review, args)).fetchall()
    by_run: dict[str, list[dict[str, Any]]] = {}
    for effect in review:
        by_run.setdefault(effect["run_id"], []).append(effect)
    return {"runs": runs, "review": by_run}


async def versions(pool: Pool, org_id: str, automation_id: str) -> dict[str, Any]:
    """An automation's versions, and its unfinished runs per version and status."""
    args = {"org_id": org_id, "automation_id": automation_id}
    async with pool.connection() as conn:
        rows = await (await conn.execute(Q.versions_of, args)).fetchall()
        counts = await (await conn.execute(Q.unfinished_by_version, args)).fetchall()
    unfinished: dict[int, dict[str, int]] = {}
    for c in counts:
        unfinished.setdefault(c["version"], {})[c["status"]] = c["runs"]
    return {"versions": rows, "unfinished": unfinished}


async def version(
    pool: Pool, org_id: str, automation_id: str, number: int
) -> dict[str, Any] | None:
    args = {"org_id": org_id, "automation_id": automation_id, "version": number}
    async with pool.connection() as conn:
        return await (await conn.execute(Q.version_row, args)).fetchone()
