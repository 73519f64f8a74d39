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
    """Return ``{name: sql}`` for every named query in ``package/filename``, as sent: its
    comments removed (``compact``) behind one line that names it."""
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    queries = _blocks(text, _HEADER, f"{package}/{filename}")
    if any(_INCLUDE.search(sql) for sql in queries.values()):
        shared = fragments()
        queries = {
            name: _INCLUDE.sub(lambda m: _fragment(shared, m), sql) for name, sql in queries.items()
        }
    return {name: f"-- {filename}: {name}\n{compact(sql)}" for name, sql in queries.items()}


def compact(sql: str) -> str:
    """``sql`` without its comments, indentation and runs of blanks (nothing inside a quoted
    literal or identifier is touched): what the database needs, and short enough for psycopg
    to keep its parsed form. psycopg parses a statement's placeholders on every execution
    unless the text is at most ``MAX_CACHED_STATEMENT_LENGTH`` (4,096) bytes; the grouped
    settle and the batch start, 6.8 kB with their comments, were parsed again for every batch
    (issue 16). The files keep the comments; ``pg_stat_activity`` shows each statement behind
    the line naming it."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"":  # a literal or a quoted identifier, as is ('' and "" escape themselves)
            j = i + 1
            while j < n:
                if sql[j] == c:
                    if j + 1 < n and sql[j + 1] == c:
                        j += 2
                        continue
                    break
                j += 1
            if j >= n:
                raise ValueError(f"unterminated quote in SQL: {sql[i : i + 40]!r}")
            out.append(sql[i : j + 1])
            i = j + 1
        elif sql.startswith("--", i):
            while i < n and sql[i] != "\n":
                i += 1
        elif c.isspace():  # one blank or line break; none after "(" or ",", none before ")" or ","
            j = i
            while j < n and sql[j].isspace():
                j += 1
            last = out[-1][-1:] if out else ""
            newline = "\n" in sql[i:j]
            if newline and out and out[-1] == " ":  # the blank before a comment: a line break
                out[-1] = "\n"
            elif last not in ("", " ", "\n", "(", ",") and sql[j : j + 1] not in ("", ")", ","):
                out.append("\n" if newline else " ")
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out).strip()


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
