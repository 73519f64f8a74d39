"""A migrated template database, cloned per test (a file copy): each test gets its own empty
onward schema on the one real server."""

from __future__ import annotations

import secrets
from urllib.parse import urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from onward.db.migrate import apply


def with_database(url: str, dbname: str) -> str:
    """``url`` pointing at database ``dbname`` instead."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


class TemporaryDatabases:
    """Create ``onward_tpl_<tag>`` once (migrated), then clone it per test."""

    def __init__(self, admin_url: str, tag: str = "test") -> None:
        self.admin_url = admin_url
        self.template = f"onward_tpl_{tag}"
        self.created: list[str] = []

    def _admin(self) -> psycopg.Connection:
        return psycopg.connect(self.admin_url, autocommit=True)

    def _drop(self, name: str) -> None:
        with self._admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def prepare_template(self) -> None:
        self._drop(self.template)
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        apply(with_database(self.admin_url, self.template))

    def create(self) -> str:
        name = f"onward_t_{secrets.token_hex(5)}"
        with self._admin() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(self.template)
                )
            )
        self.created.append(name)
        return with_database(self.admin_url, name)

    def drop(self, url: str) -> None:
        self._drop(urlsplit(url).path.lstrip("/"))

    def drop_template(self) -> None:
        self._drop(self.template)


def with_query(url: str, **params: str) -> str:
    """``url`` with query parameters added (e.g. ``application_name``)."""
    parts = urlsplit(url)
    extra = urlencode(params)
    query = f"{parts.query}&{extra}" if parts.query else extra
    return urlunsplit(parts._replace(query=query))
