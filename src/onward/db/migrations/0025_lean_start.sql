-- 0025: one index less written by every start (issue 16, webhook intake). A new run wrote seven
-- entries in the indexes of `runs`; runs_unfinished (org_id, status) WHERE finished_at IS NULL
-- was one of them, and runs_by_version has the same predicate and the same leading column:
--   unfinished_counts (console)   an index-only scan of the organisation's unfinished runs,
--                                  status read from the INCLUDE column below;
--   batch_runs without automation, no_way_forward (console health, doctor)
--                                  the organisation's unfinished runs (they read the rows
--                                  anyway, as they did from runs_unfinished);
--   with a status                  runs_page_by_status, as before.
-- status is already a key column of runs_page_by_status, so including it here stops no update
-- from being HOT that was HOT before.
DROP INDEX runs_unfinished;
DROP INDEX runs_by_version;
CREATE INDEX runs_by_version ON runs (org_id, automation_id, version, run_id) INCLUDE (status)
    WHERE finished_at IS NULL;
