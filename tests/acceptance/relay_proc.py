"""A real process running only the outbox relay (crash points come from ONWARD_CRASH_AT)."""

from __future__ import annotations

import asyncio
import sys

from onward.config import Settings
from onward.engine import Engine


async def main(url: str, redis_url: str, prefix: str) -> None:
    settings = Settings(database_url=url, queue="redis", redis_url=redis_url, queue_prefix=prefix)
    async with (
        Engine.open(settings, migrate=False) as engine,
        engine.running(worker=False, sweeper=False) as svc,
    ):
        await svc.stop.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
