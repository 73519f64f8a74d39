"""Reading a run's history (R17) and rendering it as a timeline.

Rows are written by each transition's own statement (start.sql, leases.sql, timers.sql,
sweep.sql, effects.sql) so the log can never disagree with the state it describes. A grouped
settle's event is its step row itself (``steps.event_id``, migration 0029); the view
``history`` reads both, in the order of their ids.

What a row keeps of a request or a result is an :func:`excerpt`: secret-looking fields
(:data:`SECRET_WORDS`) replaced by ``[redacted]``, long text clipped, the whole bounded to about
a kilobyte -- a timeline, not a copy of the provider's traffic.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from typing import Any

from onward.db import Pool
from onward.db.sql import Queries
from onward.errors import UnknownRun

Q = Queries(__package__, "history.sql")

#: A field whose name contains one of these words holds a credential: its value is never kept.
SECRET_WORDS = (
    "authorization",
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "cookie",
    "credential",
    "private_key",
    "signature",
)
_SECRET = re.compile("|".join(SECRET_WORDS).replace("_", "[-_]?"), re.IGNORECASE)
REDACTED = "[redacted]"
EXCERPT_BYTES = 1024
_TEXT_CHARS, _ITEMS, _DEPTH = 200, 20, 4


def is_secret_name(name: str) -> bool:
    """Whether a field named ``name`` holds a credential (``Authorization``, ``api-key``, ...)."""
    return _SECRET.search(name) is not None


def redact(value: Any, depth: int = 0) -> Any:
    """``value`` with every secret-looking field's value replaced, text clipped to 200
    characters, lists to 20 items and nesting to 4 levels."""
    if isinstance(value, dict):
        if depth >= _DEPTH:
            return "{…}"
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if i == _ITEMS:
                out["…"] = f"{len(value) - _ITEMS} more"
                break
            name = str(k)
            out[name] = REDACTED if is_secret_name(name) else redact(v, depth + 1)
        return out
    if isinstance(value, list | tuple):
        if depth >= _DEPTH:
            return "[…]"
        items = [redact(v, depth + 1) for v in value[:_ITEMS]]
        return [*items, f"{len(value) - _ITEMS} more"] if len(value) > _ITEMS else items
    if isinstance(value, str):
        return value if len(value) <= _TEXT_CHARS else value[: _TEXT_CHARS - 1] + "…"
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)  # jsonb holds no NaN
    return redact(str(value), depth)


def excerpt(value: Any, limit: int = EXCERPT_BYTES) -> Any:
    """What a history row keeps of a request or result: :func:`redact`, and when that is still
    longer than ``limit`` bytes as JSON, its first ``limit`` characters as text."""
    kept = redact(value)
    text = json.dumps(kept, default=str, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode()) <= limit:
        return kept
    return text.encode()[: limit - 3].decode(errors="ignore") + "…"


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


def _detail_text(event: str, detail: Any) -> str:
    """An effect's row shows its key, its own attempt, the provider's reference and what went
    wrong; the row that completed its run says so; every other row its detail, shortened."""
    if isinstance(detail, dict) and detail.get("run") == "completed":
        rest = {k: v for k, v in detail.items() if k != "run"}
        return "run completed" + (f"  {_short(rest)}" if rest else "")
    if not event.startswith("effect_") or not isinstance(detail, dict) or "redacted" in detail:
        return _short(detail)
    parts = [f"{detail.get('provider')} {detail.get('effect_key')}"]
    if detail.get("effect_attempt") is not None:
        parts.append(f"effect attempt {detail['effect_attempt']}")
    if detail.get("reference"):
        parts.append(f"ref {detail['reference']}")
    error = detail.get("error")
    if isinstance(error, dict):
        parts.append(_short(f"{error.get('type')}: {error.get('message')}", 70).strip('"'))
    if detail.get("lapsed"):
        parts.append("effect lease lapsed")
    if detail.get("now"):
        parts.append(f"now {detail['now']}")
    return "  ".join(parts)


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
        if e.get("claimed_at") and t0:
            who += f" (claimed +{(e['claimed_at'] - t0).total_seconds():.3f}s)"
        detail = f"  {_detail_text(e['event'], e['detail'])}" if e.get("detail") else ""
        lines.append(f"  +{offset:8.3f}s  {e['event']:<17}{step}{who}{detail}")
    return "\n".join(lines)
