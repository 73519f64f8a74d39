"""The SQL a statement sends: its file's comments and indentation removed, nothing inside a
quoted literal or identifier touched, and the hot path's statements short enough for psycopg to
keep their parsed form (issue 16)."""

from __future__ import annotations

import pytest
from psycopg import _queries

from onward.db.sql import compact, load


def test_comments_indentation_and_blanks_go() -> None:
    sql = """
    -- a description line, with a %(placeholder)s it names
    SELECT a,   b   -- a trailing comment, the run's own
      FROM t
      WHERE ( x = 1 )   AND y IN ( 1 , 2 )
    """
    assert compact(sql) == "SELECT a,b\nFROM t\nWHERE (x = 1) AND y IN (1,2)"


def test_quoted_literals_and_identifiers_are_kept_whole() -> None:
    sql = (
        "SELECT '--not a comment',  'it''s  two  blanks', '{\"run\": \"completed\"}'::jsonb,\n"
        "       \"odd -- name\", 'a\n   b'  -- gone\nFROM t"
    )
    assert compact(sql) == (
        "SELECT '--not a comment','it''s  two  blanks','{\"run\": \"completed\"}'::jsonb,"
        "\"odd -- name\",'a\n   b'\nFROM t"
    )


def test_an_unterminated_quote_is_refused() -> None:
    with pytest.raises(ValueError, match="unterminated quote"):
        compact("SELECT 'oops")


def test_every_loaded_statement_is_named_and_has_no_comment_left() -> None:
    for filename in ("leases.sql", "start.sql", "effects.sql", "timers.sql", "outbox.sql"):
        for name, sql in load("onward", filename).items():
            head, _, body = sql.partition("\n")
            assert head == f"-- {filename}: {name}"
            assert "--" not in body, (filename, name)


@pytest.mark.parametrize(
    ("filename", "name"),
    [
        ("leases.sql", "claim"),
        ("leases.sql", "settle_advance"),
        ("leases.sql", "heartbeat"),
        ("start.sql", "start_many"),
        ("start.sql", "start_run"),
        ("outbox.sql", "take_unsent"),
        ("outbox.sql", "mark_sent"),
    ],
)
def test_the_hot_path_statements_fit_psycopgs_parse_cache(filename: str, name: str) -> None:
    """Longer than this, psycopg parses the statement's placeholders again on every execution
    (before compacting, the grouped settle and the batch start were 6.8 kB)."""
    sql = load("onward", filename)[name]
    assert len(sql.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH, len(sql.encode())
