"""``onward init [DIR] [--template follow-up|webhook|schedule] [--force]``: a working project of
your own (onward.init): an automation, a module with a step kind and a connector, onward.toml,
a README and a test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from onward.init import DEFAULT, TEMPLATES

# No module-level import of onward.cli (see cli_timers.py): it imports this module.


def init(
    folder: Annotated[
        Path, typer.Argument(metavar="[DIR]", help="where to write it (created if missing)")
    ] = Path("."),
    template: Annotated[
        str,
        typer.Option(
            "--template", "-t", help=f"one of {', '.join(TEMPLATES)}: what starts the runs"
        ),
    ] = DEFAULT,
    force: Annotated[
        bool, typer.Option("--force", help="write into a folder that is not empty")
    ] = False,
) -> None:
    """Write a small working project: an automation, a module with one step kind and one
    connector, onward.toml, a five-line README and a test that runs it end to end.

    \b
    Example:
        onward init hello --template webhook && cd hello && onward up
    """
    from onward.cli import UsageProblem
    from onward.init import Names, NotEmpty, scaffold

    if template not in TEMPLATES:
        raise UsageProblem(f"--template: {template!r}; choose one of {', '.join(TEMPLATES)}")
    try:
        written = scaffold(folder, template, force=force)
    except (NotEmpty, OSError) as exc:
        raise UsageProblem(f"init: {exc}") from None
    names = Names.of(folder)
    for path in written:
        typer.echo(f"wrote {path}")
    there = "" if folder.resolve() == Path.cwd() else f"cd {folder} && "
    typer.echo(
        f"next: {there}onward up   (runs {names.slug}; `pytest` tests it; README.md says more)"
    )
