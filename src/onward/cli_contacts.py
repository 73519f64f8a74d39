"""``onward contacts erase``: erase a contact (R14).

onward contacts erase c_81 --email maya@example.test --by dpo@acme
onward contacts erase c_81 --json
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

# No module-level import of onward.cli (see cli_timers.py): it imports this module.
contacts_app = typer.Typer(
    name="contacts",
    help="Contacts: erase one (their personal data, in every run)."
    "\n\n\b\nExample:\n    onward contacts erase c_81 --email maya@example.test",
    no_args_is_help=True,
)


@contacts_app.command("erase")
def erase(
    ctx: typer.Context,
    contact_id: Annotated[str, typer.Argument(help="the contact's id (runs.contact_id)")],
    email: Annotated[
        list[str] | None,
        typer.Option("--email", help="an email address of the contact (repeatable)"),
    ] = None,
    by: Annotated[str, typer.Option("--by", help="who asks (in the history)")] = "operator",
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Cancel every run of CONTACT_ID, remove their data, suppress the contact (idempotent).
    ``pending``: a run had a step in flight; the elected sweeper erases it once it stops.

    \b
    Example:
        onward contacts erase c_81 --email maya@example.test
    """
    from onward.cli import _open, _print_json, _run, _settings

    async def go() -> Any:
        async with _open(_settings(ctx)) as engine:
            return await engine.erase_contact(contact_id, identifiers=email or (), by=by)

    answer = _run(go())
    if as_json:
        _print_json(answer)
    else:
        typer.echo(_describe(answer))


def _describe(a: dict[str, Any]) -> str:
    lines = [
        f"contact {a['contact_id']}: erasure {a['status']} (request {a['requests']}, "
        f"first by {a['requested_by']} at {a['requested_at']:%Y-%m-%d %H:%M:%S})",
        f"  runs: {a['erased']} erased now, {a['already_erased']} already erased, "
        f"{a['waiting']} waiting for a step in flight; {a['cancelled']} cancelled",
        f"  identifiers: {a['identifiers']}; pseudonyms added to the suppression list: "
        f"{a['suppressed']}",
        "  scrubbed: " + ", ".join(f"{k} {v}" for k, v in sorted(a["scrubbed"].items())),
    ]
    for r in a["runs"]:
        cancel = f", {r['cancel']}" if r["cancel"] else ""
        lines.append(f"  {r['run_id']}  {r['erasure']}{cancel}")
    return "\n".join(lines)
