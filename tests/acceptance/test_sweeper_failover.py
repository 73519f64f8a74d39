"""One sweeper is elected (R7); when the leader is killed, another takes over within one
lease period. Real processes (sweeper only, leadership lease 2 s), killed with SIGKILL."""

from __future__ import annotations

import psycopg
from psycopg.rows import dict_row

from onward.testing import Processes, eventually_sync
from tests.acceptance.procs import worker_settings

TTL = 2.0  # the processes' leadership lease


def _leader(url: str) -> dict | None:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT holder, term, lease_until > now() AS live, "
            "extract(epoch FROM clock_timestamp()) AS now_s "
            "FROM leader_leases WHERE name = 'sweeper'"
        ).fetchone()


def test_killed_leader_is_replaced_within_one_lease(db_url: str, processes: Processes) -> None:
    settings = worker_settings(db_url, sweep=0.2)
    a, b = (
        processes.worker(settings, name, worker=False, relay=False, sweeper=True, leader_ttl=TTL)
        for name in ("sweeper-a", "sweeper-b")
    )
    first = eventually_sync(
        lambda: (row := _leader(db_url)) and row["live"] and row, what="a leader"
    )
    leader, other = (a, b) if first["holder"] == "sweeper-a" else (b, a)
    # only one leader at a time: the holder stays the same while both run
    again = eventually_sync(lambda: _leader(db_url), what="leader row")
    assert again["holder"] == first["holder"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        killed_at = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0]
    leader.kill()
    leader.popen.wait(timeout=10)
    new = eventually_sync(
        lambda: (row := _leader(db_url)) and row["holder"] != first["holder"] and row,
        timeout=TTL * 3,
        interval=0.05,
        what="a new leader",
    )
    taken_after = float(new["now_s"]) - float(killed_at)
    assert new["term"] == first["term"] + 1
    assert taken_after <= TTL + 1.0, f"takeover took {taken_after:.2f}s, lease is {TTL}s"
    assert other.alive()
