"""``onward review resolve``, ``onward resume``, ``onward fork``: what an operator does to a run
the engine cannot move on its own (B2/B3, :mod:`onward.actions`).

    onward review resolve RUN --happened --reference ch_3f9a   # it happened: that is the charge
    onward review resolve RUN --retry                          # call again, the same key
    onward review resolve RUN --skip                           # go on without it
    onward resume RUN                                          # a parked run (reconnect, budget, ...)
    onward fork RUN [--from-step STEP] [--version V]           # retry a failed run as a new run

Each takes ``--by WHO`` (default: ``$ONWARD_OPERATOR``, else the login name), written in the
run's history. An action that does not apply (the run is not parked, has finished, never
reached the step, ...) is refused with one line on stderr and exit code 2; nothing changed.
"""

from __future__ import annotations

import getpass
from typing import Annotated, Any

import typer

from onward.errors import InvalidInput

# No module-level import of onward.cli (see cli_timers.py): it imports this module.
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]
ByOpt = Annotated[
    str | None,
    typer.Option(
        "--by",
        envvar="ONWARD_OPERATOR",
        help="who acts, written in the run's history (default: your login name)",
    ),
]
RunArg = Annotated[str, typer.Argument(help="the run id")]

review_app = typer.Typer(
    name="review",
    help="Runs parked for review: an outside call whose outcome the engine could not settle."
    "\n\n\b\nExample:\n    onward review resolve run_01a2342e4f04fd923c735242 --retry",
    no_args_is_help=True,
)


def _who(by: str | None) -> str:
    if by:
        return by
    try:
        return getpass.getuser()
    except Exception:  # no login name (a container without a user entry)
        return "operator"


def _engine_call(ctx: typer.Context, call: Any) -> Any:
    from onward.cli import _open, _run, _settings

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await call(engine)

    return _run(go())


def _done(answer: dict[str, Any], as_json: bool, line: str) -> None:
    from onward.cli import _print_json

    if as_json:
        _print_json(answer)
    else:
        typer.echo(line)


@review_app.command("resolve")
def resolve(
    ctx: typer.Context,
    run: RunArg,
    happened: Annotated[
        bool, typer.Option("--happened", help="the call happened: give --reference")
    ] = False,
    reference: Annotated[
        str | None, typer.Option("--reference", help="the provider's reference (a charge id)")
    ] = None,
    retry: Annotated[
        bool, typer.Option("--retry", help="call the provider again with the same key")
    ] = False,
    skip: Annotated[bool, typer.Option("--skip", help="go on without it: the step is skipped")] = (
        False
    ),
    effect: Annotated[
        str | None, typer.Option("--effect", help="the effect key, when the step has several")
    ] = None,
    by: ByOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Resolve the review RUN is parked for: --happened --reference REF, --retry or --skip.

    \b
    Example:
        onward review resolve run_01a2342e4f04fd923c735242 --happened --reference ch_3Pq
    """
    chosen = [how for how, on in (("happened", happened), ("retry", retry), ("skip", skip)) if on]
    if len(chosen) != 1:
        raise InvalidInput("say how, once: --happened --reference REF, --retry or --skip")
    who = _who(by)
    answer = _engine_call(
        ctx,
        lambda engine: engine.resolve_review(
            run, chosen[0], by=who, reference=reference, effect_key=effect
        ),
    )
    ref = f" ({answer['reference']})" if answer.get("reference") else ""
    _done(
        answer,
        as_json,
        f"run {run}: review resolved, {answer['how']}{ref}, by {answer['by']}; "
        f"step {answer['step_id']}#{answer['seq']} is ready",
    )


def resume(ctx: typer.Context, run: RunArg, by: ByOpt = None, as_json: JsonOpt = False) -> None:
    """Resume a parked run: its step is ready again (a reconnect only once the connection is
    restored, a circuit only once it is closed; a review is resolved instead).

    \b
    Example:
        onward resume run_01a2342e4f04fd923c735242 --by sam
    """
    who = _who(by)
    answer = _engine_call(ctx, lambda engine: engine.resume(run, by=who))
    _done(
        answer,
        as_json,
        f"run {run}: resumed by {answer['by']} (was parked on {answer['was']}); "
        f"step {answer['step_id']}#{answer['seq']} is ready",
    )


def fork(
    ctx: typer.Context,
    run: RunArg,
    from_step: Annotated[
        str | None,
        typer.Option("--from-step", help="the step to start at (default: where it stopped)"),
    ] = None,
    version: Annotated[
        int | None, typer.Option("--version", min=1, help="run on this version (default: its own)")
    ] = None,
    by: ByOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Retry a failed, cancelled or exceeded run from a step, as a new run linked to it (the
    steps before it are not run again). Asking twice answers the first fork.

    \b
    Example:
        onward fork run_01a2342e4f04fd923c735242 --from-step send
    """
    who = _who(by)
    forked = _engine_call(
        ctx, lambda engine: engine.fork(run, by=who, from_step=from_step, version=version)
    )
    what = "forked" if forked.created else "already forked"
    _done(
        forked.as_dict(),
        as_json,
        f"{forked.run_id} {what} from {run} at step {forked.step_id}#{forked.seq} "
        f"(version {forked.version})",
    )
