"""``onward signal`` / ``signals``, ``onward approvals``, ``onward approvers``: people in the
loop from the command line (R9, R10).

    onward signal reply --id evt_91 --key email:msg_4f2a --payload '{"text": "yes"}'
    onward signal unsubscribe --id evt_92 --run run_81f3
    onward signals --unrouted
    onward approvals list --status pending
    onward approvals decide RUN/approve/1/1 approve --as U_SAM
    onward approvers grant U_SAM [--automation demo-follow-up]
    onward approvers revoke U_SAM
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from onward.errors import InvalidInput

# No module-level import of onward.cli (see cli_timers.py): it imports this module.
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]

approvals_app = typer.Typer(
    name="approvals",
    help="Requests for a decision: list them, decide one."
    "\n\n\b\nExample:\n    onward approvals list --status pending",
    no_args_is_help=True,
)
approvers_app = typer.Typer(
    name="approvers",
    help="Who may decide (checked when the button is pressed)."
    "\n\n\b\nExample:\n    onward approvers grant U_SAM",
    no_args_is_help=True,
)


def _engine_call(ctx: typer.Context, call: Any) -> Any:
    from onward.cli import _open, _run, _settings

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await call(engine)

    return _run(go())


def signal(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="what it means, e.g. reply, unsubscribe")],
    event_id: Annotated[str, typer.Option("--id", help="its identity: the sender's event id")],
    run: Annotated[str | None, typer.Option("--run", help="the run it is for")] = None,
    key: Annotated[
        str | None, typer.Option("--key", help="or its correlation key, e.g. email:msg_4f2a")
    ] = None,
    payload: Annotated[
        str | None, typer.Option("--payload", "-p", help="JSON object, @file or @-")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Deliver a signal: stored once by its id, consumed at once if a step of its run waits on
    it, else kept until one does. Refused (exit 2, and recorded) if the run has finished.

    \b
    Example:
        onward signal reply --id evt_91 --key email:msg_4f2a --payload '{"text": "yes"}'
    """
    from onward.cli import _parse_payload, _print_json

    if (run is None) == (key is None):
        raise InvalidInput("give --run or --key (one of them)")
    body = _parse_payload(payload) if payload is not None else {}
    got = _engine_call(
        ctx,
        lambda engine: engine.signal(event_id, name, run_id=run, correlation_key=key, payload=body),
    )
    if as_json:
        _print_json(got.as_dict())
        return
    where = got.run_id or "nobody yet (unrouted: kept until its key is recorded)"
    dup = " (a repeat of a stored signal)" if got.duplicate else ""
    typer.echo(f"signal {got.signal_id} {got.name}: {got.status} -> {where}{dup}")


def signals(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Option("--run")] = None,
    status: Annotated[
        str | None, typer.Option("--status", help="pending, consumed, refused, late")
    ] = None,
    unrouted: Annotated[bool, typer.Option("--unrouted", help="only those nobody can route")] = (
        False
    ),
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """Signals, newest first.

    \b
    Example:
        onward signals --unrouted
    """
    from onward.cli import _print_json

    rows = _engine_call(
        ctx,
        lambda engine: engine.signals(run_id=run, status=status, unrouted=unrouted, limit=limit),
    )
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        to = r["run_id"] or "-"
        typer.echo(
            f"{r['received_at']:%Y-%m-%d %H:%M:%S}  {r['signal_id']}  {r['name']:<12} "
            f"{r['status']:<9} {to}  x{r['deliveries']}"
            + (f"  {r['reason']}" if r["reason"] else "")
        )
    if not rows:
        typer.echo("no signals")


@approvals_app.command("list")
def list_approvals(
    ctx: typer.Context,
    run: Annotated[str | None, typer.Option("--run")] = None,
    status: Annotated[str | None, typer.Option("--status", help="pending, approved, ...")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """Requests for a decision, newest first.

    \b
    Example:
        onward approvals list --status pending
    """
    from onward.cli import _print_json

    rows = _engine_call(
        ctx, lambda engine: engine.approvals(run_id=run, status=status, limit=limit)
    )
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        by = f" by {r['decided_by']} ({r['decided_via']})" if r["decided_by"] else ""
        typer.echo(
            f"{r['approval_id']}  {r['status']}{by}  asks {', '.join(r['approvers'])}  "
            f"until {r['deadline_at']:%Y-%m-%d %H:%M:%S}"
        )
    if not rows:
        typer.echo("no approval requests")


@approvals_app.command()
def decide(
    ctx: typer.Context,
    approval_id: Annotated[str, typer.Argument(help="from `onward approvals list`")],
    decision: Annotated[str, typer.Argument(help="approve or reject")],
    user: Annotated[str, typer.Option("--as", help="who decides (an approver id)")],
) -> None:
    """Decide a request (the first decision wins, whatever the channel). Refused (exit 2)
    when it expired, USER may not decide, the content changed, or it was decided already.

    \b
    Example:
        onward approvals decide RUN/approve/1/1 approve --as U_SAM
    """
    if decision not in ("approve", "reject"):
        raise InvalidInput(f"decision: approve or reject, not {decision!r}")
    got = _engine_call(ctx, lambda engine: engine.decide(approval_id, decision, user=user))
    typer.echo(f"{got['approval_id']}: {got['status']} by {got['decided_by']}")


ScopeOpt = Annotated[
    str, typer.Option("--automation", help="only for this automation (default: every one)")
]


@approvers_app.command("list")
def list_approvers(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Every grant, live and revoked.

    \b
    Example:
        onward approvers list
    """
    from onward.cli import _print_json

    rows = _engine_call(ctx, lambda engine: engine.approvers())
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        state = f"revoked {r['revoked_at']:%Y-%m-%d %H:%M}" if r["revoked_at"] else "live"
        typer.echo(f"{r['approver']}  {r['scope']}  {state}")
    if not rows:
        typer.echo("no approvers")


@approvers_app.command()
def grant(
    ctx: typer.Context,
    approver: Annotated[str, typer.Argument(help="e.g. a Slack user id, U0123")],
    automation: ScopeOpt = "*",
) -> None:
    """Let APPROVER decide.

    \b
    Example:
        onward approvers grant U_SAM --automation demo-follow-up
    """
    row = _engine_call(
        ctx, lambda engine: engine.grant_approver(approver, automation_id=automation)
    )
    typer.echo(f"granted {row['approver']} for {row['scope']}")


@approvers_app.command()
def revoke(
    ctx: typer.Context,
    approver: Annotated[str, typer.Argument()],
    automation: ScopeOpt = "*",
) -> None:
    """Take the permission away: a click after this is refused.

    \b
    Example:
        onward approvers revoke U_SAM
    """
    row = _engine_call(
        ctx, lambda engine: engine.revoke_approver(approver, automation_id=automation)
    )
    if row is None:
        raise InvalidInput(f"no live grant for {approver} on {automation}")
    typer.echo(f"revoked {row['approver']} for {row['scope']}")
