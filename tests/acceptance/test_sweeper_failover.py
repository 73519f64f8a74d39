"""One sweeper is elected (R7); when the leader is killed, another takes over within one
lease period. Real processes, killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from onward.testing import eventually_sync

PROC = str(Path(__file__).with_name("sweeper_proc.py"))
TTL = 2.0  # sweeper_proc sets the leadership TTL to 2 s


def _leader(url: str) -> dict | None:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT holder, term, lease_until > now() AS live, "
            "extract(epoch FROM clock_timestamp()) AS now_s "
            "FROM leader_leases WHERE name = 'sweeper'"
        ).fetchone()


def _spawn(url: str, name: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, PROC, url, name, "0.2"], stdout=subprocess.DEVNULL, env=env
    )


def test_killed_leader_is_replaced_within_one_lease(db_url: str) -> None:
    a, b = _spawn(db_url, "sweeper-a"), _spawn(db_url, "sweeper-b")
    try:
        first = eventually_sync(
            lambda: (row := _leader(db_url)) and row["live"] and row, what="a leader"
        )
        leader, other = (a, b) if first["holder"] == "sweeper-a" else (b, a)
        # only one leader at a time: the holder stays the same while both run
        again = eventually_sync(lambda: _leader(db_url), what="leader row")
        assert again["holder"] == first["holder"]
        with psycopg.connect(db_url, autocommit=True) as conn:
            killed_at = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0]
        leader.send_signal(signal.SIGKILL)
        leader.wait(timeout=10)
        new = eventually_sync(
            lambda: (row := _leader(db_url)) and row["holder"] != first["holder"] and row,
            timeout=TTL * 3,
            interval=0.05,
            what="a new leader",
        )
        taken_after = float(new["now_s"]) - float(killed_at)
        assert new["term"] == first["term"] + 1
        assert taken_after <= TTL + 1.0, f"takeover took {taken_after:.2f}s, lease is {TTL}s"
        assert other.poll() is None
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
