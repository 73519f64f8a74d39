"""Short ``onward`` commands for tests, forked from a process that has already imported onward.

``python -m onward.cli ARGS`` spends most of a short command importing (onward,
psycopg, FastAPI, Typer) before it does anything; a suite that runs hundreds of them spends
minutes there. A zygote imports all of that once, then forks a real process per command:

    test process --(unix socket: one JSON request)--> zygote (imported, single-threaded, idle)
                                                        `-- fork: handler, per request
                                                              `-- fork: the command itself

The command is a real process with its own pid, working folder, environment, stdout and stderr
(files the caller reads) and exit status, reported exactly as :mod:`subprocess` reports one (a
negative signal number when killed); it runs :func:`onward.cli.main` as ``python -m onward.cli``
does, and ends as the interpreter's exit does (``atexit`` handlers run, output flushed) but
without freeing every module first. What is read from
the environment at import time is read again after it is set (``ONWARD_CRASH_AT``,
``ONWARD_METRICS``). Typer's click commands are built once, in the zygote. The handler waits for the command and answers ``pid`` first, then its
status; the caller kills the pid itself at its timeout.

:func:`onward.testing.processes.run_onward` uses one zygote per test process (started on first
use, gone when that process ends) unless ``ONWARD_TEST_FORK=0``, and runs a command as a fresh
interpreter when its environment needs one (``LD_PRELOAD`` for libfaketime, a ``PYTHON*``
variable that differs).

Protocol, one request per connection: the caller sends one JSON line ``{"args": [...], "env":
{...}, "cwd": "...", "stdout": PATH, "stderr": PATH}``; the handler answers ``pid N`` then
``exit RC``, one line each.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any

PRELOAD = (
    "onward.cli",
    "onward.engine",
    "onward.api",
    "onward.worker",
    "onward.outbox",
    "onward.sweep",
    "onward.doctor",
    "onward.bench",
    "onward.sandbox",
)


def serve(path: str) -> dict[str, Any]:
    """Listen on ``path`` until the parent process is gone; return only in a command's own
    process, with its request."""
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    _build_commands_once()
    gc.freeze()  # what is imported stays shared with every fork, not copied on write
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    listener.settimeout(1.0)
    print("ready", flush=True)
    while True:
        _reap()
        if os.getppid() != parent:
            raise SystemExit(0)  # the test process is gone
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:  # the handler
            listener.close()
            return _handle(conn)
        conn.close()


def _build_commands_once() -> None:
    """Typer builds onward's click commands on every call of ``onward.cli.app``: here, once, in
    the zygote (each command forked after it reuses them)."""
    import typer.main

    from onward.cli import app

    built = typer.main.get_command(app)
    build = typer.main.get_command

    def get_command(typer_instance: typer.Typer) -> Any:
        return built if typer_instance is app else build(typer_instance)

    typer.main.get_command = get_command


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


def _handle(conn: socket.socket) -> dict[str, Any]:
    conn.settimeout(None)
    with conn.makefile("rb") as reader:
        request = json.loads(reader.readline())
    pid = os.fork()
    if pid == 0:  # the command
        conn.close()
        return request
    try:
        conn.sendall(f"pid {pid}\n".encode())
        status = os.waitpid(pid, 0)[1]
        conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
    finally:
        os._exit(0)


def become(request: dict[str, Any]) -> None:
    """Make this forked process the command of ``request``: its files, folder, environment and
    arguments; what onward read from the environment at import time, read again."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        out = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    os.close(null)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    sys.path[0] = os.getcwd()  # as ``python -m`` puts it
    sys.argv = ["onward", *request["args"]]

    from onward import crashpoints, metrics

    crashpoints.arm(os.environ.get("ONWARD_CRASH_AT", ""))
    metrics.configure(os.environ.get("ONWARD_METRICS") or "/metrics")


def main() -> None:
    request = serve(sys.argv[1])
    become(request)
    code = _run(request["args"])
    atexit._run_exitfuncs()  # what the interpreter's exit does, without freeing every module
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _run(args: list[str]) -> int:
    """:func:`onward.cli.main` as ``python -m onward.cli`` runs it: its exit status, an uncaught
    exception's traceback on stderr and 1."""
    from onward.cli import main as onward_main

    try:
        with contextlib.suppress(BrokenPipeError):
            onward_main(args)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    main()
