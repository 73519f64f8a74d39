"""``onward doctor``: the silent-failure checks (R16).

Crashes raise errors; the dangerous failures don't. These checks look for absence instead: a
run with no durable way forward, timers nobody fired, wakes nobody published, leases nobody
rescued, effects nobody settled, no elected sweeper, and a queue that may lose wakes without
an error (a Redis that may evict them; a PostgreSQL LISTEN/NOTIFY channel whose round trip
does not come back, see ``onward.queue.postgres``). Each check is one query or probe; the
healthy answer is zero.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from onward import circuits, notify, retention, signals, vault
from onward.db.migrate import verify
from onward.db.sql import Queries
from onward.errors import ConfigError

if TYPE_CHECKING:
    from onward.engine import Engine

Q = Queries(__package__, "doctor.sql")


@dataclass
class Check:
    name: str
    ok: bool
    value: Any
    detail: str
    #: a warning: shown, but not unhealthy (``onward doctor`` still exits 0 for it)
    warning: bool = False

    @property
    def healthy(self) -> bool:
        return self.ok or self.warning

    def as_dict(self) -> dict[str, Any]:
        shown = asdict(self)
        if not self.warning:
            del shown["warning"]  # only a warning check says so
        return shown


def runs_without_way_forward(
    conn: psycopg.Connection[Any], *, settle: float = 5.0, limit: int = 20
) -> list[dict[str, Any]]:
    """Unfinished runs untouched for ``settle`` seconds with no durable way forward (the first
    check of :func:`run_checks`), on a synchronous connection: ``onward chaos`` and tests."""
    with conn.cursor(row_factory=dict_row) as cur:
        return list(cur.execute(Q.no_way_forward, {"settle": settle, "limit": limit}).fetchall())


async def run_checks(engine: Engine, *, grace: float = 300.0, limit: int = 20) -> list[Check]:
    checks: list[Check] = []
    problems = verify(engine.url)
    checks.append(
        Check("migrations", not problems, len(problems), "; ".join(problems) or "up to date")
    )
    async with engine.pool.connection() as conn:
        rows = await (
            await conn.execute(Q.no_way_forward, {"settle": 5.0, "limit": limit})
        ).fetchall()
        checks.append(
            Check(
                "runs_without_way_forward",
                not rows,
                len(rows),
                ", ".join(
                    f"{r['org_id']}/{r['run_id']} ({r['status']}, step {r['step_status']})"
                    for r in rows
                )
                or "every unfinished run has a durable way forward",
            )
        )
        row = await (await conn.execute(Q.overdue_timers, {"grace": grace})).fetchone()
        assert row is not None
        checks.append(
            Check(
                "overdue_timers",
                row["overdue"] == 0,
                row["overdue"],
                f"oldest due {row['oldest']} ({row['oldest_age_s']:.0f}s ago)"
                if row["overdue"]
                else "none",
            )
        )
        row = await (await conn.execute(Q.stale_outbox, {"grace": grace})).fetchone()
        assert row is not None
        checks.append(
            Check(
                "stale_outbox",
                row["stale"] == 0,
                row["stale"],
                f"oldest due {row['oldest']}: is a relay running?" if row["stale"] else "none",
            )
        )
        row = await (await conn.execute(Q.expired_leases, {"grace": grace})).fetchone()
        assert row is not None
        checks.append(
            Check(
                "expired_leases",
                row["expired"] == 0,
                row["expired"],
                f"oldest lapsed {row['oldest']}: is a sweeper running?"
                if row["expired"]
                else "none",
            )
        )
        row = await (await conn.execute(Q.two_unfinished, {})).fetchone()
        assert row is not None
        checks.append(
            Check(
                "two_unfinished_steps",
                row["runs"] == 0,
                row["runs"],
                f"e.g. {row['example']}: a running step beside another unfinished step of its "
                "run (an engine fault: report it)"
                if row["runs"]
                else "none",
            )
        )
        row = await (await conn.execute(Q.unsettled_effects, {"grace": grace})).fetchone()
        assert row is not None
        checks.append(
            Check(
                "unsettled_effects",
                row["unsettled"] == 0,
                row["unsettled"],
                f"oldest first attempt {row['oldest']}" if row["unsettled"] else "none",
            )
        )
        row = await (await conn.execute(Q.effects_in_review, {})).fetchone()
        assert row is not None
        checks.append(
            Check(
                "effects_in_review",
                row["in_review"] == 0,
                row["in_review"],
                f"oldest first attempt {row['oldest']}: a person decides with onward review "
                "resolve RUN (--happened, --retry or --skip)"
                if row["in_review"]
                else "none",
                warning=True,  # parked for a person by design (NeedsReview), not an engine fault
            )
        )
        row = await signals.unrouted(conn, grace=grace)
        checks.append(
            Check(
                "unrouted_signals",
                row["unrouted"] == 0,
                row["unrouted"],
                f"oldest received {row['oldest']}: no run recorded their correlation key "
                "(onward signals --unrouted)"
                if row["unrouted"]
                else "none",
            )
        )
        row = await notify.undelivered(conn, grace=grace)
        checks.append(
            Check(
                "undelivered_notifications",
                row["undelivered"] == 0,
                row["undelivered"],
                f"oldest written {row['oldest']}; {row['no_destination']} with no destination "
                f"(onward notifications set), {row['failed']} deliveries failed "
                "(onward notifications retry)"
                if row["undelivered"]
                else "none",
                warning=True,  # the customer's receiver, not the engine, may be what is down
            )
        )
        lanes = await (await conn.execute(Q.lanes, {})).fetchall()
        checks.append(
            Check(
                "lanes",
                all(r["oldest_ready_s"] < grace for r in lanes),
                {r["lane"]: dict(r) for r in lanes},
                "; ".join(
                    f"{r['lane']}: {r['ready']} ready (oldest {r['oldest_ready_s']:.1f}s), "
                    f"{r['running']} running"
                    + (f", {r['parked_circuit']} on circuits" if r["parked_circuit"] else "")
                    + (f", {r['parked_budget']} on budgets" if r["parked_budget"] else "")
                    for r in lanes
                )
                or "no work in any lane",
            )
        )
        not_closed = await circuits.not_closed_everywhere(conn)
        checks.append(
            Check(
                "open_circuits",
                not not_closed,
                len(not_closed),
                ", ".join(
                    f"{r['org_id']}/{r['key']} {r['state']} (retry {r['retry_at']:%H:%M:%S})"
                    for r in not_closed
                )
                or "none",
            )
        )
        checks.append(await _retention_check(conn, engine.settings.retention_days))
        sizes = await (await conn.execute(Q.table_sizes, {})).fetchall()
        checks.append(
            Check(
                "table_sizes",
                True,
                {r["table_name"]: {"bytes": r["bytes"], "rows": r["rows"]} for r in sizes},
                f"{sum(r['bytes'] for r in sizes) / 2**20:.1f} MiB in all; "
                + ", ".join(
                    f"{r['table_name']} {r['bytes'] / 2**20:.1f} MiB (~{r['rows']:,} rows)"
                    for r in sizes[:5]
                ),
            )
        )
        leader = await (await conn.execute(Q.sweeper_leader, {})).fetchone()
    checks.append(
        Check(
            "sweeper_elected",
            bool(leader and leader["live"]),
            leader["holder"] if leader else None,
            f"{leader['holder']} (term {leader['term']}) until {leader['lease_until']}"
            if leader and leader["live"]
            else "no live sweeper: timers fire only through their wake jobs",
        )
    )
    checks.append(await _secrets_check(engine))
    queue_problems = await engine.queue.health()
    checks.append(
        Check(
            f"queue_{engine.queue.name}",
            not queue_problems,
            len(queue_problems),
            "; ".join(queue_problems) or "healthy",
        )
    )
    return checks


async def _retention_check(conn: Any, default_days: float | None) -> Check:
    """The oldest finished run per organisation against its retention: unhealthy when one is
    more than a day past its bound (nobody is pruning: is a sweeper elected?)."""
    rows = await retention.oldest_by_org(conn, default_days=default_days)
    behind = [r for r in rows if r["days"] is not None and r["age_days"] > max(r["days"], 1) + 1]
    oldest = rows[0] if rows else None
    detail = (
        f"oldest finished run {oldest['age_days']:.1f} days old ({oldest['org_id']}, kept "
        + ("forever" if oldest["days"] is None else f"{oldest['days']:g} days")
        + ")"
        if oldest
        else "no finished runs"
    )
    if behind:
        detail += "; behind their retention: " + ", ".join(r["org_id"] for r in behind)
    return Check(
        "retention",
        not behind,
        {
            r["org_id"]: {
                "oldest_finished_at": r["oldest"],
                "age_days": r["age_days"],
                "days": r["days"],
            }
            for r in rows
        },
        detail,
    )


async def _secrets_check(engine: Engine) -> Check:
    """Which key encrypts stored secrets (``onward.vault``): one from ``ONWARD_SECRET_KEYS``, or
    -- a warning -- the key the database keeps for itself; and how many stored secrets are
    not yet under the current key (``onward keys rotate-secrets``)."""
    try:
        behind = await vault.not_current(engine.pool)
        mode = vault.mode()
    except ConfigError as exc:
        return Check("secrets_at_rest", False, "misconfigured", str(exc))
    local = not vault.configured_keys()
    detail = mode + (
        f"; {behind} stored secret(s) not under it (onward keys rotate-secrets)" if behind else ""
    )
    if local:
        detail += (
            " -- WARNING: the key sits beside the data, so a copy of the whole database reads "
            "every secret; set ONWARD_SECRET_KEYS (onward keys new-key) in production"
        )
    return Check(
        "secrets_at_rest",
        not local and not behind,
        {"mode": "database" if local else "environment", "not_current": behind},
        detail,
        warning=True,  # secrets are encrypted either way; this is about where the key lives
    )


def render(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        mark = "ok " if c.ok else "WRN" if c.warning else "BAD"
        value = len(c.value) if isinstance(c.value, dict) else c.value  # the detail says more
        lines.append(f"[{mark}] {c.name:<26} {value!s:<8} {c.detail}")
    bad = sum(not c.healthy for c in checks)
    warned = sum(not c.ok and c.warning for c in checks)
    lines.append(
        f"{len(checks) - bad - warned} healthy, {bad} unhealthy"
        + (f", {warned} warning{'s' * (warned > 1)}" if warned else "")
    )
    return "\n".join(lines)


async def measurements(conn: Any, *, grace: float = 300.0, limit: int = 1000) -> dict[str, Any]:
    """The numbers behind the checks, without their verdicts, from the same queries as
    :func:`run_checks` (the same ``grace``): what the elected leader exports as Prometheus
    gauges (``onward.metrics``), so a scrape and ``onward doctor`` agree on one database.
    ``outbox_backlog`` is the relay's backlog now (no grace): unsent wakes already due."""
    no_way = await (
        await conn.execute(Q.no_way_forward, {"settle": 5.0, "limit": limit})
    ).fetchall()
    overdue = await (await conn.execute(Q.overdue_timers, {"grace": grace})).fetchone()
    stale = await (await conn.execute(Q.stale_outbox, {"grace": grace})).fetchone()
    backlog = await (await conn.execute(Q.stale_outbox, {"grace": 0.0})).fetchone()
    expired = await (await conn.execute(Q.expired_leases, {"grace": grace})).fetchone()
    two = await (await conn.execute(Q.two_unfinished, {})).fetchone()
    unsettled = await (await conn.execute(Q.unsettled_effects, {"grace": grace})).fetchone()
    review = await (await conn.execute(Q.effects_in_review, {})).fetchone()
    assert overdue and stale and backlog and expired and two and unsettled and review
    return {
        "runs_without_way_forward": len(no_way),
        "overdue_timers": overdue["overdue"],
        "overdue_timers_oldest_s": overdue["oldest_age_s"] or 0.0,
        "stale_outbox": stale["stale"],
        "outbox_backlog": backlog["stale"],
        "outbox_backlog_oldest": backlog["oldest"],
        "expired_leases": expired["expired"],
        "two_unfinished_steps": two["runs"],
        "unsettled_effects": unsettled["unsettled"],
        "effects_in_review": review["in_review"],
        "unrouted_signals": (await signals.unrouted(conn, grace=grace))["unrouted"],
        "undelivered_notifications": (await notify.undelivered(conn, grace=grace))["undelivered"],
        "lanes": [dict(r) for r in await (await conn.execute(Q.lanes, {})).fetchall()],
        "circuits": await circuits.not_closed_everywhere(conn),
    }
