"""``onward status``: what runs right now, and where.

Four parts, each read without starting or changing anything: the embedded PostgreSQL of the
data folder (``postmaster.pid``: folder, socket, pid, and whether it answers a query); the
database the settings point at (the configured URL, else that embedded server) and whether it
answers; the processes at work, as the database knows them -- onward keeps no registry of
worker processes, so what shows them is the leader leases (the elected sweeper) and the step
leases held now, per worker and lane; and the queue: PostgreSQL LISTEN/NOTIFY needs nothing
else, Redis is pinged and its ready and delayed lists counted, and the outbox's unsent wakes
are counted either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from onward.config import Settings
from onward.db.embedded import ServerInfo, server_info
from onward.db.sql import Queries

Q = Queries(__package__, "status.sql")
TIMEOUT_S = 3


@dataclass
class Status:
    embedded: dict[str, Any] | None
    database: dict[str, Any]
    leaders: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    queue: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "embedded": self.embedded,
            "database": self.database,
            "leaders": self.leaders,
            "workers": self.workers,
            "queue": self.queue,
        }


def redact(url: str) -> str:
    from onward.demo import redact as redact_url  # one rule for printing a URL

    return redact_url(url)


def _answers(url: str) -> tuple[bool, str | None]:
    try:
        with psycopg.connect(url, connect_timeout=TIMEOUT_S, autocommit=True) as conn:
            conn.execute("SELECT 1")
        return True, None
    except psycopg.Error as exc:
        return False, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _embedded(info: ServerInfo | None, data_dir: str) -> dict[str, Any]:
    if info is None:
        return {"folder": data_dir, "running": False, "answers": False}
    shown = info.as_dict()
    shown["answers"] = _answers(info.url)[0] if info.running else False
    return shown


def _activity(url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Leader leases, step leases per worker and lane, unsent wakes: as the engine's role sees
    every organisation (onward.db.ENGINE_ROLE)."""
    from onward.db import ENGINE_ROLE

    with psycopg.connect(url, connect_timeout=TIMEOUT_S, autocommit=True) as conn:
        conn.execute(f"SET ROLE {ENGINE_ROLE}")
        with conn.cursor(row_factory=dict_row) as cur:
            leaders = list(cur.execute(Q.leaders).fetchall())
            workers = list(cur.execute(Q.step_holders).fetchall())
            wakes = cur.execute(Q.unsent_wakes).fetchone() or {}
    return leaders, workers, dict(wakes)


def _redis(settings: Settings) -> dict[str, Any]:
    """Ping Redis and count each lane's ready list and delayed set (onward.queue.redis)."""
    import redis

    client = redis.Redis.from_url(
        settings.redis_url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
    )
    try:
        client.ping()
        lists: dict[str, dict[str, int]] = {}
        prefix = settings.queue_prefix
        for kind, count in (("ready", client.llen), ("delayed", client.zcard)):
            for key in client.scan_iter(match=f"{prefix}:{kind}:*", count=500):
                name = key.decode() if isinstance(key, bytes) else str(key)
                lane = name.removeprefix(f"{prefix}:{kind}:")
                lists.setdefault(lane, {"ready": 0, "delayed": 0})[kind] = int(count(name))
        return {"reachable": True, "lanes": dict(sorted(lists.items()))}
    except (redis.RedisError, OSError) as exc:
        return {"reachable": False, "error": str(exc) or type(exc).__name__}
    finally:
        client.close()


def gather(settings: Settings) -> Status:
    """Everything ``onward status`` shows. Starts nothing: an embedded server that is not
    running stays stopped, and the database is then reported as not answering."""
    info = server_info(settings.data_dir)
    embedded = _embedded(info, settings.data_dir)
    if settings.database_url:
        url: str | None = settings.database_url
        where = redact(settings.database_url)
    else:
        url = info.url if info is not None and info.running else None
        where = f"embedded PostgreSQL in {embedded['folder']}"
    database: dict[str, Any] = {"url": where, "answers": False}
    status = Status(embedded, database)
    if url is not None:
        database["answers"], error = _answers(url)
        if error:
            database["error"] = error
    else:
        database["error"] = "not running (the first command that needs it starts it)"
    status.queue = {"kind": settings.queue}
    if database["answers"] and url is not None:
        try:
            status.leaders, status.workers, wakes = _activity(url)
            status.queue["unsent_wakes"] = wakes
        except psycopg.Error as exc:  # not migrated yet: no tables, no roles
            database["error"] = str(exc).strip().splitlines()[0]
    if settings.queue == "redis":
        status.queue["redis"] = {"url": redact(settings.redis_url), **_redis(settings)}
    return status


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if isinstance(value, datetime) else str(value)


def render(status: Status, *, stop: str = "onward stop") -> str:
    """The human form of :func:`gather`'s answer; ``stop`` is the command that stops the
    embedded server from here."""
    out = []
    e = status.embedded or {}
    if e.get("running"):
        where = (
            f"socket {e['socket_dir']}, port {e['port']}"
            if e.get("socket_dir")
            else (f"port {e['port']}")
        )
        answer = "answers" if e.get("answers") else "does NOT answer"
        out.append(
            f"embedded PostgreSQL: running in {e['folder']} ({where}, pid {e['pid']}), "
            f"{answer}; `{stop}` stops it"
        )
    else:
        out.append(f"embedded PostgreSQL: not running ({e.get('folder')})")
    d = status.database
    state = "answers" if d["answers"] else f"does not answer: {d.get('error', '')}"
    out.append(f"database: {d['url']} -- {state}")
    if d["answers"] and "error" in d:
        out.append(f"  {d['error']}")
    if status.leaders:
        out.append("elected:")
        for lead in status.leaders:
            live = "live" if lead["live"] else "lapsed"
            out.append(
                f"  {lead['name']:<10} {lead['holder']}  term {lead['term']}  {live} until "
                f"{_when(lead['lease_until'])}"
            )
    elif d["answers"]:
        out.append("elected: nobody (no worker with a sweeper has run here yet)")
    if status.workers:
        out.append("holding step leases now:")
        for w in status.workers:
            out.append(f"  {w['worker']}  lane {w['lane']}: {w['steps']} step(s)")
    elif d["answers"]:
        out.append("holding step leases now: nobody")
    q = status.queue
    line = f"queue: {q['kind']}"
    if q["kind"] == "postgres":
        line += " (LISTEN/NOTIFY on the database above)"
    if "unsent_wakes" in q:
        w = q["unsent_wakes"]
        line += f"; outbox: {w.get('unsent', 0)} unsent wake(s), {w.get('due', 0)} due"
    out.append(line)
    if "redis" in q:
        r = q["redis"]
        if r["reachable"]:
            lanes = ", ".join(
                f"{lane} {n['ready']} ready/{n['delayed']} delayed"
                for lane, n in r["lanes"].items()
            )
            out.append(f"  Redis {r['url']}: reachable; {lanes or 'no lists'}")
        else:
            out.append(f"  Redis {r['url']}: NOT reachable: {r['error']}")
    return "\n".join(out)
