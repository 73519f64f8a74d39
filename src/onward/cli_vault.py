"""``onward keys``: the keys that encrypt stored secrets (:mod:`onward.vault`).

    onward keys new-key                        # a fresh key for ONWARD_SECRET_KEYS
    onward keys rotate-secrets [--batch 500]   # re-encrypt every secret under the first key

``register`` adds these commands to any ``keys`` sub-app (the API keys' commands share it).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

# No module-level import of onward.cli (see cli_timers.py): it imports this module.
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output (stable keys)")]


def new_key() -> None:
    """Print a fresh key for ONWARD_SECRET_KEYS (id:key, the first one encrypts).

    \b
    Example:
        onward keys new-key
    """
    from onward import vault

    typer.echo(vault.new_key())


def rotate_secrets(
    ctx: typer.Context,
    batch: Annotated[int, typer.Option("--batch", help="rows per transaction (1-10000)")] = 500,
    as_json: JsonOpt = False,
) -> None:
    """Re-encrypt every stored secret (connections, notification webhooks, the engine's own
    keys) of every organisation under the first key of ONWARD_SECRET_KEYS, in batches of
    --batch rows. Idempotent: run it again after an interruption. Afterwards an older key can
    be removed from ONWARD_SECRET_KEYS.

    \b
    Example:
        onward keys rotate-secrets
    """
    from onward import vault
    from onward.cli import _open, _print_json, _run, _settings
    from onward.errors import InvalidInput

    if not 1 <= batch <= 10_000:
        raise InvalidInput("--batch: between 1 and 10000 rows")

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await engine.rotate_secrets(batch=batch)

    report = _run(go())
    if as_json:
        _print_json(report)
        return
    typer.echo(f"encrypting under: {vault.mode()}")
    for table, counts in report.items():
        typer.echo(f"{table}: {counts['reencrypted']} re-encrypted of {counts['scanned']}")


def register(app: typer.Typer) -> None:
    app.command("new-key")(new_key)
    app.command("rotate-secrets")(rotate_secrets)


keys_app = typer.Typer(
    name="keys",
    help="API keys (create, list, revoke) and the keys that encrypt stored secrets "
    "(new-key, rotate-secrets)."
    "\n\n\b\nExample:\n    onward keys create ci --scope runs:write",
    no_args_is_help=True,
)
register(keys_app)
