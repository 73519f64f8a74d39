"""``onward hooks``: the Standard Webhooks secrets an automation's webhook endpoint requires
(issue 14, :mod:`onward.intake`).

    onward hooks secret add follow-up            # prints the new secret, once
    onward hooks secret add follow-up --secret whsec_...
    onward hooks secret list [follow-up] [--json]
    onward hooks secret remove follow-up hsec_1a2b3c4d5e6f
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from onward.errors import InvalidInput

# No module-level import of onward.cli (see cli_timers.py): it imports this module.
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]

hooks_app = typer.Typer(
    name="hooks",
    help="Webhook endpoints: the signatures they require."
    "\n\n\b\nExample:\n    onward hooks secret add welcome",
    no_args_is_help=True,
)
secret_app = typer.Typer(
    name="secret",
    help="Standard Webhooks secrets per automation (several at once: rotation)."
    "\n\n\b\nExample:\n    onward hooks secret list welcome",
    no_args_is_help=True,
)
hooks_app.add_typer(secret_app)


def _call(ctx: typer.Context, call: Any) -> Any:
    from onward.cli import _open, _run, _settings

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await call(engine)

    return _run(go())


@secret_app.command("add")
def add(
    ctx: typer.Context,
    automation_id: Annotated[str, typer.Argument(help="a published automation")],
    secret: Annotated[
        str | None, typer.Option("--secret", help="whsec_...; default: a new one, printed once")
    ] = None,
) -> None:
    """Require the signature on POST /v1/hooks/AUTOMATION_ID with one more secret (the others
    stay valid until removed).

    \b
    Example:
        onward hooks secret add welcome
    """
    row = _call(ctx, lambda engine: engine.add_hook_secret(automation_id, secret))
    typer.echo(f"{row['automation_id']}: secret {row['secret_id']} added")
    if secret is None:
        typer.echo(f"signing secret (shown once): {row['secret']}")


@secret_app.command("list")
def list_secrets(
    ctx: typer.Context,
    automation_id: Annotated[str | None, typer.Argument(help="default: every automation")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The secrets' ids and when each was added (never the secrets).

    \b
    Example:
        onward hooks secret list welcome
    """
    from onward.cli import _print_json

    rows = _call(ctx, lambda engine: engine.hook_secrets(automation_id))
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        typer.echo(f"{r['automation_id']}  {r['secret_id']}  {r['created_at']:%Y-%m-%d %H:%M:%S}")
    if not rows:
        typer.echo("no secrets: webhook endpoints take unsigned requests")


@secret_app.command("remove")
def remove(
    ctx: typer.Context,
    automation_id: Annotated[str, typer.Argument()],
    secret_id: Annotated[str, typer.Argument()],
) -> None:
    """Refuse requests signed with this secret from now on.

    \b
    Example:
        onward hooks secret remove welcome 2
    """
    if not _call(ctx, lambda engine: engine.remove_hook_secret(automation_id, secret_id)):
        raise InvalidInput(f"no secret {secret_id!r} on {automation_id!r}")
    typer.echo(f"removed {secret_id} from {automation_id}")
