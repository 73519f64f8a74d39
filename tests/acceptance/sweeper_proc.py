"""A real process running only the elected sweeper, for leader-failover tests."""

from __future__ import annotations

import asyncio
import signal
import sys

from onward.config import Settings
from onward.db import make_pool
from onward.sweep import Sweeper


async def main(url: str, name: str, interval: float) -> None:
    pool = make_pool(url, max_size=2)
    await pool.open(wait=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    sweeper = Sweeper(pool, worker_id=name, interval=interval)
    sweeper.leadership.ttl = 2.0
    print("ready", flush=True)
    try:
        await sweeper.run(stop)
    finally:
        await pool.close()


if __name__ == "__main__":
    Settings()  # import check: the engine's settings load without an environment
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
