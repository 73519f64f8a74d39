"""A real onward worker process for the effect crash tests (``test_effect_crashes.py``).

    python tests/acceptance/effect_worker.py --database-url URL [--worker-id ID] [--org test]
        [--lease 2] [--no-sweeper]

It opens ``Engine.open(Settings(...))`` on the given database with short timings (lease 2 s,
heartbeat 0.5 s, poll 0.2 s, sweep 0.3 s) and runs ``engine.running()`` -- worker, relay and,
unless ``--no-sweeper``, the elected sweeper -- until SIGTERM or SIGINT. The effect lease is the
engine's lease (``Effects(lease_seconds=settings.lease_seconds)``), so it is 2 s as well.

Crash points come from the environment: the test sets ``ONWARD_CRASH_AT=effect.after_call`` (or
any name from ``onward.crashpoints.POINTS``) in this process's environment, and reaching that
line kills the process with SIGKILL. Nothing here handles SIGKILL: that is the point.

Connections, automations and runs are created by the test through its own engine on the same
database; this process only works. It prints ``ready <worker id>`` once its services run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from onward.config import Settings
from onward.engine import Engine


async def serve(args: argparse.Namespace) -> None:
    settings = Settings(
        database_url=args.database_url,
        org_id=args.org,
        lease_seconds=args.lease,
        heartbeat_seconds=0.5,
        poll_seconds=0.2,
        sweep_seconds=0.3,
        shutdown_grace_seconds=1.0,
        queue="postgres",
    )
    settings.validate()
    async with Engine.open(settings, migrate=False) as engine:
        if args.worker_id:
            engine.id = args.worker_id
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with engine.running(sweeper=args.sweeper):
            armed = os.environ.get("ONWARD_CRASH_AT") or "-"
            print(f"ready {engine.id} crash_at={armed}", flush=True)
            await stop.wait()
    print("stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="effect_worker.py")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--org", default="test")
    parser.add_argument("--worker-id", default=None)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--no-sweeper", dest="sweeper", action="store_false")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
