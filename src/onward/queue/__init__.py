"""Queue adapters behind one port (``base.Queue``): postgres, redis, none."""

from __future__ import annotations

from onward.config import Settings
from onward.queue.base import Queue, Wake


def make_queue(settings: Settings, database_url: str) -> Queue:
    if settings.queue == "postgres":
        from onward.queue.postgres import PostgresQueue

        return PostgresQueue(database_url, prefix=settings.queue_prefix)
    if settings.queue == "redis":
        from onward.queue.redis import RedisQueue

        return RedisQueue(
            settings.redis_url,
            prefix=settings.queue_prefix,
            allow_eviction=settings.redis_allow_eviction,
            block_s=settings.redis_block_seconds,
            promote_batch=settings.redis_promote_batch,
            take_batch=settings.redis_take_batch,
        )
    from onward.queue.none import NoQueue

    return NoQueue()


__all__ = ["Queue", "Wake", "make_queue"]
