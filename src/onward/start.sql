-- name: start_run
-- Idempotent start (R1) and the write side of the outbox (R2), in one statement: the version
-- (latest, or the one asked for), the run, its first step, the outbox row that wakes a worker
-- and the first history rows commit together or not at all. No row returned: a duplicate start
-- key (ON CONFLICT DO NOTHING) or no such automation/version -- find_duplicate tells which.
WITH v AS (
    SELECT av.version, av.start_step_id, av.start_kind, av.start_lane, av.max_steps,
           av.max_age_s
    FROM automations a
    JOIN automation_versions av
      ON av.org_id = a.org_id AND av.automation_id = a.automation_id
     AND av.version = coalesce(%(version)s::int, a.latest_version)
    WHERE a.org_id = %(org_id)s AND a.automation_id = %(automation_id)s
),
org AS (
    INSERT INTO organisations (org_id) VALUES (%(org_id)s) ON CONFLICT (org_id) DO NOTHING
),
run AS (
    INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind, status,
                      input, ctx, visits, current_seq, max_steps, deadline_at, contact_id)
    SELECT %(org_id)s, %(run_id)s, %(automation_id)s, v.version, %(start_key)s,
           %(start_key_kind)s, 'active', %(input)s, '{"vars": {}, "steps": {}}',
           jsonb_build_object(v.start_step_id, 1), 1, v.max_steps,
           now() + make_interval(secs => v.max_age_s), %(contact_id)s
    FROM v
    ON CONFLICT (org_id, start_key) DO NOTHING
    RETURNING org_id, run_id, version
),
started AS (
    INSERT INTO history (org_id, run_id, event, detail)
    SELECT run.org_id, run.run_id, 'run_started',
           jsonb_build_object('automation_id', %(automation_id)s::text, 'version', v.version,
                              'start_key', %(start_key)s::text,
                              'start_key_kind', %(start_key_kind)s::text)
    FROM run, v
    RETURNING org_id, run_id
),
step AS (
    INSERT INTO steps (org_id, run_id, seq, step_id, kind, lane, iteration, status)
    SELECT run.org_id, run.run_id, 1, v.start_step_id, v.start_kind, v.start_lane, 1, 'ready'
    FROM run, v
    RETURNING org_id, run_id, seq, step_id, lane, attempt, available_at
),
ready AS (
    -- joined with `started` so the run's first history row is written before its step's
    SELECT step.org_id, step.run_id, step.seq, step.step_id, step.lane, step.attempt,
           step.available_at AS deliver_at, 'step_ready' AS event, NULL::text AS worker,
           jsonb_build_object('lane', step.lane) AS detail
    FROM step JOIN started ON started.org_id = step.org_id AND started.run_id = step.run_id
),
{{announce_ready}}
SELECT run_id, version FROM run;

-- name: find_duplicate
-- The run an earlier delivery started; records that a duplicate delivery was acknowledged.
WITH r AS (
    SELECT org_id, run_id FROM runs WHERE org_id = %(org_id)s AND start_key = %(start_key)s
),
h AS (
    INSERT INTO history (org_id, run_id, event, detail)
    SELECT org_id, run_id, 'start_duplicate', jsonb_build_object('start_key', %(start_key)s::text)
    FROM r
)
SELECT run_id FROM r;
