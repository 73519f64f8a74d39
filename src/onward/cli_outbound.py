"""``onward outbound``: where user-configured HTTP may go although not public (onward.outbound).

onward outbound show
onward outbound allow 10.20.0.0/16 hooks.internal:8443   # this organisation's allow-list
onward outbound disallow hooks.internal:8443
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

# No module-level import of onward.cli (see cli_timers.py): it imports this module.
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]
Entries = Annotated[
    list[str],
    typer.Argument(help="CIDR, address or host name, optionally with :port ([::1]:8099)"),
]

outbound_app = typer.Typer(
    name="outbound",
    help="The allow-list of non-public addresses outbound HTTP may reach."
    "\n\n\b\nExample:\n    onward outbound allow 127.0.0.1:8099",
    no_args_is_help=True,
)


def _call(ctx: typer.Context, call: Any) -> Any:
    from onward.cli import _open, _run, _settings

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await call(engine)

    return _run(go())


def _show(view: dict[str, list[str]], as_json: bool) -> None:
    from onward.cli import _print_json

    if as_json:
        _print_json(view)
        return
    typer.echo(f"engine (ONWARD_OUTBOUND_ALLOW): {', '.join(view['engine']) or '(none)'}")
    typer.echo(f"organisation: {', '.join(view['org']) or '(none)'}")


@outbound_app.command("show")
def show(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The engine's and this organisation's allow-list entries.

    \b
    Example:
        onward outbound show
    """
    _show(_call(ctx, lambda engine: engine.outbound_allow()), as_json)


@outbound_app.command("allow")
def allow(ctx: typer.Context, entries: Entries, as_json: JsonOpt = False) -> None:
    """Add entries to this organisation's allow-list (all or none).

    \b
    Example:
        onward outbound allow 127.0.0.1:8099
    """
    _show(_call(ctx, lambda engine: engine.allow_outbound(entries)), as_json)


@outbound_app.command("disallow")
def disallow(ctx: typer.Context, entries: Entries, as_json: JsonOpt = False) -> None:
    """Remove entries from this organisation's allow-list.

    \b
    Example:
        onward outbound disallow 127.0.0.1:8099
    """
    _show(_call(ctx, lambda engine: engine.disallow_outbound(entries)), as_json)
