-- Cancellation (R12). A waiting, parked or ready run is cancelled at once: its step, its timers
-- and its pending approval close in the same transaction (cancel.py cancel_in_tx). A run with a
-- step in flight is marked cancel-requested and stops at its next safe point (the claim reads
-- runs.cancel_requested_at; policy.stop_check turns it into settle_stop 'cancelled').
-- Lock order, the same as a timer's fire and a signal's intake: the run's transition lock
-- (signals.lock_run), its timers, its step, its run row.

-- name: lock_step
-- The run's unfinished step, locked: its latest step while unfinished (as actions.sql
-- lock_step; migration 0034).
SELECT seq, step_id, status, wait_kind, attempt FROM steps
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
  AND seq = (SELECT max(l.seq) FROM steps l
             WHERE l.org_id = (SELECT %(org_id)s::text) AND l.run_id = %(run_id)s)
  AND status IN ('ready', 'running', 'waiting', 'parked')
FOR UPDATE;

-- name: lock_run
-- The run row, locked after its step.
SELECT run_id, automation_id, version, status, finished_at, cancel_requested_at
FROM runs WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
FOR UPDATE;

-- name: cancel_now
-- Nothing is executing: the step and the run end cancelled now, with their history rows.
WITH st AS (
    UPDATE steps
    SET status = 'cancelled', owner = NULL, lease_until = NULL, finished_at = now(),
        updated_at = now()
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND seq = %(seq)s
      AND status IN ('ready', 'waiting', 'parked')
    RETURNING org_id, run_id, seq, step_id
),
run AS (
    UPDATE runs r
    SET status = 'cancelled', status_reason = %(reason)s, finished_at = now(), updated_at = now(),
        cancel_requested_at = coalesce(r.cancel_requested_at, now()),
        cancel_requested_by = coalesce(r.cancel_requested_by, %(by)s)
    FROM st WHERE r.org_id = st.org_id AND r.run_id = st.run_id
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, worker, detail)
    SELECT st.org_id, st.run_id, e.event, e.seq, e.step_id, %(worker)s, e.detail
    FROM st CROSS JOIN LATERAL (VALUES
        ('step_cancelled', st.seq, st.step_id,
         jsonb_build_object('was', %(was)s::text, 'by', %(by)s::text)),
        ('run_cancelled', NULL::int, NULL::text,
         jsonb_build_object('reason', %(reason)s::text, 'by', %(by)s::text))
    ) AS e(event, seq, step_id, detail)
)
SELECT count(*) AS cancelled FROM st;

-- name: request
-- A step is in flight: ask it to stop at its next safe point (first request wins the
-- timestamp; a repeated request changes nothing and writes no history). A ready step (one
-- whose interrupted effect must be reconciled first) becomes claimable now.
WITH step AS (
    UPDATE steps SET available_at = least(available_at, now()), updated_at = now()
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND seq = %(seq)s AND status = 'ready'
),
run AS (
    UPDATE runs
    SET cancel_requested_at = now(), cancel_requested_by = %(by)s, updated_at = now()
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND finished_at IS NULL
      AND cancel_requested_at IS NULL
    RETURNING org_id, run_id
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, worker, detail)
    SELECT org_id, run_id, 'cancel_requested', %(seq)s, %(step_id)s, %(worker)s,
           jsonb_build_object('by', %(by)s::text, 'reason', %(reason)s::text)
    FROM run
)
SELECT count(*) AS requested FROM run;

-- name: batch_runs
-- The next page of unfinished runs an operation names, by run id (its cursor). Served by
-- runs_by_version (the unfinished runs, status included: migration 0025), automation named or not.
SELECT run_id FROM runs
WHERE org_id = (SELECT %(org_id)s::text) AND finished_at IS NULL AND run_id > %(after)s
  AND (%(automation_id)s::text IS NULL OR automation_id = %(automation_id)s)
  AND (%(version)s::int IS NULL OR version = %(version)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(contact_id)s::text IS NULL OR contact_id = %(contact_id)s)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s)
  AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s)
ORDER BY run_id
LIMIT %(limit)s;
