"""Electing one process for a singleton job (the sweeper) with a renewable lease row.

Every process may run the sweeper loop; only the holder of the lease does the work. The
holder renews well within the TTL; if it dies, the row lapses and another process takes over
within one TTL. Renewal and takeover are one statement (leader.sql ``acquire``), decided by
the database clock, so clock skew between processes cannot produce two leaders.
"""

from __future__ import annotations

from onward.db import Pool
from onward.db.sql import Queries

Q = Queries(__package__, "leader.sql")


class Leadership:
    def __init__(self, pool: Pool, name: str, holder: str, ttl: float) -> None:
        self.pool, self.name, self.holder, self.ttl = pool, name, holder, ttl
        self.term: int | None = None

    async def try_lead(self) -> bool:
        """Acquire or renew. True while this process leads."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                Q.acquire, {"name": self.name, "holder": self.holder, "ttl": self.ttl}
            )
            row = await cur.fetchone()
        self.term = row["term"] if row else None
        return row is not None

    async def resign(self) -> None:
        if self.term is None:
            return
        async with self.pool.connection() as conn:
            await conn.execute(Q.resign, {"name": self.name, "holder": self.holder})
        self.term = None
