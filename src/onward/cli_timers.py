"""``onward timers``: check a calendar rule before publishing it, and recompute pending
calendar timers (R6).

    onward timers preview --rule '09:00 on weekdays' --zone Europe/Berlin [--count 5]
    onward timers recompute --contact C --zone America/New_York    # a contact moved
    onward timers recompute --automation A --step S --rule '10:00 on weekdays'
    onward timers recompute --all                                  # after a tz database update
    onward timers skip --run RUN                                   # its wait fires now
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from onward.errors import InvalidInput

# No module-level import of onward.cli: it imports this module to add the group, and under
# `python -m onward.cli` a second copy of it would import this one half-initialised.
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]

timers_app = typer.Typer(
    name="timers",
    help="Calendar timers: preview a rule's next instants, recompute pending timers."
    "\n\n\b\nExample:\n    onward timers preview --rule '09:00 on weekdays' --zone Europe/Berlin",
    no_args_is_help=True,
)


def _instant(text: str | None) -> datetime:
    if text is None:
        return datetime.now(UTC)
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            f"--after {text!r}: an ISO 8601 instant, e.g. 2026-03-28T12:00Z"
        ) from None
    if value.tzinfo is None:
        raise InvalidInput(
            f"--after {text!r}: give an offset (Z, +01:00): an instant, not a wall time"
        )
    return value


@timers_app.command()
def preview(
    rule: Annotated[
        str, typer.Option("--rule", help="e.g. '09:00 on weekdays', 'cron 30 8 1 * *'")
    ],
    zone: Annotated[str, typer.Option("--zone", help="an IANA zone, e.g. Europe/Berlin")],
    after: Annotated[
        str | None, typer.Option("--after", help="ISO instant (default: now, by this clock)")
    ] = None,
    count: Annotated[int, typer.Option("--count", min=1, max=500)] = 5,
    spread: Annotated[
        str, typer.Option("--spread", help="a duration (the step's spread) or off")
    ] = "off",
    key: Annotated[str | None, typer.Option("--key", help="a run id: its exact offset")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The next instants of a rule in a zone: local and UTC, DST substitutions marked.

    \b
    Example:
        onward timers preview --rule '09:00 on weekdays' --zone Europe/Berlin
    """
    from onward import calendar
    from onward.cli import _print_json
    from onward.durations import parse_duration

    try:
        spread_s = 0.0 if spread == "off" else parse_duration(spread)
        items = calendar.preview(rule, zone, _instant(after), count, spread_s=spread_s, key=key)
    except (calendar.RuleError, ValueError) as exc:
        raise InvalidInput(str(exc)) from None
    if as_json:
        _print_json(items)
        return
    typer.echo(f"{rule}  in {zone}")
    for item in items:
        note = {"gap": "  (DST gap: moved forward)", "fold": "  (DST fold: the first)"}.get(
            item["substitution"] or "", ""
        )
        due = f"  due {item['due_at']} (+{item['offset_s']:g}s)" if "due_at" in item else ""
        typer.echo(f"  {item['local']}  = {item['utc']}{note}{due}")
    if spread_s and key is None:
        typer.echo(f"  each run is due up to {spread_s:g}s later (spread; --key RUN for one run's)")
    if not items:
        typer.echo("  no occurrence after that instant")


@timers_app.command()
def recompute(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Option("--run", help="one run's timers")] = None,
    contact: Annotated[str | None, typer.Option("--contact", help="a contact's runs")] = None,
    automation: Annotated[str | None, typer.Option("--automation")] = None,
    step: Annotated[str | None, typer.Option("--step", help="with --automation: one step")] = None,
    zone: Annotated[str | None, typer.Option("--zone", help="the new IANA zone")] = None,
    rule: Annotated[str | None, typer.Option("--rule", help="the new rule")] = None,
    every: Annotated[
        bool, typer.Option("--all", help="every organisation's, as they are (tz database update)")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Move pending calendar timers to what their rule and zone say now; each move is in its
    run's history and the old wake does nothing.

    \b
    Example:
        onward timers recompute --contact c_81 --zone America/New_York
    """
    from onward.cli import _open, _print_json, _run, _settings

    if every and any(v is not None for v in (run, contact, automation, step, zone, rule)):
        raise InvalidInput("--all recomputes every timer as it is: it takes no other option")
    if not every and all(v is None for v in (run, contact, automation)):
        raise InvalidInput("say which timers: --run, --contact, --automation, or --all")
    if step is not None and automation is None:
        raise InvalidInput("--step needs --automation")

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await engine.recompute_timers(
                run_id=run,
                contact_id=contact,
                automation_id=automation,
                step_id=step,
                zone=zone,
                rule=rule,
                every_organisation=every,
            )

    done = _run(go())
    if as_json:
        _print_json(done.as_dict())
        return
    typer.echo(
        f"examined {done.examined}, moved {done.moved}, unchanged {done.unchanged}, "
        f"no occurrence {done.no_occurrence} in {done.seconds:.2f}s"
    )
    for m in done.sample:
        typer.echo(f"  {m['run_id']} timer {m['timer_id']}: {m['from']} -> {m['to']}")


@timers_app.command()
def skip(
    ctx: typer.Context,
    run: Annotated[str, typer.Option("--run", help="the waiting run")],
    as_json: JsonOpt = False,
) -> None:
    """Skip a waiting run's timer (a wait, or a signal's or approval's deadline): it fires now,
    with a `timer_moved` row in the run's history.

    \b
    Example:
        onward timers skip --run run_01a2342e4f04fd923c735242
    """
    from onward.cli import _open, _print_json, _run, _settings

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await engine.skip_wait(run)

    moves = _run(go())
    if as_json:
        _print_json(moves)
        return
    for m in moves:
        typer.echo(f"{run} timer {m['timer_id']} ({m['purpose']}): {m['from']} -> now")
    if not moves:
        typer.echo(f"{run} waits on no timer")
