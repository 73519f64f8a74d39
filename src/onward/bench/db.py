"""A scratch database per benchmark run, created from the configured server and dropped after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
