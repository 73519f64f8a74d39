"""``onward limits``, ``onward circuits``, ``onward budgets``, ``onward lanes``: what protects
the providers and the organisation (R5).

    onward limits set connection:crm --concurrent 2 --calls 5 --per 1
    onward limits list
    onward circuits set provider:email --threshold 5 --window 30 --cooldown 30
    onward budgets set '*' --usd 25        # per day (UTC), the whole organisation
    onward budgets set demo-follow-up --tokens 200000
    onward lanes
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from onward.errors import InvalidInput

# No module-level import of onward.cli (see cli_timers.py): it imports this module.
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]

limits_app = typer.Typer(
    name="limits",
    help="Concurrency caps and rates by key (connection:<id>, provider:<name>, org)."
    "\n\n\b\nExample:\n    onward limits set provider:crm --concurrent 4",
    no_args_is_help=True,
)
circuits_app = typer.Typer(
    name="circuits",
    help="Circuit breakers: their state and thresholds.\n\n\b\nExample:\n    onward circuits list",
    no_args_is_help=True,
)
budgets_app = typer.Typer(
    name="budgets",
    help="Cost budgets per day, in usd or tokens."
    "\n\n\b\nExample:\n    onward budgets set '*' --usd 25",
    no_args_is_help=True,
)


def _call(ctx: typer.Context, call: Any) -> Any:
    from onward.cli import _open, _run, _settings

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await call(engine)

    return _run(go())


def _show(rows: list[dict[str, Any]], as_json: bool, line: Any, empty: str) -> None:
    from onward.cli import _print_json

    if as_json:
        _print_json(rows)
        return
    for r in rows:
        typer.echo(line(r))
    if not rows:
        typer.echo(empty)


@limits_app.command("list")
def list_limits(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Every key's limits, with the calls in progress now.

    \b
    Example:
        onward limits list
    """
    rows = _call(ctx, lambda engine: engine.limits())

    def line(r: dict[str, Any]) -> str:
        cap = (
            f"at most {r['max_concurrent']} at once ({r['in_use']} now)"
            if r["max_concurrent"]
            else ""
        )
        rate = f"{r['calls']} per {r['per_seconds']:g}s" if r["calls"] else ""
        return f"{r['key']}  " + ", ".join(p for p in (cap, rate) if p)

    _show(rows, as_json, line, "no limits")


@limits_app.command("set")
def set_limit(
    ctx: typer.Context,
    key: Annotated[str, typer.Argument(help="connection:<id>, provider:<name> or org")],
    concurrent: Annotated[int | None, typer.Option("--concurrent")] = None,
    calls: Annotated[int | None, typer.Option("--calls")] = None,
    per: Annotated[float | None, typer.Option("--per", help="seconds (with --calls)")] = None,
) -> None:
    """Cap the calls in progress at once and/or their rate (replacing what KEY had).

    \b
    Example:
        onward limits set connection:crm --concurrent 4 --calls 10 --per 1
    """
    row = _call(
        ctx,
        lambda engine: engine.set_limit(
            key, max_concurrent=concurrent, calls=calls, per_seconds=per
        ),
    )
    typer.echo(
        f"{row['key']}: max_concurrent={row['max_concurrent']} calls={row['calls']} "
        f"per_seconds={row['per_seconds']}"
    )


@limits_app.command("remove")
def remove_limit(ctx: typer.Context, key: Annotated[str, typer.Argument()]) -> None:
    """No limits for KEY any more.

    \b
    Example:
        onward limits remove connection:crm
    """
    if not _call(ctx, lambda engine: engine.remove_limit(key)):
        raise InvalidInput(f"no limits for {key}")
    typer.echo(f"removed the limits of {key}")


@circuits_app.command("list")
def list_circuits(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Every circuit: state, failures in its window, steps parked on it.

    \b
    Example:
        onward circuits list
    """
    rows = _call(ctx, lambda engine: engine.circuits())

    def line(r: dict[str, Any]) -> str:
        extra = f" until {r['retry_at']:%H:%M:%S}" if r["state"] == "open" and r["retry_at"] else ""
        return (
            f"{r['key']}  {r['state']}{extra}  {r['failures']}/{r['threshold']} failures in "
            f"{r['window_seconds']:g}s, cool-down {r['cooldown_seconds']:g}s, "
            f"{r['parked']} parked"
        )

    _show(rows, as_json, line, "no circuits (every provider healthy so far)")


@circuits_app.command("set")
def set_circuit(
    ctx: typer.Context,
    key: Annotated[str, typer.Argument(help="connection:<id> or provider:<name>")],
    threshold: Annotated[int, typer.Option("--threshold")] = 5,
    window: Annotated[float, typer.Option("--window", help="seconds")] = 30.0,
    cooldown: Annotated[float, typer.Option("--cooldown", help="seconds")] = 30.0,
) -> None:
    """When KEY's circuit opens, and how long it stays open before one probe.

    \b
    Example:
        onward circuits set provider:model --threshold 5 --window 30 --cooldown 30
    """
    row = _call(
        ctx,
        lambda engine: engine.configure_circuit(
            key, threshold=threshold, window_seconds=window, cooldown_seconds=cooldown
        ),
    )
    typer.echo(
        f"{row['key']}: {row['state']}, opens after {row['threshold']} failures in "
        f"{row['window_seconds']:g}s, probes after {row['cooldown_seconds']:g}s"
    )


@budgets_app.command("list")
def list_budgets(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Every budget with today's charges, live reservations and parked steps.

    \b
    Example:
        onward budgets list
    """
    rows = _call(ctx, lambda engine: engine.budgets())
    _show(
        rows,
        as_json,
        lambda r: (
            f"{r['scope']}  {r['unit']}  {r['charged_today']} charged + {r['reserved']} reserved "
            f"of {r['per_day']} today, {r['parked']} parked"
        ),
        "no budgets",
    )


@budgets_app.command("set")
def set_budget(
    ctx: typer.Context,
    scope: Annotated[str, typer.Argument(help="* for the organisation, or an automation id")],
    usd: Annotated[float | None, typer.Option("--usd")] = None,
    tokens: Annotated[float | None, typer.Option("--tokens")] = None,
) -> None:
    """A budget per day (UTC); the steps parked on budgets resume and check again.

    \b
    Example:
        onward budgets set '*' --usd 25
    """
    if (usd is None) == (tokens is None):
        raise InvalidInput("give --usd or --tokens (one of them)")
    unit, amount = ("usd", usd) if usd is not None else ("tokens", tokens)
    row = _call(ctx, lambda engine: engine.set_budget(scope, unit, float(amount or 0)))
    typer.echo(f"budget {row['scope']}: {row['per_day']} {row['unit']} per day")


def lanes(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The lanes this engine's workers serve: capacity, lease, retry policy.

    \b
    Example:
        onward lanes --json
    """
    from onward.cli import _print_json, _settings
    from onward.lanes import describe

    settings = _settings(ctx)
    rows = describe(
        dict(settings.lanes), settings.lane_policy, lease_seconds=settings.lease_seconds
    )
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        typer.echo(
            f"{r['lane']:<6} capacity {r['capacity']:>3}  lease {r['lease_seconds']:g}s  "
            f"{r['max_attempts']} attempts, backoff {r['base']:g}s..{r['cap']:g}s"
            + ("" if r["served"] else "  NOT SERVED here (add it to ONWARD_LANES / --lanes)")
        )
