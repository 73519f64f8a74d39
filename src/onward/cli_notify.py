"""``onward notifications``: where the organisation's notifications go, and whether they arrived
(R15, :mod:`onward.notify`).

    onward notifications set ops --webhook https://hooks.acme.test/onward   # prints its secret
    onward notifications set ops-mail --email alerts --to ops@acme.test
    onward notifications set ops-slack --slack slack --channel '#ops'
    onward notifications destinations
    onward notifications list [--undelivered] [--json]
    onward notifications retry [NOTIFICATION_ID]
    onward notifications remove ops
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from onward.errors import InvalidInput

# No module-level import of onward.cli (see cli_timers.py): it imports this module.
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]

notifications_app = typer.Typer(
    name="notifications",
    help="Where the organisation's notifications go, and whether they arrived."
    "\n\n\b\nExample:\n    onward notifications list",
    no_args_is_help=True,
)


def _call(ctx: typer.Context, call: Any) -> Any:
    from onward.cli import _open, _run, _settings

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await call(engine)

    return _run(go())


@notifications_app.command("set")
def set_destination(
    ctx: typer.Context,
    destination_id: Annotated[str, typer.Argument(help="a name for this destination")],
    webhook: Annotated[str | None, typer.Option("--webhook", help="URL to POST to")] = None,
    secret: Annotated[
        str | None, typer.Option("--secret", help="whsec_...; default: a new one, printed once")
    ] = None,
    slack: Annotated[str | None, typer.Option("--slack", help="a Slack connection")] = None,
    channel: Annotated[str | None, typer.Option("--channel", help="with --slack")] = None,
    email: Annotated[str | None, typer.Option("--email", help="an email connection")] = None,
    to: Annotated[str | None, typer.Option("--to", help="with --email: the address")] = None,
) -> None:
    """Send notifications to a webhook, a Slack channel or an email address (replacing what
    DESTINATION_ID was); notifications still undelivered go there too.

    \b
    Example:
        onward notifications set ops --webhook https://ops.acme.test/onward
    """
    chosen = [
        name for name, value in (("webhook", webhook), ("slack", slack), ("email", email)) if value
    ]
    if len(chosen) != 1:
        raise InvalidInput("give one of --webhook URL, --slack CONNECTION, --email CONNECTION")
    kind = chosen[0]
    if kind != "webhook" and secret:
        raise InvalidInput("--secret goes with --webhook")
    if (channel and kind != "slack") or (to and kind != "email"):
        raise InvalidInput("--channel goes with --slack, --to with --email")
    row = _call(
        ctx,
        lambda engine: engine.set_notification_destination(
            destination_id,
            kind,
            url=webhook,
            secret=secret,
            connection_id=slack or email,
            target=channel if kind == "slack" else to,
        ),
    )
    where = row["url"] or f"{row['target']} through {row['connection_id']}"
    typer.echo(
        f"{row['destination_id']}: {row['kind']} {where} ({row['backlog']} undelivered now go there)"
    )
    if kind == "webhook" and not secret:
        typer.echo(f"signing secret (shown once): {row['secret']}")


@notifications_app.command("destinations")
def list_destinations(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Where the organisation's notifications go.

    \b
    Example:
        onward notifications destinations
    """
    from onward.cli import _print_json

    rows = _call(ctx, lambda engine: engine.notification_destinations())
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        where = r["url"] or f"{r['target']} through {r['connection_id']}"
        typer.echo(f"{r['destination_id']}  {r['kind']}  {where}")
    if not rows:
        typer.echo(
            "no destinations: notifications wait (onward notifications set ID --webhook URL)"
        )


@notifications_app.command("remove")
def remove_destination(
    ctx: typer.Context, destination_id: Annotated[str, typer.Argument()]
) -> None:
    """Stop sending there.

    \b
    Example:
        onward notifications remove ops
    """
    if not _call(ctx, lambda engine: engine.remove_notification_destination(destination_id)):
        raise InvalidInput(f"no destination {destination_id!r}")
    typer.echo(f"removed {destination_id}")


@notifications_app.command("list")
def list_notifications(
    ctx: typer.Context,
    undelivered: Annotated[
        bool, typer.Option("--undelivered", help="only those not delivered")
    ] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """Notifications, newest first, with each destination's delivery state.

    \b
    Example:
        onward notifications list --json
    """
    from onward.cli import _print_json

    rows = _call(ctx, lambda engine: engine.notifications(undelivered=undelivered, limit=limit))
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        state = (
            f"delivered {r['delivered_at']:%Y-%m-%d %H:%M:%S}"
            if r["delivered_at"]
            else "undelivered"
        )
        typer.echo(
            f"{r['notification_id']}  {r['created_at']:%Y-%m-%d %H:%M:%S}  {r['kind']}  {state}  {r['subject']}"
        )
        for d in r["deliveries"]:
            last = f", last {d['last_error']}" if d["last_error"] else ""
            typer.echo(
                f"    {d['destination_id']}: {d['status']} after {d['attempts']} attempt(s){last}"
            )
        if not r["deliveries"]:
            typer.echo("    no destination yet")
    if not rows:
        typer.echo("no notifications")


@notifications_app.command("retry")
def retry(
    ctx: typer.Context,
    notification_id: Annotated[
        int | None, typer.Argument(help="default: every undelivered one")
    ] = None,
) -> None:
    """Deliver failed (or backing-off) notifications now, with a new round of attempts.

    \b
    Example:
        onward notifications retry
    """
    rows = _call(ctx, lambda engine: engine.retry_notifications(notification_id))
    typer.echo(f"{len(rows)} deliveries due now")
