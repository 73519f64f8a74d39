"""A real onward process for tests and for ``onward chaos``, and how to start one.

    python -m onward.testing.worker worker  --config JSON [--name NAME] [--sweeper]
                                            [--no-relay] [--no-worker] [--twice]
                                            [--lanes io=8,...] [--kinds MODULE]...
                                            [--leader-ttl S] [--app-prefix P] [--standby]
    python -m onward.testing.worker starter --config JSON [--name NAME] [--app-prefix P]
                                            [--standby]

``--config`` is a JSON object of :class:`onward.config.Settings` fields (database_url, queue,
redis_url, queue_prefix, org_id, lease_seconds, heartbeat_seconds, poll_seconds,
sweep_seconds, shutdown_grace_seconds); :func:`settings_to_json` writes it.

``worker`` runs the worker and the outbox relay (``--no-worker`` / ``--no-relay`` leave one
out) and, with ``--sweeper``, stands for the sweeper election (``--leader-ttl``: the length of
its leadership lease) until SIGTERM/SIGINT. It prints ``ready <name> crash_at=<armed>`` once
its tasks run, ``stopping on SIGTERM`` when told to stop, then shuts down gracefully (running
steps get the shutdown grace, the rest are released), prints ``stats {...}`` (the worker's
counters: ``lost`` counts settles refused by the fence) and ``stopped``, and exits 0.
``--kinds MODULE`` imports a module first, for the step kinds it registers (e.g.
:mod:`onward.testing.kinds`). ``--twice`` wraps the queue in
:class:`~onward.chaos.faults.DuplicatingQueue`: every wake twice and out of order.

``starter`` reads lines ``FIRST LAST`` on stdin and delivers the start events
``evt-FIRST .. evt-(LAST-1)`` of the chaos scenario (:mod:`onward.chaos.scenario`), each one
TWICE (webhooks redeliver), naming the payload's contact, ``STARTER_CHUNK`` events at once (so
the engine writes concurrent starts together). It prints ``started <i> <run_id>
new|dup`` for the first delivery of each (``erased <i>`` when a redelivery is refused because
the runner erased the contact meanwhile), and ``batch <LAST>`` after each batch; EOF ends it.

Crash points are armed from the environment (``ONWARD_CRASH_AT=point@n``): reaching one kills
the process with SIGKILL, and no handler here runs -- that is the point. ``--standby`` keeps a
warm spare: the process imports everything, prints ``standby`` and waits for one line
``go NAME SPEC`` on stdin (SPEC ``point@n[,point@n]``, or ``-`` for none), then arms the
points (``crashpoints.arm``, exactly what the environment variable does at import) and starts
as NAME; a worker then follows lines ``arm SPEC`` / ``disarm NAME`` on stdin (acknowledged by
``armed SPEC`` / ``disarmed NAME``), which arm more points or disarm some while it runs. With ``--app-prefix`` its database connections carry
``application_name=<prefix><NAME>``. SIGUSR1 prints every task's stack (to see where a stalled
process waits). Every line is flushed, so what was printed before a kill is in the log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import threading
import zlib
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import psycopg

from onward import crashpoints
from onward.config import Settings
from onward.engine import Engine
from onward.errors import ContactErased
from onward.testing.processes import Process, process_env

_SETTINGS_FIELDS = {f.name for f in fields(Settings)}
_KEEP = (
    "database_url",
    "queue",
    "redis_url",
    "queue_prefix",
    "redis_allow_eviction",
    "org_id",
    "lease_seconds",
    "heartbeat_seconds",
    "poll_seconds",
    "sweep_seconds",
    "shutdown_grace_seconds",
    "budget_lease_seconds",
    "outbound_allow",
)


def settings_from_json(raw: str) -> Settings:
    data: dict[str, Any] = json.loads(raw)
    unknown = set(data) - _SETTINGS_FIELDS
    if unknown:
        raise SystemExit(f"unknown settings: {sorted(unknown)}")
    if "outbound_allow" in data:
        data["outbound_allow"] = tuple(data["outbound_allow"])
    settings = Settings(**data)
    settings.validate()
    return settings


def settings_to_json(settings: Settings, **overrides: Any) -> str:
    """The ``--config`` of a process with these settings (``overrides`` win)."""
    data = {k: getattr(settings, k) for k in _KEEP}
    data.update(overrides)
    return json.dumps(data)


def worker_stats(log: str) -> dict[str, int] | None:
    """The counters a worker process printed (``stats {...}``) when it stopped, or None."""
    for line in log.splitlines():
        if line.startswith("stats "):
            with contextlib.suppress(ValueError):
                return dict(json.loads(line[len("stats ") :]))
    return None


# -- starting one -------------------------------------------------------------------------------


def worker_argv(
    settings: Settings,
    name: str,
    *,
    role: str = "worker",
    worker: bool = True,
    relay: bool = True,
    sweeper: bool = False,
    twice: bool = False,
    lanes: str | None = None,
    kinds: tuple[str, ...] = (),
    leader_ttl: float | None = None,
    app_prefix: str = "",
    standby: bool = False,
) -> list[str]:
    """The command line of ``python -m onward.testing.worker`` for these options."""
    argv = [sys.executable, "-m", "onward.testing.worker", role]
    argv += ["--config", settings_to_json(settings), "--name", name]
    if app_prefix:
        argv += ["--app-prefix", app_prefix]
    if standby:
        argv.append("--standby")
    if role == "starter":
        return argv
    for on, flag in ((sweeper, "--sweeper"), (twice, "--twice")):
        if on:
            argv.append(flag)
    for on, flag in ((worker, "--no-worker"), (relay, "--no-relay")):
        if not on:
            argv.append(flag)
    if lanes:
        argv += ["--lanes", lanes]
    for module in kinds:
        argv += ["--kinds", module]
    if leader_ttl is not None:
        argv += ["--leader-ttl", str(leader_ttl)]
    return argv


def spawn_worker(
    settings: Settings,
    name: str,
    *,
    log_dir: str | Path,
    crash_at: str | None = None,
    clock_offset: str | None = None,
    **options: Any,
) -> Process:
    """Start ``python -m onward.testing.worker`` (``options``: see :func:`worker_argv`) with
    its output in ``<log_dir>/<name>.log``; ``crash_at`` arms a crash point, ``clock_offset``
    skews its clocks (see :func:`~onward.testing.processes.process_env`)."""
    return Process.start(
        worker_argv(settings, name, **options),
        name=name,
        log_path=Path(log_dir) / f"{name}.log",
        env=process_env(crash_at=crash_at, clock_offset=clock_offset),
        stdin=bool(options.get("standby")) or options.get("role") == "starter",
    )


# -- the process --------------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> Settings:
    settings = settings_from_json(args.config)
    if args.app_prefix and settings.database_url:
        from onward.testing.databases import with_query

        url = with_query(settings.database_url, application_name=args.app_prefix + args.name)
        settings = replace(settings, database_url=url)
    return settings


def _lanes(spec: str | None) -> dict[str, int] | None:
    if not spec:
        return None
    out: dict[str, int] = {}
    for part in spec.split(","):
        name, _, cap = part.partition("=")
        out[name.strip()] = int(cap)
    return out


def _wait_for_go(args: argparse.Namespace) -> None:
    print("standby", flush=True)
    line = sys.stdin.readline()
    if not line.startswith("go "):
        raise SystemExit(0)  # the runner is gone or needs no more processes
    _, name, spec = line.split()
    args.name, args.armed = name, spec
    if spec != "-":
        crashpoints.arm(spec)
    print(f"go {name} crash_at={spec}", flush=True)


def _follow_arming() -> None:
    """After ``go``: lines ``arm SPEC`` / ``disarm NAME[,NAME]`` on stdin arm more points or
    disarm some in this running process (``onward chaos`` arms every relay process at once);
    each is acknowledged by ``armed SPEC`` / ``disarmed NAMES``. EOF ends it."""

    def follow() -> None:
        for line in sys.stdin:
            verb, _, arg = line.strip().partition(" ")
            if verb == "arm" and arg:
                crashpoints.arm_also(arg)
                print(f"armed {arg}", flush=True)
            elif verb == "disarm" and arg:
                crashpoints.disarm(*arg.split(","))
                print(f"disarmed {arg}", flush=True)

    threading.Thread(target=follow, name="onward-arming", daemon=True).start()


def _dump_tasks() -> None:
    """SIGUSR1: print where every task of this process is waiting (to debug a stall)."""
    print(f"--- {len(asyncio.all_tasks())} tasks ---", flush=True)
    for task in asyncio.all_tasks():
        print(f"task {task.get_name()}:")
        coro: Any = task.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is not None:
                print(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    sys.stdout.flush()


async def run_worker(args: argparse.Namespace) -> None:
    for module in args.kinds:
        importlib.import_module(module)
    settings = _settings(args)
    async with Engine.open(settings, migrate=False) as engine:
        engine.id = args.name
        if args.twice:
            from onward.chaos.faults import DuplicatingQueue

            engine.queue = DuplicatingQueue(engine.queue, seed=zlib.crc32(args.name.encode()))
        svc = engine.background(
            worker=args.worker, relay=args.relay, sweeper=args.sweeper, lanes=_lanes(args.lanes)
        )
        if svc.sweeper is not None and args.leader_ttl is not None:
            svc.sweeper.leadership.ttl = args.leader_ttl
        loop = asyncio.get_running_loop()

        def on_signal(name: str) -> None:
            print(f"stopping on {name}", flush=True)
            svc.stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig.name)
        loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
        armed = getattr(args, "armed", None) or os.environ.get("ONWARD_CRASH_AT") or "-"
        if args.standby:
            _follow_arming()
        print(f"ready {engine.id} crash_at={armed}", flush=True)
        await engine.run_background(svc)
        if svc.worker is not None:
            print("stats " + json.dumps(asdict(svc.worker.stats)), flush=True)
    print("stopped", flush=True)


async def _deliver(engine: Engine, automation: str, data: dict[str, Any], event: str) -> Any:
    """One webhook delivery naming the payload's contact; a database error is answered like a
    5xx: the sender redelivers. None: the contact was erased meanwhile (a redelivery after the
    runner erased it is refused, as it should be)."""
    while True:
        try:
            return await engine.start(automation, data, event_id=event, contact_id=data["contact"])
        except ContactErased:
            return None
        except (psycopg.OperationalError, OSError) as exc:
            print(f"redeliver {event}: {type(exc).__name__}", flush=True)
            await asyncio.sleep(0.2)


STARTER_CHUNK = 20


async def _deliver_twice(engine: Engine, i: int) -> None:
    """Start event ``i``'s run, then deliver the same event again (a duplicate): print which."""
    from onward.chaos.scenario import AUTOMATION, event_id, payload

    started = await _deliver(engine, AUTOMATION, payload(i), event_id(i))
    again = await _deliver(engine, AUTOMATION, payload(i), event_id(i))
    if started is None or again is None:
        print(f"erased {i}", flush=True)  # its run was started before: acknowledged
        return
    if again.created or again.run_id != started.run_id:  # pragma: no cover
        raise SystemExit(f"event {i}: a redelivery started a second run")
    mark = "new" if started.created else "dup"
    print(f"started {i} {started.run_id} {mark}", flush=True)


