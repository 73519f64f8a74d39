"""A real onward worker process for acceptance tests, and a helper to start one.

Run as a script::

    python tests/acceptance/procs.py worker --database-url URL [--worker-id ID]
        [--lease 3] [--heartbeat 0.5] [--grace 1] [--poll 0.2] [--sweep 0.2]
        [--sweeper] [--no-relay] [--lanes io=4,fast=8]

It opens an ``Engine`` on the given database, registers the test kinds (``test.sleep``), runs
the worker (+ relay, + sweeper when asked) until SIGTERM or SIGINT, then shuts down gracefully
(the worker's ``_drain``: running steps get ``--grace`` seconds, the rest are released) and
exits 0. SIGKILL is, of course, not handled: that is the point of killing with it.

``test.sleep`` sleeps ``with.seconds`` (else ``input.seconds``, else 0) and answers what it
did (including the process's ``time.time()``). ``with.retry_seconds``, when given, replaces the sleep on attempts after the first, so a
step that blocked its first worker for a minute finishes quickly once another worker takes it.

Tests import ``spawn_worker`` / ``register_kinds`` from here; the in-test workers must know the
same kinds as the process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from onward.config import Settings
from onward.engine import Engine
from onward.kinds import Registry, StepContext, step_kind
from onward.worker import lanes_from_spec

SCRIPT = Path(__file__).resolve()
SLEEP_KIND = "test.sleep"


# -- the kinds --------------------------------------------------------------------------------
async def _sleep(step: StepContext) -> dict[str, Any]:
    params = step.params or {}
    seconds = float(params.get("seconds", step.input.get("seconds", 0)))
    if step.attempt > 1 and "retry_seconds" in params:
        seconds = float(params["retry_seconds"])
    await asyncio.sleep(seconds)
    # the process's own wall clock, so a test can see a skewed clock really was skewed
    return {"slept": seconds, "attempt": step.attempt, "worker": step.worker, "clock": time.time()}


def register_kinds(into: Registry | None = None) -> None:
    """Register ``test.sleep`` (io lane) into ``into`` (default: the global registry)."""
    step_kind(SLEEP_KIND, lane="io", replace=True, into=into)(_sleep)


# -- the process ------------------------------------------------------------------------------
async def serve(args: argparse.Namespace) -> None:
    register_kinds()
    settings = Settings(
        database_url=args.database_url,
        org_id=args.org,
        lease_seconds=args.lease,
        heartbeat_seconds=args.heartbeat,
        poll_seconds=args.poll,
        sweep_seconds=args.sweep,
        shutdown_grace_seconds=args.grace,
        queue=args.queue,
    )
    settings.validate()
    async with Engine.open(settings, migrate=False) as engine:
        if args.worker_id:
            engine.id = args.worker_id
        svc = engine.services(
            relay=args.relay,
            sweeper=args.sweeper,
            lanes=lanes_from_spec(args.lanes, settings.lanes),
        )
        loop = asyncio.get_running_loop()

        def on_signal(name: str) -> None:
            print(f"stopping on {name}", flush=True)  # tests wait for this line
            svc.stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig.name)
        print(f"ready {engine.id}", flush=True)
        await engine.run_services(svc)
        worker = svc.worker
        if worker is not None:
            logging.getLogger("procs").info("stopped: %s", worker.stats)
    print("stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="procs.py")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="run a worker until SIGTERM")
    w.add_argument("--database-url", required=True)
    w.add_argument("--org", default="test")
    w.add_argument("--worker-id", default=None)
    w.add_argument("--lease", type=float, default=3.0)
    w.add_argument("--heartbeat", type=float, default=0.5)
    w.add_argument("--grace", type=float, default=1.0)
    w.add_argument("--poll", type=float, default=0.2)
    w.add_argument("--sweep", type=float, default=0.2)
    w.add_argument("--queue", default="postgres")
    w.add_argument("--lanes", default=None, help='e.g. "io=4,fast=8" (default: all lanes)')
    w.add_argument("--sweeper", action="store_true", help="also run the (elected) sweeper")
    w.add_argument("--no-relay", dest="relay", action="store_false")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    asyncio.run(serve(args))
    return 0


# -- starting one from a test -----------------------------------------------------------------
def libfaketime() -> str | None:
    """The libfaketime shared library (Debian package ``faketime``/``libfaketime``), if any."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")) + sorted(
        glob.glob("/usr/lib/faketime/libfaketime.so.1")
    )
    return found[0] if found else None


@dataclass
class WorkerProcess:
    """One worker process started by a test. ``close()`` always reaps it."""

    worker_id: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)

    def log_text(self) -> str:
        # the child writes to the file itself; our handle only has to stay open while it runs
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._log.close()


def spawn_worker(
    database_url: str,
    worker_id: str,
    *,
    log_dir: str | Path | None = None,
    clock_offset: str | None = None,
    **options: Any,
) -> WorkerProcess:
    """Start ``procs.py worker``. ``options`` become flags (``grace=1`` -> ``--grace 1``,
    ``sweeper=True`` -> ``--sweeper``, ``relay=False`` -> ``--no-relay``).

    ``clock_offset`` (e.g. ``"+600"``) runs the process under libfaketime with its clock that
    far ahead: ``time.time()``, ``datetime.now()`` and the monotonic clock all move."""
    argv = [
        sys.executable,
        str(SCRIPT),
        "worker",
        "--database-url",
        database_url,
        "--worker-id",
        worker_id,
    ]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if name == "relay":
            if not value:
                argv.append("--no-relay")
        elif value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, str(value)]
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if clock_offset is not None:
        lib = libfaketime()
        if lib is None:
            raise RuntimeError("libfaketime is not installed: apt-get install -y faketime")
        # preload directly (not through the `faketime` wrapper, which forks): signals sent to
        # this Popen then reach the worker itself
        env["LD_PRELOAD"] = lib
        env["FAKETIME"] = clock_offset
        env["FAKETIME_NO_CACHE"] = "1"
    log_dir = Path(log_dir or tempfile.gettempdir())
    log_path = log_dir / f"worker-{worker_id}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=str(SCRIPT.parents[2]),
    )
    return WorkerProcess(worker_id, proc, log_path, log)


__all__ = ["SLEEP_KIND", "WorkerProcess", "libfaketime", "register_kinds", "spawn_worker"]


if __name__ == "__main__":
    sys.exit(main())
