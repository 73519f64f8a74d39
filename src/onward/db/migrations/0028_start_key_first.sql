-- 0028: a duplicate start probes its start key from a new database's first request (issue 16).
-- start.sql start_run finds a duplicate's earlier run by (org_id, start_key). Each connection
-- caches a generic plan of it after its first few starts; while `runs` has no pages the planner
-- costs every index that leads with org_id the same (one row) and, on a tie, keeps the newest
-- index -- runs_page_by_automation here, which reads the organisation's every run and filters
-- on the start key. The plan stayed until autovacuum's first ANALYZE of `runs` (about a minute):
-- on `onward bench intake`'s fresh database, 1,942 buffers a start instead of 28.
-- Rebuilding the start key's unique index makes it the newest, so it wins that tie.
-- tests/integration/test_start_plans.py holds this (a later index on runs must keep it true).
-- Only while `runs` is small (under 8 MB on disk, its real size: no row is read, so row-level
-- security cannot hide any): a rebuild blocks writes to runs while it builds, and a table with
-- rows has statistics that cost the indexes apart anyway. The index is the same either way
-- (same columns, same constraint name); only its age differs.
DO $$
BEGIN
    IF pg_relation_size('runs') < 8 * 1024 * 1024 THEN
        CREATE UNIQUE INDEX runs_start_key_new ON runs (org_id, start_key);
        ALTER TABLE runs DROP CONSTRAINT runs_org_id_start_key_key;
        ALTER TABLE runs ADD CONSTRAINT runs_org_id_start_key_key
            UNIQUE USING INDEX runs_start_key_new;
    END IF;
END
$$;
