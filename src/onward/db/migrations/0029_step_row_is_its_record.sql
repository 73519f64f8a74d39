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

-- Code from before this migration still writes `history` (INSERT, and retention's DELETE and
-- erasure's UPDATE): during a rolling deploy its processes run beside the new ones against the
-- migrated database. These INSTEAD OF triggers pass its writes to history_log, so an old
-- worker's settle still commits (its event then a row, as before) instead of failing on a
-- view. With the caller's rights, as the view's reads: each role's policies apply. Nothing
-- of this code writes the view (tests/integration/test_transitions.py checks old writes land).
CREATE FUNCTION onward_history_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO history_log (org_id, run_id, at, event, seq, step_id, attempt, worker, detail,
                                 claimed_at)
        VALUES (NEW.org_id, NEW.run_id, coalesce(NEW.at, clock_timestamp()), NEW.event, NEW.seq,
                NEW.step_id, NEW.attempt, NEW.worker, NEW.detail, NEW.claimed_at)
        RETURNING event_id, at INTO NEW.event_id, NEW.at;
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        UPDATE history_log
        SET at = NEW.at, event = NEW.event, seq = NEW.seq, step_id = NEW.step_id,
            attempt = NEW.attempt, worker = NEW.worker, detail = NEW.detail,
            claimed_at = NEW.claimed_at
        WHERE org_id = OLD.org_id AND run_id = OLD.run_id AND event_id = OLD.event_id;
        RETURN NEW;
    END IF;
    DELETE FROM history_log
    WHERE org_id = OLD.org_id AND run_id = OLD.run_id AND event_id = OLD.event_id;
    RETURN OLD;
END $$;

CREATE TRIGGER history_write INSTEAD OF INSERT OR UPDATE OR DELETE ON history
FOR EACH ROW EXECUTE FUNCTION onward_history_write();

GRANT INSERT, UPDATE, DELETE ON history TO onward_engine, onward_api;
