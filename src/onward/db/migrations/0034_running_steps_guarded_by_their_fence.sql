-- 0034: a running step leaves `steps_one_unfinished` (issue 16).
--
-- Every step is running once: claimed (ready -> running) or entered eagerly by its
-- predecessor's settle (inserted running), and either write added an entry to this index for
-- the running version -- 110 bytes of WAL a step of the throughput bench (pg_walinspect by
-- relation), the one index entry of a step's lifecycle that nothing reads on the hot path.
-- The index keeps its guard where a second writer could race: a run has at most one ready,
-- waiting or parked step. A running step is held by its lease and its attempt (steps_leased
-- finds it when the lease lapses), and its successor is written only by the statement that
-- ends it, at seq + 1 (leases.sql settle_advance: the insert reads the rows its own fenced
-- update moved to done; steps_pkey refuses a second row at that seq), so a running step and
-- another unfinished step of its run cannot both exist -- which the doctor's `two_unfinished`
-- and `onward chaos` watch for (zero rows the only healthy answer).
--
-- A run's unfinished step is its latest (highest seq): the lookups by run read the run's last
-- step by steps_pkey (one entry, backwards) and keep it when unfinished.
DROP INDEX steps_one_unfinished;
CREATE UNIQUE INDEX steps_one_unfinished ON steps (org_id, run_id)
    WHERE status IN ('ready', 'waiting', 'parked');
