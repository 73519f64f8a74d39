"""``onward schedules list|pause|resume|trigger``: the schedules that start runs
(:mod:`onward.schedules`), from the command line.

    onward schedules list [--automation A] [--json]
    onward schedules pause AUTOMATION SCHEDULE [--json]
    onward schedules resume AUTOMATION SCHEDULE [--catch-up] [--json]
    onward schedules trigger AUTOMATION SCHEDULE [--key K] [--json]

``--json`` prints what the HTTP API answers (``GET /v1/schedules``,
``POST /v1/schedules/{automation_id}/{schedule_id}/pause|resume|trigger``). An unknown schedule
or a bad argument is one line on stderr and exit 2 (``onward.cli.main`` reports every
``OnwardError`` so). This module imports nothing heavy until a command runs, and nothing from
``onward.cli`` (which registers it), so ``python -m onward.cli`` works.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    from onward.engine import Engine

T = TypeVar("T")

schedules_app = typer.Typer(
    name="schedules",
    help="Schedules that start runs: list, pause, resume, trigger."
    "\n\n\b\nExample:\n    onward schedules list",
    no_args_is_help=True,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]
AutomationArg = Annotated[str, typer.Argument(metavar="AUTOMATION", help="the automation id")]
ScheduleArg = Annotated[str, typer.Argument(metavar="SCHEDULE", help="the schedule id")]


def _with_engine(ctx: typer.Context, call: Callable[[Engine], Awaitable[T]]) -> T:
    """Open an engine from the global options (``ctx.obj`` is ``onward.cli``'s), run ``call``."""
    from onward.engine import Engine

    settings = ctx.obj.settings()

    async def go() -> T:
        async with Engine.open(settings, start_queue=False, pool_size=4) as engine:
            return await call(engine)

    return asyncio.run(go())


def _check_ids(**given: str | None) -> None:
    """What the API would refuse in its path (ids, NUL, text that is not UTF-8) is refused
    here too, as one line."""
    import re

    from onward.automations.document import ID_PATTERN
    from onward.errors import InvalidInput

    for name, value in given.items():
        if value is not None and not re.fullmatch(ID_PATTERN, value):
            raise InvalidInput(f"{name}: {value!r} is not an id (letters, digits, _ . -)")


def _echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _view(row: dict[str, Any]) -> dict[str, Any]:
    from onward.api.models import ScheduleView

    return ScheduleView.model_validate(row).model_dump(mode="json")


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


def _line(s: dict[str, Any]) -> str:
    state = "paused" if s["paused"] else ("stopped" if s["error"] else "active")
    last = s["last_outcome"] or "-"
    if s["last_run_id"]:
        last += f" {s['last_run_id']} ({s['last_run_status'] or 'gone'})"
    return (
        f"{s['automation_id'] + '/' + s['schedule_id']:<36} {state:<7} "
        f"{_when(s['next_fire_at']):<26} {s['fired_count']:>6} {s['skipped_count']:>7}  "
        f"{s['rule'].splitlines()[-1]} [{s['zone']}]  last: {last}"
    )


@schedules_app.command("list")
def list_(
    ctx: typer.Context,
    automation: Annotated[
        str | None, typer.Option("--automation", help="only this automation's schedules")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Every schedule: its rule, next firing, counters and last firing.

    \b
    Example:
        onward schedules list --automation weekly-digest
    """
    _check_ids(automation=automation)
    rows = _with_engine(ctx, lambda engine: engine.schedules(automation))
    if as_json:
        _echo_json([_view(r) for r in rows])
        return
    if not rows:
        typer.echo("no schedules")
        return
    typer.echo(
        f"{'SCHEDULE':<36} {'STATE':<7} {'NEXT FIRING':<26} {'FIRED':>6} {'SKIPPED':>7}  RULE"
    )
    for row in rows:
        typer.echo(_line(row))


@schedules_app.command()
def pause(
    ctx: typer.Context, automation: AutomationArg, schedule: ScheduleArg, as_json: JsonOpt = False
) -> None:
    """Pause a schedule: it fires nothing until resumed.

    \b
    Example:
        onward schedules pause weekly-digest monday
    """
    _check_ids(AUTOMATION=automation, SCHEDULE=schedule)
    row = _with_engine(ctx, lambda engine: engine.pause_schedule(automation, schedule))
    if as_json:
        _echo_json(_view(row))
    else:
        typer.echo(f"paused {automation}/{schedule} (since {_when(row['paused_at'])})")


@schedules_app.command()
def resume(
    ctx: typer.Context,
    automation: AutomationArg,
    schedule: ScheduleArg,
    catch_up: Annotated[
        bool,
        typer.Option(
            "--catch-up",
            help="treat the paused period's firings as missed: the schedule's catch-up policy "
            "decides which run (default: none; the next firing is the next future one)",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Resume a paused schedule.

    \b
    Example:
        onward schedules resume weekly-digest monday --catch-up
    """
    _check_ids(AUTOMATION=automation, SCHEDULE=schedule)
    row = _with_engine(
        ctx, lambda engine: engine.resume_schedule(automation, schedule, catch_up=catch_up)
    )
    if as_json:
        _echo_json(_view(row))
    else:
        typer.echo(f"resumed {automation}/{schedule}: next firing {_when(row['next_fire_at'])}")


@schedules_app.command()
def trigger(
    ctx: typer.Context,
    automation: AutomationArg,
    schedule: ScheduleArg,
    key: Annotated[
        str | None,
        typer.Option("--key", help="a key of your own: the same key again is a duplicate"),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fire a schedule now, once (under its overlap policy).

    \b
    Example:
        onward schedules trigger weekly-digest monday --key 2027-w01
    """
    from onward.schedules import MAX_TRIGGER_KEY

    _check_ids(AUTOMATION=automation, SCHEDULE=schedule)
    if key is not None:
        _check_key(key, MAX_TRIGGER_KEY)
    done = _with_engine(ctx, lambda engine: engine.trigger_schedule(automation, schedule, key=key))
    if as_json:
        from onward.api.models import TriggerAnswer

        _echo_json(TriggerAnswer.model_validate(done, from_attributes=True).model_dump(mode="json"))
    elif done.outcome == "skipped":
        typer.echo(f"skipped: {done.reason}")
    else:
        typer.echo(f"{done.outcome} {done.run_id}  (start key {done.start_key})")


def _check_key(key: str, longest: int) -> None:
    from onward.errors import InvalidInput
    from onward.inputs import check_text

    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("--key: not valid UTF-8 text") from None
    check_text(key, "--key")
    if not 1 <= len(key) <= longest:
        raise InvalidInput(f"--key: 1 to {longest} characters")
