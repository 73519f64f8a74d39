"""Reading a run's history (R17) and rendering it as a timeline.

Rows are written by each transition's own statement (start.sql, leases.sql, timers.sql,
sweep.sql) so the log can never disagree with the state it describes.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from onward.db import Pool
from onward.db.sql import Queries
from onward.errors import UnknownRun

Q = Queries(__package__, "history.sql")


async def run_view(pool: Pool, org_id: str, run_id: str) -> dict[str, Any]:
    """The run, its steps and its ordered history."""
    args = {"org_id": org_id, "run_id": run_id}
    async with pool.connection() as conn:
        cur = await conn.execute(Q.run_summary, args)
        run = await cur.fetchone()
        if run is None:
            raise UnknownRun(org_id, run_id)
        steps = await (await conn.execute(Q.steps_of_run, args)).fetchall()
        events = await (await conn.execute(Q.for_run, args)).fetchall()
    return {"run": run, "steps": steps, "history": events}


async def run_status(pool: Pool, org_id: str, run_id: str) -> str:
    """The run's status; ``UnknownRun`` if there is no such run in this organisation."""
    async with pool.connection() as conn:
        cur = await conn.execute(Q.run_status, {"org_id": org_id, "run_id": run_id})
        row = await cur.fetchone()
    if row is None:
        raise UnknownRun(org_id, run_id)
    return str(row["status"])


async def list_runs(
    pool: Pool,
    org_id: str,
    *,
    status: str | None = None,
    automation_id: str | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            Q.list_runs,
            {"org_id": org_id, "status": status, "automation_id": automation_id, "limit": limit},
        )
        return list(await cur.fetchall())


def _short(value: Any, limit: int = 90) -> str:
    text = json.dumps(value, default=str, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_timeline(view: dict[str, Any]) -> str:
    """A human-readable timeline: one line per transition, times relative to the start."""
    run, events = view["run"], view["history"]
    lines = [
        f"run {run['run_id']}  {run['automation_id']} v{run['version']}  status={run['status']}"
        + (f" ({run['status_reason']})" if run.get("status_reason") else ""),
        f"start key {run['start_key']} [{run['start_key_kind']}]  steps executed "
        f"{run['steps_executed']}/{run['max_steps']}",
    ]
    t0: datetime | None = events[0]["at"] if events else None
    for e in events:
        offset = (e["at"] - t0).total_seconds() if t0 else 0.0
        step = f" {e['step_id']}#{e['seq']}" if e.get("step_id") else ""
        who = f" attempt {e['attempt']}" if e.get("attempt") is not None else ""
        who += f" by {e['worker']}" if e.get("worker") else ""
        detail = f"  {_short(e['detail'])}" if e.get("detail") else ""
        lines.append(f"  +{offset:8.3f}s  {e['event']:<16}{step}{who}{detail}")
    return "\n".join(lines)
