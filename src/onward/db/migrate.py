"""Numbered SQL migrations shipped in ``onward/db/migrations``, tracked in a table.

``apply`` takes a transaction-scoped advisory lock first, so any number of processes may start
at once: one migrates, the others wait and then find nothing left to do. Each migration and its
bookkeeping row commit together, so a crash mid-migration leaves the database at the previous
version. A checksum per applied file lets ``verify`` notice a migration edited after release.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import psycopg

# pg_advisory_xact_lock key: the first 8 bytes of sha256("onward.migrate")
LOCK_KEY = int.from_bytes(hashlib.sha256(b"onward.migrate").digest()[:8], "big", signed=True)
_NAME = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def available() -> list[Migration]:
    folder = resources.files("onward.db").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        m = _NAME.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda mig: mig.version)


_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS onward_migrations (
    org_id     text NOT NULL DEFAULT '_system',
    version    integer NOT NULL,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, version)
)"""


def applied(conn: psycopg.Connection) -> dict[int, str]:
    exists = conn.execute("SELECT to_regclass('onward_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return {}
    rows = conn.execute("SELECT version, checksum FROM onward_migrations").fetchall()
    return {int(v): str(c) for v, c in rows}


def apply(url: str) -> list[Migration]:
    """Apply every pending migration; return the ones this call applied. Repeated once on a
    new connection if the first was lost (a restart, ``pg_terminate_backend``): a migration
    commits with its bookkeeping row, so the repeat skips what committed."""
    from onward.db import is_connection_error

    done: list[Migration] = []
    try:
        _apply(url, done)
    except psycopg.OperationalError as exc:
        if not is_connection_error(exc):
            raise
        _apply(url, done)
    return done


def _apply(url: str, done: list[Migration]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for mig in available():
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                conn.execute(_BOOKKEEPING)
                if mig.version in applied(conn):
                    continue
                conn.execute(mig.sql.encode())
                conn.execute(
                    "INSERT INTO onward_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (mig.version, mig.name, mig.checksum),
                )
            done.append(mig)  # committed


def status(url: str) -> list[dict[str, object]]:
    """One row per known migration: version, name, applied?, checksum ok?"""
    with psycopg.connect(url, autocommit=True) as conn:
        have = applied(conn)
    return [
        {
            "version": m.version,
            "name": m.name,
            "applied": m.version in have,
            "checksum_ok": have.get(m.version, m.checksum) == m.checksum,
        }
        for m in available()
    ]


def verify(url: str) -> list[str]:
    """Problems found: pending migrations or files changed since they were applied."""
    problems = []
    for row in status(url):
        if not row["applied"]:
            problems.append(f"migration {row['version']:04d}_{row['name']} is not applied")
        elif not row["checksum_ok"]:
            problems.append(
                f"migration {row['version']:04d}_{row['name']} changed after it was applied"
            )
    return problems
