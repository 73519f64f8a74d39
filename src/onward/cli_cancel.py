"""``onward cancel`` and ``onward operations``: cancel runs (R12), one by one or in bulk, and
follow the bulk operations.

    onward cancel run_0193a1f2c3d4e5f6a7b8c9d0 --reason "sent by mistake"
    onward cancel --automation welcome --version 3 --status waiting
    onward operations                      # the newest first
    onward operations show op_...
    onward operations resume op_...        # continue one whose driver died
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer

# No module-level import of onward.cli (see cli_timers.py): it imports this module.
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]

operations_app = typer.Typer(
    name="operations",
    help="Bulk operations over many runs (cancel, migrate): list, show, resume."
    "\n\n\b\nExample:\n    onward operations list",
    invoke_without_command=True,
)


def _call(ctx: typer.Context, call: Any) -> Any:
    from onward.cli import _open, _run, _settings

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await call(engine)

    return _run(go())


def _instant(text: str | None, option: str) -> datetime | None:
    from onward.cli import UsageProblem

    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise UsageProblem(f"{option}: not an ISO 8601 instant: {text!r}") from None


def _run_line(r: dict[str, Any]) -> str:
    was = f" (was {r['was']})" if r.get("was") else ""
    return f"{r['run_id']}  {r['outcome']}{was}"


def _outcomes(op: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted((op.get("outcomes") or {}).items())) or "none"


def _operation_line(op: dict[str, Any]) -> str:
    line = (
        f"{op['operation_id']}  {op['kind']}  {op['status']}  {op['done']} runs ({_outcomes(op)})"
    )
    return line + (f"  error: {op['error']}" if op.get("error") else "")


def _progress(op: dict[str, Any], batch: list[dict[str, Any]]) -> None:
    from onward.cli import _progress as say

    say(f"{op['operation_id']}: batch of {len(batch)}, {op['done']} done ({_outcomes(op)})")


def cancel(
    ctx: typer.Context,
    runs: Annotated[list[str] | None, typer.Argument(help="run ids", show_default=False)] = None,
    automation: Annotated[str | None, typer.Option("--automation", help="every run of it")] = None,
    version: Annotated[int | None, typer.Option("--version", min=1)] = None,
    status: Annotated[
        str | None, typer.Option("--status", help="active, waiting or parked")
    ] = None,
    contact: Annotated[str | None, typer.Option("--contact")] = None,
    before: Annotated[str | None, typer.Option("--before", help="created before (ISO)")] = None,
    after: Annotated[str | None, typer.Option("--after", help="created at or after (ISO)")] = None,
    reason: Annotated[str | None, typer.Option("--reason")] = None,
    by: Annotated[str, typer.Option("--by", help="who asks (in the history)")] = "operator",
    as_json: JsonOpt = False,
) -> None:
    """Cancel runs: the RUN ids given, or every unfinished run a filter names (in batches,
    with progress). A waiting, parked or ready run is cancelled at once; one with a step in
    flight stops at its next safe point. Idempotent: each run's outcome is printed.

    \b
    Example:
        onward cancel --automation welcome --status waiting --reason 'campaign over'
    """
    from onward.cli import UsageProblem, _print_json

    filters: dict[str, Any] = {
        "automation_id": automation,
        "version": version,
        "status": status,
        "contact_id": contact,
        "created_before": _instant(before, "--before"),
        "created_after": _instant(after, "--after"),
    }
    named = {k: v for k, v in filters.items() if v is not None}
    if runs and named:
        raise UsageProblem("give run ids or a filter (--automation, ...), not both")
    if not runs and not named:
        raise UsageProblem("give run ids, or a filter: --automation, --status, --contact, ...")
    if status is not None and status not in ("active", "waiting", "parked"):
        raise UsageProblem(f"--status: active, waiting or parked, not {status!r}")
    if runs:
        run_ids = list(runs)

        async def each(engine: Any) -> list[dict[str, Any]]:
            return [await engine.cancel(r, by=by, reason=reason) for r in run_ids]

        answers = _call(ctx, each)
        if as_json:
            _print_json(answers)
        else:
            for a in answers:
                typer.echo(_run_line(a))
        return
    op = _call(
        ctx, lambda engine: engine.cancel_many(by=by, reason=reason, on_batch=_progress, **named)
    )
    if as_json:
        _print_json(op)
    else:
        typer.echo(_operation_line(op))


@operations_app.callback()
def operations(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The newest bulk operations first (``list``), one (``show``), or continue one
    (``resume``).

    \b
    Example:
        onward operations list
    """
    if ctx.invoked_subcommand is None:
        list_operations(ctx, as_json=as_json)


@operations_app.command("list")
def list_operations(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The newest bulk operations first.

    \b
    Example:
        onward operations list --json
    """
    from onward.cli import _print_json

    rows = _call(ctx, lambda engine: engine.operations())
    if as_json:
        _print_json(rows)
        return
    for op in rows:
        typer.echo(_operation_line(op))
    if not rows:
        typer.echo("no operations")


@operations_app.command("show")
def show_operation(
    ctx: typer.Context, operation_id: Annotated[str, typer.Argument()], as_json: JsonOpt = False
) -> None:
    """One operation: its parameters and progress.

    \b
    Example:
        onward operations show op_01a2342e4f04
    """
    from onward.cli import _print_json

    op = _call(ctx, lambda engine: engine.operation(operation_id))
    if as_json:
        _print_json(op)
    else:
        typer.echo(_operation_line(op))
        typer.echo(f"  params: {op['params']}")
        typer.echo(f"  by {op['requested_by']}, cursor after {op['after_run_id'] or '(start)'}")


@operations_app.command("resume")
def resume_operation(
    ctx: typer.Context, operation_id: Annotated[str, typer.Argument()], as_json: JsonOpt = False
) -> None:
    """Continue an operation from its cursor (its driver died or was stopped).

    \b
    Example:
        onward operations resume op_01a2342e4f04
    """
    from onward.cli import _print_json

    op = _call(ctx, lambda engine: engine.resume_operation(operation_id, on_batch=_progress))
    if as_json:
        _print_json(op)
    else:
        typer.echo(_operation_line(op))
