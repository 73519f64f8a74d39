"""A migrated template database, cloned per test (a file copy): each test gets its own empty
onward schema on the one real server. With ``ahead``, clones are made (and finished tests'
databases dropped) by a thread in the background, so a test does not wait for the server's
checkpoint that a clone costs."""

from __future__ import annotations

import contextlib
import queue
import secrets
import threading
from urllib.parse import urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from onward.db.migrate import apply


def with_database(url: str, dbname: str) -> str:
    """``url`` pointing at database ``dbname`` instead."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


class TemporaryDatabases:
    """Create ``onward_tpl_<tag>`` once (migrated), then clone it per test. ``ahead``: keep
    that many clones ready, made by a background thread, which also drops the databases
    handed to :meth:`drop` (0: every clone and drop happens in the caller)."""

    def __init__(self, admin_url: str, tag: str = "test", *, ahead: int = 0) -> None:
        self.admin_url = admin_url
        self.template = f"onward_tpl_{tag}"
        self.created: list[str] = []  # made and not yet dropped
        self.ahead = ahead
        self._lock = threading.Lock()
        self._ready: queue.Queue[str | BaseException] = queue.Queue()
        self._jobs: queue.Queue[str | None] = queue.Queue()  # "" clones, a name drops it
        self._thread: threading.Thread | None = None

    def _admin(self) -> psycopg.Connection:
        return psycopg.connect(self.admin_url, autocommit=True)

    def _drop(self, name: str) -> None:
        with self._admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        with self._lock:
            if name in self.created:
                self.created.remove(name)

    def prepare_template(self) -> None:
        self._drop(self.template)
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        apply(with_database(self.admin_url, self.template))

    def _clone(self) -> str:
        name = f"onward_t_{secrets.token_hex(5)}"
        with self._lock:
            self.created.append(name)
        with self._admin() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(self.template)
                )
            )
        return name

    def create(self) -> str:
        """A new database cloned from the template: its URL."""
        if self.ahead <= 0:
            return with_database(self.admin_url, self._clone())
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="databases", daemon=True)
            self._thread.start()
            for _ in range(self.ahead):
                self._jobs.put("")
        try:
            got: str | BaseException | None = self._ready.get(timeout=60)
        except queue.Empty:
            got = None
        self._jobs.put("")  # the next one
        if isinstance(got, str):
            return with_database(self.admin_url, got)
        return with_database(self.admin_url, self._clone())  # it failed there: say why here

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            if job:
                with contextlib.suppress(psycopg.Error):  # dropped again at close
                    self._drop(job)
                continue
            try:
                self._ready.put(self._clone())
            except Exception as exc:  # the caller clones itself, and raises this if it recurs
                self._ready.put(exc)

    def drop(self, url: str) -> None:
        name = urlsplit(url).path.lstrip("/")
        if self._thread is not None:
            self._jobs.put(name)
        else:
            self._drop(name)

    def close(self) -> None:
        """Stop the background thread (after the drops handed to it) and drop every database
        this made, used or not."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        with self._lock:
            left = list(self.created)
        for name in left:
            self._drop(name)

    def drop_template(self) -> None:
        self.close()
        self._drop(self.template)


def with_query(url: str, **params: str) -> str:
    """``url`` with query parameters added (e.g. ``application_name``)."""
    parts = urlsplit(url)
    extra = urlencode(params)
    query = f"{parts.query}&{extra}" if parts.query else extra
    return urlunsplit(parts._replace(query=query))
