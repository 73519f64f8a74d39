-- 0033: a completed run leaves `runs_page_by_status` (issue 16).
--
-- A run's completion changes `status` and `finished_at`, so its update is never heap-only and
-- adds an entry to every index of `runs` whose predicate the new version meets: six for a
-- completed run, ~43 bytes of WAL a step of a 3-step run for this one alone (`onward bench
-- throughput`, pg_walinspect by relation). Completed runs are most of an organisation's runs,
-- and a page of them in the console's or the API's order is read as well from `runs_page`
-- (every run, newest first) keeping the completed ones: a filter that keeps most rows fills
-- a page of 51 from about as many entries. The statuses a person looks for among many --
-- failed, cancelled, exceeded, and the unfinished ones (parked: the console's parked
-- reasons) -- keep their own range here, so a page of failed runs is still a range of its own
-- length, not a walk past every completed run. The index is smaller by the completed runs.
-- (tests/integration/test_status_page.py reads both plans.)
DROP INDEX runs_page_by_status;
CREATE INDEX runs_page_by_status ON runs (org_id, status, created_at, run_id)
    WHERE status <> 'completed';
