"""``onward retention``: how long finished runs are kept (onward.retention).

onward retention show
onward retention set --days 90          # this organisation keeps finished runs 90 days
onward retention set --keep-forever
onward retention set --default          # back to ONWARD_RETENTION_DAYS (30 unless set)
onward retention prune --dry-run        # how many would go now
onward retention prune                  # delete them now (the sweeper does it anyway)
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from onward.errors import InvalidInput

# No module-level import of onward.cli (see cli_timers.py): it imports this module.
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]

retention_app = typer.Typer(
    name="retention",
    help="How long finished runs are kept; prune them now."
    "\n\n\b\nExample:\n    onward retention set --days 90",
    no_args_is_help=True,
)


def _call(ctx: typer.Context, call: Any) -> Any:
    from onward.cli import _open, _run, _settings

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await call(engine)

    return _run(go())


def _describe(v: dict[str, Any]) -> str:
    keep = "forever" if v["keep_forever"] else f"{v['days']:g} days"
    source = "its own" if v["source"] == "organisation" else "the engine's default"
    oldest = (
        f"oldest finished run {v['oldest_finished_age_days']:g} days old"
        if v["oldest_finished_at"] is not None
        else "no finished runs"
    )
    return f"{v['org_id']}: finished runs kept {keep} ({source}); {oldest}"


@retention_app.command("show")
def show(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The retention in force, where it comes from, and the oldest finished run.

    \b
    Example:
        onward retention show
    """
    from onward.cli import _print_json

    view = _call(ctx, lambda engine: engine.retention())
    if as_json:
        _print_json(view)
    else:
        typer.echo(_describe(view))


@retention_app.command("set")
def set_retention(
    ctx: typer.Context,
    days: Annotated[
        float | None, typer.Option("--days", help="days after a run finished (at least 1)")
    ] = None,
    keep_forever: Annotated[bool, typer.Option("--keep-forever")] = False,
    default: Annotated[
        bool, typer.Option("--default", help="use the engine's ONWARD_RETENTION_DAYS")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Set this organisation's retention: --days N, --keep-forever or --default.

    \b
    Example:
        onward retention set --days 90
    """
    from onward.cli import _print_json

    if sum((days is not None, keep_forever, default)) != 1:
        raise InvalidInput("give one of --days N, --keep-forever, --default")
    view = _call(ctx, lambda engine: engine.set_retention(days, keep_forever=keep_forever))
    if as_json:
        _print_json(view)
    else:
        typer.echo(_describe(view))


@retention_app.command("prune")
def prune(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="only count what would go")] = False,
    max_runs: Annotated[
        int | None, typer.Option("--max-runs", help="stop after this many runs")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete this organisation's finished runs past its retention now, in batches.

    \b
    Example:
        onward retention prune --dry-run
    """
    from onward.cli import _print_json

    res = _call(ctx, lambda engine: engine.prune(dry_run=dry_run, max_runs=max_runs))
    if as_json:
        _print_json(res)
    elif res["cutoff"] is None:
        typer.echo(f"{res['org_id']}: finished runs are kept forever; nothing to prune")
    elif dry_run:
        typer.echo(
            f"{res['org_id']}: {res['due']} finished runs before {res['cutoff']:%Y-%m-%d %H:%M} "
            "would be deleted"
        )
    else:
        typer.echo(
            f"{res['org_id']}: deleted {res['pruned']} finished runs and their rows in "
            f"{res['batches']} batches ({res['seconds']:g}s); {res['due']} still due"
        )
