-- Migrating runs between versions (R11): run_migrations.py. Each run moves in one transaction
-- (the operation's batch), under the lock order of every transition that touches a run: the
-- run's transition lock (signals.lock_run), its timers (timers.lock_pending_of_run), its step,
-- its run row. A move writes one history row `run_migrated`.

-- name: versions
-- The two versions of a migration: their documents and budgets.
SELECT version, document, max_steps, max_age_s FROM automation_versions
WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s
  AND version = ANY(%(versions)s::int[]);

-- name: current_steps
-- The distinct steps the version's unfinished runs are at now (where "reachable" starts).
-- Served by runs_by_version, and each run's latest step by steps_pkey (a run's unfinished
-- step is its last: migration 0034).
SELECT DISTINCT s.step_id
FROM runs r
CROSS JOIN LATERAL (
    SELECT st.step_id, st.status FROM steps st
    WHERE st.org_id = r.org_id AND st.run_id = r.run_id
    ORDER BY st.seq DESC LIMIT 1
) s
WHERE r.org_id = (SELECT %(org_id)s::text) AND r.automation_id = %(automation_id)s
  AND s.status IN ('ready', 'running', 'waiting', 'parked')
  AND r.version = %(version)s AND r.finished_at IS NULL;

-- name: outputs
-- The latest output of each finished step of a run. A run's context keeps only the outputs
-- its version's expressions read (policy.outputs_read); the version it moves to may read
-- others. Served by steps_pkey. Each through onward_step_output (migration 0032).
SELECT DISTINCT ON (s.step_id) s.step_id, onward_step_output(s) AS output FROM steps s
WHERE s.org_id = (SELECT %(org_id)s::text) AND s.run_id = %(run_id)s
  AND s.status IN ('done', 'skipped')
ORDER BY s.step_id, s.seq DESC;

-- name: page
-- The next page of the version's unfinished runs after the cursor, in run id order, each with
-- its unfinished step and the status of that step's outside effect (its key names the step id
-- and iteration): what a batch moves and what a dry run describes. Served by runs_by_version,
-- and each run's step by steps_pkey on the run: its latest, kept when unfinished (migration
-- 0034; a lateral with a LIMIT: never the organisation's every step hashed against the page;
-- tests/integration/test_batch_plans.py).
SELECT r.run_id, r.status, s.seq, s.step_id, s.kind, s.lane, s.status AS step_status,
       s.wait_kind, s.iteration, e.status AS effect
FROM runs r
LEFT JOIN LATERAL (
    SELECT st.seq, st.step_id, st.kind, st.lane, st.status, st.wait_kind, st.iteration
    FROM steps st
    WHERE st.org_id = r.org_id AND st.run_id = r.run_id
    ORDER BY st.seq DESC LIMIT 1
) s ON s.status IN ('ready', 'running', 'waiting', 'parked')
LEFT JOIN effects e ON e.org_id = r.org_id
                   AND e.effect_key = r.run_id || '/' || s.step_id || '/' || s.iteration
WHERE r.org_id = (SELECT %(org_id)s::text) AND r.automation_id = %(automation_id)s
  AND r.version = %(version)s AND r.finished_at IS NULL AND r.run_id > %(after)s
ORDER BY r.run_id
LIMIT %(limit)s;

-- name: lock_step
-- The run's unfinished step, locked (after the transition lock and the timers), with its
-- effect's status: its latest step while unfinished (as actions.sql lock_step).
SELECT s.seq, s.step_id, s.kind, s.lane, s.status AS step_status, s.wait_kind, s.iteration,
       e.status AS effect
FROM steps s
LEFT JOIN effects e ON e.org_id = s.org_id
                   AND e.effect_key = s.run_id || '/' || s.step_id || '/' || s.iteration
WHERE s.org_id = (SELECT %(org_id)s::text) AND s.run_id = %(run_id)s
  AND s.seq = (SELECT max(l.seq) FROM steps l
               WHERE l.org_id = (SELECT %(org_id)s::text) AND l.run_id = %(run_id)s)
  AND s.status IN ('ready', 'running', 'waiting', 'parked')
FOR UPDATE OF s;

-- name: lock_run
-- The run row, locked after its step: its version now, whether it finished, what a move
-- rewrites.
SELECT run_id, automation_id, version, status, finished_at, ctx, visits, current_seq
FROM runs WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
FOR UPDATE;

-- name: move_step
-- The step takes its definition from the new version: its id, kind and lane, and the version
-- itself (the claim reads it from the locked step row). Status, attempt, failures, timers and
-- iteration stay.
UPDATE steps
SET step_id = %(step_id)s, kind = %(kind)s, lane = %(lane)s, version = %(to)s, updated_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND seq = %(seq)s
  AND status IN ('ready', 'waiting', 'parked');

