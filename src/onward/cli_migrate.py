"""``onward runs migrate``: move the unfinished runs of one version to another (R11).

    onward runs migrate --automation welcome --from 3 --to 4 --map greet:hello \\
        --removed-step-policy skip-to:done --dry-run
    onward runs migrate --automation welcome --from 3 --to 4 --removed-step-policy park

A refused migration (an unknown step or version, a reachable step left unmapped, ...) is one
line on stderr and exit 2; nothing moved. The dry run prints, per run, what would happen and
why. Otherwise progress goes to stderr batch by batch and the summary to stdout.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

# No module-level import of onward.cli (see cli_timers.py): it imports this module.
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]


def migrate_runs(
    ctx: typer.Context,
    automation: Annotated[str, typer.Option("--automation", help="the automation id")],
    from_version: Annotated[int, typer.Option("--from", min=1, help="the version runs are on")],
    to_version: Annotated[int, typer.Option("--to", min=1, help="the version to move them to")],
    step_map: Annotated[
        str | None,
        typer.Option(
            "--map", help="old:new,... for steps whose id changed (same ids map to themselves)"
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--removed-step-policy",
            help="for a run at a step the new version removed: park, skip-to:STEP or cancel",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="list what would move and why; change nothing")
    ] = False,
    batch: Annotated[int, typer.Option("--batch", min=1, max=10_000, help="runs per batch")] = 500,
    by: Annotated[str, typer.Option("--by", help="who asks (in each run's history)")] = "cli",
    as_json: JsonOpt = False,
) -> None:
    """Move the unfinished runs of one version to another, in batches.

    \b
    Example:
        onward runs migrate --automation welcome --from 3 --to 4 --dry-run
    """
    from onward.cli import _open, _print_json, _progress, _run, _settings
    from onward.run_migrations import parse_map

    mapping = parse_map(step_map)  # InvalidInput: one line, exit 2

    def progress(row: dict[str, Any], handled: list[dict[str, Any]]) -> None:
        if not as_json:
            _progress(
                f"pass {row['pass']}: {row['done']} run(s) handled, "
                f"{row['deferred']} deferred in this pass  {row['outcomes']}"
            )

    async def go() -> dict[str, Any]:
        async with _open(_settings(ctx)) as engine:
            answer: dict[str, Any] = await engine.migrate_runs(
                automation,
                from_version,
                to_version,
                mapping,
                policy,
                dry_run=dry_run,
                by=by,
                batch=batch,
                on_batch=progress,
            )
            return answer

    answer = _run(go())
    if as_json:
        _print_json(answer)
        return
    if dry_run:
        typer.echo(
            f"dry run: {answer['runs']} unfinished run(s) of {automation} v{from_version} "
            f"-> v{to_version}  {answer['outcomes'] or ''}"
        )
        for r in answer["plan"]:
            typer.echo(f"{r['run_id']:<30} {r['outcome']:<14} {r['reason']}")
        return
    typer.echo(
        f"{answer['operation_id']} {answer['status']}: {answer['done']} run(s) of {automation} "
        f"v{from_version} -> v{to_version}  {answer['outcomes']}"
    )
    if answer["status"] != "done":
        raise typer.Exit(1)
