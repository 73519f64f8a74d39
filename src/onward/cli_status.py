"""``onward status`` and ``onward stop``: what is running, and stopping the embedded server.

onward status [--json]      # the embedded server, the database, elected leaders, the queue
onward stop                 # stop the embedded PostgreSQL of the data folder
"""

from __future__ import annotations

from typing import Annotated

import typer

# No module-level import of onward.cli (see cli_timers.py): it imports this module.


def status(
    ctx: typer.Context,
    as_json: Annotated[
        bool, typer.Option("--json", help="machine-readable output (stable keys)")
    ] = False,
) -> None:
    """What is running: the embedded PostgreSQL (folder, socket, pid, whether it answers), the
    database the settings point at, the elected sweeper and the workers holding steps now,
    and the queue. Starts nothing.

    \b
    Example:
        onward status --json
    """
    from onward import status as status_module
    from onward.cli import _print_json, _settings, _stop_command

    settings = _settings(ctx)
    found = status_module.gather(settings)
    if as_json:
        _print_json(found.as_dict())
    else:
        typer.echo(status_module.render(found, stop=_stop_command(settings.data_dir)))


def stop(ctx: typer.Context) -> None:
    """Stop the embedded PostgreSQL of the data folder (it outlives the processes that use
    it, so that they share it). Processes still using it lose their connections.

    \b
    Example:
        onward --data-dir .onward stop
    """
    from onward.cli import _settings
    from onward.db.embedded import stop_server

    data_dir = _settings(ctx).data_dir
    if stop_server(data_dir):
        typer.echo(f"stopped the embedded PostgreSQL in {data_dir}")
    else:
        typer.echo(f"no embedded PostgreSQL runs in {data_dir}")
