-- 0029: a step's settle is recorded on the step row itself (issue 16). The grouped settle
-- (leases.sql settle_advance) wrote, for every step, a history row that repeated what the step
-- row's done version already holds: the run, the step, the attempt, its worker, when it was
-- claimed and when it ended. That row and its key were 330 of the ~1,930 WAL bytes a step
-- (history heap 172, history_pkey 157) and a fifth of PostgreSQL's work in a settle. Now the
-- settle draws the event's id from the history's own sequence onto the step row (`event_id`),
-- with the row's detail (`event_detail`: the skipped steps, the run's completion), keeps the
-- worker as the row's `owner`, and writes no history row. DBOS keeps a step's outcome the same
-- way, as the row of the step (operation_outputs), not as a separate event.
--
-- Readers see no difference: `history` is now a view -- the rows transitions write
-- (`history_log`, the former table, append-only as before) and, for each step a settle ended,
-- its event made from the step row (`step_done` / `step_skipped`, the step's finished_at as
-- `at`). Event ids come from one sequence, drawn in each transition's own transaction, so a
-- run's timeline keeps its order (ORDER BY event_id). Every writer names `history_log`; the
-- view runs with the caller's rights (security_invoker), so each role's row-level policies on
-- both tables apply to it as they did to the table. Older step rows have no event_id: their
-- events are the rows history_log already has.

ALTER TABLE history RENAME TO history_log;
ALTER INDEX history_pkey RENAME TO history_log_pkey;
ALTER TABLE history_log RENAME CONSTRAINT history_event_known TO history_log_event_known;

-- The event of the settle that ended this step (its id from history_log's sequence) and that
-- event's detail; NULL on a step no grouped settle ended.
ALTER TABLE steps ADD COLUMN event_id bigint;
ALTER TABLE steps ADD COLUMN event_detail jsonb;

CREATE VIEW history WITH (security_invoker = true) AS
SELECT org_id, run_id, event_id, at, event, seq, step_id, attempt, worker, detail, claimed_at
FROM history_log
UNION ALL
SELECT org_id, run_id, event_id, finished_at, 'step_' || status, seq, step_id, attempt, owner,
       event_detail, claimed_at
FROM steps
WHERE event_id IS NOT NULL;

GRANT SELECT ON history TO onward_engine, onward_api;