async def run_starter(args: argparse.Namespace) -> None:
    settings = _settings(args)
    async with Engine.open(settings, migrate=False, start_queue=False, pool_size=2) as engine:
        print(f"ready {args.name}", flush=True)
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                break
            first, last = (int(x) for x in line.split())
            # STARTER_CHUNK deliveries at once, as a webhook sender's concurrent requests: the
            # engine writes them together (onward.start.StartBatcher), so a kill at
            # start.after_commit may come after a statement that started many runs
            for chunk in range(first, last, STARTER_CHUNK):
                top = min(chunk + STARTER_CHUNK, last)
                await asyncio.gather(*(_deliver_twice(engine, i) for i in range(chunk, top)))
            print(f"batch {last}", flush=True)
    print("stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m onward.testing.worker")
    sub = parser.add_subparsers(dest="role", required=True)
    w = sub.add_parser("worker", help="worker + relay (+ sweeper) until SIGTERM")
    w.add_argument("--config", required=True)
    w.add_argument("--name", default="worker")
    w.add_argument("--sweeper", action="store_true")
    w.add_argument("--no-relay", dest="relay", action="store_false")
    w.add_argument("--no-worker", dest="worker", action="store_false")
    w.add_argument("--twice", action="store_true", help="every wake twice, out of order")
    w.add_argument("--lanes", default=None, help='e.g. "io=4,fast=8" (default: all lanes)')
    w.add_argument("--kinds", action="append", default=[], help="a module to import first")
    w.add_argument("--leader-ttl", type=float, default=None, help="sweeper leadership lease")
    s = sub.add_parser("starter", help="deliver start events read from stdin")
    s.add_argument("--config", required=True)
    s.add_argument("--name", default="starter")
    for sp in (w, s):
        sp.add_argument("--app-prefix", default="")
        sp.add_argument("--standby", action="store_true", help="wait for 'go NAME SPEC' first")
    args = parser.parse_args(argv)
    if args.standby:
        _wait_for_go(args)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {args.name} {os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    asyncio.run(run_worker(args) if args.role == "worker" else run_starter(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
