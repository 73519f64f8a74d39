-- 0030: no plan rests on what the statistics say of one organisation (issue 16).
-- Every table keys its rows by organisation, and most have several indexes that lead with
-- org_id (runs nine, timers and effects five). For an organisation the last ANALYZE did not
-- see -- a new tenant, or the second one of a database that held one -- the most-common-values
-- list says `org_id = '<it>'` matches no row, so each of those indexes reads as one row, they
-- tie, and the planner keeps whichever its costs' last digits favour: `WHERE org_id = 'newco'
-- AND run_id = '...'` read runs_page_by_automation (run_id its fourth column) from the
-- organisation's first entry to its last; a run's timers by its step read timers_pkey and
-- filtered on the run; the start's probe by start key read runs_pkey and filtered every run of
-- the organisation, 5-7 ms a key once it had 10,000 (the bench's live run, auto_explain,
-- 2026-12-07). ANALYZE notices a new tenant only after a tenth of the table has changed.
-- Without statistics on the column, `org_id = <constant>` is estimated as a fixed small share
-- of the rows, the same for every organisation, and the index that also names the statement's
-- key is the cheaper by far (tests/integration/test_batch_plans.py). A table made later sets
-- the same (tests/contracts/test_code.py).
--
-- ANALYZE leaves a column's earlier statistics in place when it stops sampling it; only a
-- superuser may delete them (pg_stats hides them from the engine's roles, which row-level
-- security binds). A migration run by another role says so in a NOTICE and keeps them until a
-- superuser deletes them (the DELETE below); the README's operations notes repeat it.
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT c.oid, c.relname, a.attnum
        FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'org_id' AND NOT a.attisdropped
        WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
        ORDER BY c.relname
    LOOP
        EXECUTE format('ALTER TABLE %I ALTER COLUMN org_id SET STATISTICS 0', t.relname);
        BEGIN
            DELETE FROM pg_statistic WHERE starelid = t.oid AND staattnum = t.attnum;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE '%.org_id keeps its earlier statistics until a superuser deletes them',
                t.relname;
        END;
    END LOOP;
END
$$;
