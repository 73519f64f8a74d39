"""Named SQL queries, loaded once from the ``.sql`` file beside the module that runs them.

A file holds blocks headed ``-- name: query_name`` followed by a one-line ``--`` description;
the block runs until the next header. Queries use psycopg's ``%(name)s`` placeholders.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


@cache
def load(package: str, filename: str) -> dict[str, str]:
    """Return ``{name: sql}`` for every named query in ``package/filename``."""
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{package}/{filename}: query {name!r} is defined twice")
        # no trailing ";": callers may compose (EXPLAIN ...) and psycopg needs none
        queries[name] = body.strip().rstrip(";").rstrip()
    return queries


class Queries:
    """Attribute access to the named queries of one file: ``Q = Queries(__package__, "x.sql")``."""

    def __init__(self, package: str, filename: str) -> None:
        self._package, self._filename = package, filename

    def __getattr__(self, name: str) -> str:
        try:
            return load(self._package, self._filename)[name]
        except KeyError:
            raise AttributeError(f"no query {name!r} in {self._filename}") from None
