-- Operator actions (B2/B3): resolve a run parked for review, resume a parked run, and read
-- what a fork copies. Resolve and resume each run in one transaction with the run's
-- transition lock taken first (signals.lock_run), then its step, then its run row -- the
-- order of cancel.py, a timer's fire and a signal's intake. A fork is written by the start
-- module (start.sql fork_run).

-- name: lock_step
-- The run's unfinished step, locked: its latest step while unfinished (a run has at most one
-- unfinished step, always its last: migration 0034), found by steps_pkey.
SELECT seq, step_id, kind, iteration, status, wait_kind, error FROM steps
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
  AND seq = (SELECT max(l.seq) FROM steps l
             WHERE l.org_id = (SELECT %(org_id)s::text) AND l.run_id = %(run_id)s)
  AND status IN ('ready', 'running', 'waiting', 'parked')
FOR UPDATE;

-- name: lock_run
-- The run row, locked after its step.
SELECT run_id, automation_id, version, status, finished_at FROM runs
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
FOR UPDATE;

-- name: make_ready
-- A person acted: the parked step (still parked on %(wait_kind)s) is ready now, same step, next
-- attempt, with its wake and the history row of the action (%(event)s: step_resumed or
-- review_resolved, detail naming who), and its run is active again.
WITH to_ready AS (
    SELECT %(org_id)s::text AS org_id, %(run_id)s::text AS run_id, %(seq)s::int AS seq,
           'parked' AS from_status, NULL::int AS attempt, now() AS available_at,
           %(wake)s::jsonb AS wake, NULL::jsonb AS error, %(event)s::text AS event,
           %(worker)s::text AS worker, %(detail)s::jsonb AS detail
    FROM steps
    -- `(SELECT 'parked'::text)`: a value the planner does not see, so the step is read by its
    -- key, never through steps_parked (every step of the organisation parked on that kind)
    -- whenever its statistics call that index nearly empty (tests/integration/test_batch_plans.py)
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND seq = %(seq)s
      AND status = (SELECT 'parked'::text) AND wait_kind = %(wait_kind)s
),
{{make_ready}},
run AS (
    UPDATE runs r SET status = 'active', status_reason = NULL, updated_at = now()
    FROM ready
    WHERE r.org_id = ready.org_id AND r.run_id = ready.run_id AND r.status = ready.from_status
)
SELECT run_id, seq, step_id FROM ready;

-- name: fork_source
-- The run a fork is asked of: its status, automation, version and what it knew at its end
-- (or knows now: onward_run_now, migration 0030).
SELECT r.run_id, r.automation_id, r.version, r.status, r.finished_at, n.ctx
FROM runs r CROSS JOIN LATERAL onward_run_now(r) AS n
WHERE r.org_id = (SELECT %(org_id)s::text) AND r.run_id = %(run_id)s;

-- name: fork_steps
-- Every step entry of that run, in order: the chosen one, and the outputs and variables of
-- those before it (each output through onward_step_output, migration 0032).
SELECT s.seq, s.step_id, s.kind, s.status, s.iteration, onward_step_output(s) AS output, s.vars
FROM steps s
WHERE s.org_id = (SELECT %(org_id)s::text) AND s.run_id = %(run_id)s
ORDER BY s.seq;
