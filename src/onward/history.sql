-- The run history (R17): append-only, written by each transition in its own transaction. Read
-- through the view `history` (migration 0029): the rows of history_log, and the settle events
-- that step rows carry (a grouped settle writes its event on the step row, not a row here).

-- name: for_run
-- Every transition of one run, in order. claimed_at: on a row that ends an attempt, when it
-- was claimed.
SELECT event_id, at, event, seq, step_id, attempt, worker, claimed_at, detail
FROM history WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
ORDER BY event_id;

-- name: run_summary
-- The run row shown above its timeline, as it is now (onward_run_now: a row left behind by
-- a step that runs is shown caught up, migration 0030).
SELECT r.run_id, r.automation_id, r.version, r.start_key, r.start_key_kind, r.status,
       r.status_reason, r.input, n.ctx, n.current_seq, n.steps_executed, r.max_steps,
       r.deadline_at, r.created_at, r.finished_at
FROM runs r CROSS JOIN LATERAL onward_run_now(r) AS n
WHERE r.org_id = (SELECT %(org_id)s::text) AND r.run_id = %(run_id)s;

-- name: run_status
-- One run's status (polled by Engine.wait).
SELECT status FROM runs WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s;

-- name: steps_of_run
-- The step rows of one run (a step's output through onward_step_output: one stored as the
-- step's variables reads as them, migration 0032).
SELECT s.seq, s.step_id, s.kind, s.lane, s.iteration, s.status, s.attempt, s.owner,
       s.claimed_at, s.lease_until, s.available_at, s.wait_kind, onward_step_output(s) AS output,
       s.error, s.created_at, s.finished_at
FROM steps s WHERE s.org_id = (SELECT %(org_id)s::text) AND s.run_id = %(run_id)s ORDER BY s.seq;

-- name: list_runs
-- Newest runs first, optionally filtered by status and automation; each run's step count as
-- it is now (onward_run_now, migration 0030).
SELECT r.run_id, r.automation_id, r.version, r.status, r.status_reason, n.steps_executed,
       r.created_at, r.finished_at
FROM runs r CROSS JOIN LATERAL onward_run_now(r) AS n
WHERE r.org_id = (SELECT %(org_id)s::text)
  AND (%(status)s::text IS NULL OR r.status = %(status)s)
  AND (%(automation_id)s::text IS NULL OR r.automation_id = %(automation_id)s)
ORDER BY r.created_at DESC
LIMIT %(limit)s;
