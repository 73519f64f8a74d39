"""A scratch database per benchmark run, created from the configured server and dropped after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from psycopg.conninfo import conninfo_to_dict

from onward.testing import TemporaryDatabases


@contextlib.contextmanager
def scratch_database(admin_url: str, tag: str) -> Iterator[str]:
    dbs = TemporaryDatabases(admin_url, tag=f"bench_{tag}")
    dbs.prepare_template()
    url = dbs.create()
    try:
        yield url
    finally:
        dbs.drop(url)
        dbs.drop_template()


def server(url: str) -> str:
    """Which server the figures are of: its version and where it listens. Without
    ``ONWARD_DATABASE_URL`` the benches run on the embedded PostgreSQL (a Unix socket in its
    data folder), not the machine's own server -- a different version and configuration."""
    info = conninfo_to_dict(url)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('server_version')").fetchone()
    where = str(info.get("host") or "local socket")
    if info.get("port") and not where.startswith("/"):
        where += f":{info['port']}"
    return f"PostgreSQL {row[0] if row else '?'} at {where}"