-- name: move_run
-- The run is on the new version: its budget from it (steps, age from its creation), the
-- outputs and visit counts of renamed steps under their new ids too, its position and status;
-- and its history row `run_migrated` (detail: from, to, map, policy, by, and the step move).
WITH run AS (
    UPDATE runs r
    SET version = %(to)s, max_steps = %(max_steps)s,
        deadline_at = r.created_at + make_interval(secs => %(max_age_s)s),
        ctx = %(ctx)s, visits = %(visits)s, current_seq = %(current_seq)s,
        status = %(status)s, updated_at = now(),
        status_reason = CASE WHEN %(status)s = 'active' THEN NULL ELSE r.status_reason END
    WHERE r.org_id = (SELECT %(org_id)s::text) AND r.run_id = %(run_id)s AND r.version = %(from)s
      AND r.finished_at IS NULL
    RETURNING r.org_id, r.run_id
)
INSERT INTO history_log (org_id, run_id, event, seq, step_id, worker, detail)
SELECT org_id, run_id, 'run_migrated', %(seq)s, %(step_id)s, %(worker)s, %(detail)s FROM run
RETURNING run_id;

-- name: announce
-- A moved ready step whose lane changed: announced again in its new lane (its available_at
-- kept: a backoff still holds), through the shared make_ready.
WITH to_ready AS (
    SELECT %(org_id)s::text AS org_id, %(run_id)s::text AS run_id, %(seq)s::int AS seq,
           'ready' AS from_status, NULL::int AS attempt, st.available_at, NULL::jsonb AS wake,
           NULL::jsonb AS error, 'step_ready' AS event, %(worker)s::text AS worker,
           %(detail)s::jsonb AS detail
    FROM steps st
    WHERE st.org_id = (SELECT %(org_id)s::text) AND st.run_id = %(run_id)s AND st.seq = %(seq)s
),
{{make_ready}}
SELECT count(*) AS announced FROM ready;

-- name: reenter
-- A waiting step whose definition changed in a way that matters: it is ready now, woken by
-- nothing, so the new definition's handler runs from its start (its timers were closed), and
-- the run is active.
WITH to_ready AS (
    SELECT %(org_id)s::text AS org_id, %(run_id)s::text AS run_id, %(seq)s::int AS seq,
           'waiting' AS from_status, NULL::int AS attempt, now() AS available_at,
           NULL::jsonb AS wake, NULL::jsonb AS error, 'step_ready' AS event,
           %(worker)s::text AS worker, %(detail)s::jsonb AS detail
),
{{make_ready}},
run AS (
    UPDATE runs r SET status = 'active', updated_at = now()
    FROM ready WHERE r.org_id = ready.org_id AND r.run_id = ready.run_id
)
SELECT count(*) AS reentered FROM ready;

-- name: park
-- Policy park: the step's id has no counterpart in the new version. The step and the run park
-- for a person (wait_kind 'migration'), on the version they are on; history says why.
WITH s AS (
    UPDATE steps
    SET status = 'parked', wait_kind = 'migration', owner = NULL, lease_until = NULL,
        error = %(error)s, updated_at = now()
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND seq = %(seq)s
      AND status IN ('ready', 'waiting', 'parked')
    RETURNING org_id, run_id, seq, step_id
),
run AS (
    UPDATE runs r SET status = 'parked', status_reason = %(reason)s, updated_at = now()
    FROM s WHERE r.org_id = s.org_id AND r.run_id = s.run_id
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, worker, detail)
    SELECT s.org_id, s.run_id, e.event, e.seq, e.step_id, %(worker)s, e.detail
    FROM s CROSS JOIN LATERAL (VALUES
        (1, 'step_parked', s.seq, s.step_id, %(error)s::jsonb),
        (2, 'run_parked', NULL::int, NULL::text, jsonb_build_object('reason', %(reason)s::text))
    ) AS e(ord, event, seq, step_id, detail)
    ORDER BY e.ord
)
SELECT count(*) AS parked FROM s;

-- name: skip_step
-- Policy skip-to: the current step (its id removed) ends skipped, with its history row.
WITH s AS (
    UPDATE steps
    SET status = 'skipped', owner = NULL, lease_until = NULL, wait_kind = NULL,
        finished_at = now(), updated_at = now()
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND seq = %(seq)s
      AND status IN ('ready', 'waiting', 'parked')
    RETURNING org_id, run_id, seq, step_id
)
INSERT INTO history_log (org_id, run_id, event, seq, step_id, worker, detail)
SELECT org_id, run_id, 'step_skipped', seq, step_id, %(worker)s, %(detail)s FROM s
RETURNING seq;

-- name: enter_step
-- Policy skip-to: the chosen step of the new version is the run's next step, ready, announced
-- through the shared announce_ready (an outbox wake for its lane and `step_ready`).
WITH step AS (
    INSERT INTO steps (org_id, run_id, seq, step_id, kind, lane, iteration, status, version)
    VALUES (%(org_id)s, %(run_id)s, %(seq)s, %(step_id)s, %(kind)s, %(lane)s, %(iteration)s,
            'ready', %(to)s)
    RETURNING org_id, run_id, seq, step_id, lane, attempt, available_at
),
ready AS (
    SELECT org_id, run_id, seq, step_id, lane, attempt, available_at AS deliver_at,
           'step_ready' AS event, %(worker)s::text AS worker, %(detail)s::jsonb AS detail,
           NULL::timestamptz AS claimed_at
    FROM step
),
{{announce_ready}}
SELECT seq FROM step;
