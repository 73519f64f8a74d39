"""A real process running only the outbox relay (crash points come from ONWARD_CRASH_AT):
``python -m onward.testing.worker worker --no-worker`` on the given database and Redis.

    python tests/acceptance/relay_proc.py DATABASE_URL REDIS_URL QUEUE_PREFIX

Kept for tests/integration/test_wakeups_redis.py, which starts it by this path."""

from __future__ import annotations

import sys

from onward.config import Settings
from onward.testing.worker import main, settings_to_json

if __name__ == "__main__":
    url, redis_url, prefix = sys.argv[1:4]
    settings = Settings(database_url=url, queue="redis", redis_url=redis_url, queue_prefix=prefix)
    sys.exit(main(["worker", "--config", settings_to_json(settings), "--no-worker"]))
