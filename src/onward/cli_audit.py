"""``onward audit``: who changed what in this organisation, and when (onward.audit).

onward audit                                  # the newest 50 rows, newest first
onward audit --action cancel --since 2025-01-01T00:00:00Z --limit 20
onward audit --before 1234 --json             # the page before audit id 1234
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import typer

from onward.errors import InvalidInput

# No module-level import of onward.cli (see cli_timers.py): it imports this module.


def audit(
    ctx: typer.Context,
    action: Annotated[str | None, typer.Option("--action", help="only this action")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="only rows at or after this ISO 8601 instant")
    ] = None,
    before: Annotated[
        int | None, typer.Option("--before", help="the page before this audit id")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="at most this many rows (1..500)")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Who changed what in this organisation, and when: newest first.

    \b
    Example:
        onward audit --action cancel --since 2025-01-01T00:00:00Z
    """
    from onward.cli import _open, _print_json, _run, _settings

    if since is not None:
        try:
            datetime.fromisoformat(since)
        except ValueError:
            raise InvalidInput(f"--since: not an ISO 8601 instant: {since!r}") from None

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await engine.audit(limit=limit, action=action, since=since, before=before)

    rows = _run(go())
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        detail = json.dumps(r["detail"], ensure_ascii=False, default=str) if r["detail"] else ""
        typer.echo(
            f"{r['audit_id']:>6}  {r['at']:%Y-%m-%d %H:%M:%S}  {r['actor']}  {r['action']}  "
            f"{r['target']}  {detail}".rstrip()
        )
