"""Named SQL queries, loaded once from the ``.sql`` file beside the module that runs them.

A file holds blocks headed ``-- name: query_name`` followed by a one-line ``--`` description;
the block runs until the next header. Queries use psycopg's ``%(name)s`` placeholders.

A query may include a shared statement fragment with ``{{fragment_name}}``. Fragments live in
``db/fragments.sql`` under ``-- fragment: name`` headers; each is the one source of a write
that several transitions share (making a step ready and announcing it), so no module copies
that SQL. Fragments may include fragments.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_HEADER = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_FRAGMENT_HEADER = re.compile(r"^--\s*fragment:\s*(\w+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"\{\{(\w+)\}\}")


def _blocks(text: str, header: re.Pattern[str], where: str) -> dict[str, str]:
    parts = header.split(text)
    blocks: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise ValueError(f"{where}: {name!r} is defined twice")
        # no trailing ";": callers may compose (EXPLAIN ...) and psycopg needs none
        blocks[name] = body.strip().rstrip(";").rstrip()
    return blocks


@cache
def fragments() -> dict[str, str]:
    """The shared statement fragments, ``{name: sql}`` (includes already expanded)."""
    text = resources.files("onward.db").joinpath("fragments.sql").read_text(encoding="utf-8")
    raw = _blocks(text, _FRAGMENT_HEADER, "db/fragments.sql")
    return {name: _expand(body, raw, (name,)) for name, body in raw.items()}


def _expand(sql: str, known: dict[str, str], seen: tuple[str, ...] = ()) -> str:
    def include(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in known:
            raise ValueError(f"unknown SQL fragment {{{{{name}}}}}")
        if name in seen:
            raise ValueError(f"SQL fragment {name!r} includes itself")
        return _expand(_strip_comments(known[name]), known, (*seen, name))

    return _INCLUDE.sub(include, sql)


def _strip_comments(sql: str) -> str:
    """A fragment's leading comment lines describe it; they are not part of the text."""
    lines = sql.splitlines()
    while lines and lines[0].lstrip().startswith("--"):
        lines.pop(0)
    return "\n".join(lines)


@cache
def load(package: str, filename: str) -> dict[str, str]:
    """Return ``{name: sql}`` for every named query in ``package/filename``."""
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    queries = _blocks(text, _HEADER, f"{package}/{filename}")
    if any(_INCLUDE.search(sql) for sql in queries.values()):
        shared = fragments()
        queries = {
            name: _INCLUDE.sub(lambda m: _fragment(shared, m), sql) for name, sql in queries.items()
        }
    return queries


def _fragment(shared: dict[str, str], m: re.Match[str]) -> str:
    try:
        return _strip_comments(shared[m.group(1)])
    except KeyError:
        raise ValueError(f"unknown SQL fragment {m.group(0)}") from None


class Queries:
    """Attribute access to the named queries of one file: ``Q = Queries(__package__, "x.sql")``."""

    def __init__(self, package: str, filename: str) -> None:
        self._package, self._filename = package, filename

    def __getattr__(self, name: str) -> str:
        try:
            return load(self._package, self._filename)[name]
        except KeyError:
            raise AttributeError(f"no query {name!r} in {self._filename}") from None

    def names(self) -> list[str]:
        """Every query name the file defines (the contract tests use it)."""
        return sorted(load(self._package, self._filename))
