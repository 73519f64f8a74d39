"""``onward keys create|list|revoke``: the API keys of an organisation (issue 14,
:mod:`onward.api_keys`). They share ``onward keys`` with the encryption keys' commands
(:mod:`onward.cli_vault`).

    onward --org acme keys create ci --scope runs:read --scope runs:write   # printed once
    onward --org acme keys list [--json]
    onward --org acme keys revoke 3f2a9c0d1e4b5a6c
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from onward.errors import InvalidInput

# No module-level import of onward.cli (see cli_timers.py): it imports this module.
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]


def _call(ctx: typer.Context, call: Any) -> Any:
    from onward.cli import _open, _run, _settings

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await call(engine)

    return _run(go())


def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="what people will know the key by")],
    scope: Annotated[
        list[str],
        typer.Option(
            "--scope",
            help="runs:read, runs:write, automations:write or admin (repeat for several)",
        ),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Make an API key of this organisation (--org) and print it: the only time it is shown
    (only its hash is kept).

    \b
    Example:
        onward --org acme keys create ci --scope runs:write --scope runs:read
    """
    from onward.cli import _print_json

    row, key = _call(ctx, lambda engine: engine.create_key(name, scope))
    if as_json:
        _print_json({**row, "key": key})
        return
    typer.echo(f"key {row['key_id']} ({row['name']}): {', '.join(row['scopes'])}")
    typer.echo(f"API key (shown once): {key}")


def list_keys(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """This organisation's API keys, live and revoked (never a key).

    \b
    Example:
        onward --org acme keys list
    """
    from onward.cli import _print_json

    rows = _call(ctx, lambda engine: engine.keys())
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        state = f"revoked {r['revoked_at']:%Y-%m-%d %H:%M}" if r["revoked_at"] else "live"
        used = f"used {r['last_used_at']:%Y-%m-%d %H:%M}" if r["last_used_at"] else "never used"
        typer.echo(
            f"{r['key_id']}  {r['name']}  {','.join(r['scopes'])}  {state}  {used}  "
            f"by {r['created_by']}"
        )
    if not rows:
        typer.echo("no API keys: `onward keys create NAME --scope admin` makes one")


def revoke(
    ctx: typer.Context,
    key_id: Annotated[str, typer.Argument(help="the key's id (as `keys list` shows it)")],
) -> None:
    """Revoke an API key: it authenticates nothing from now on.

    \b
    Example:
        onward --org acme keys revoke 3f2a9c0d1e4b5a6c
    """
    if _call(ctx, lambda engine: engine.revoke_key(key_id)) is None:
        raise InvalidInput(f"no live key {key_id!r} in this organisation")
    typer.echo(f"revoked {key_id}")


def register(app: typer.Typer) -> None:
    app.command("create")(create)
    app.command("list")(list_keys)
    app.command("revoke")(revoke)
