-- name: start_run
-- Idempotent start (R1) and the write side of the outbox (R2): the run, its first step, the
-- outbox row that wakes a worker and the first history row commit together or not at all.
-- A second start with the same (org_id, start_key) inserts nothing and returns no row.
WITH org AS (
    INSERT INTO organisations (org_id) VALUES (%(org_id)s) ON CONFLICT (org_id) DO NOTHING
),
run AS (
    INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind, status,
                      input, ctx, visits, current_seq, max_steps, deadline_at, contact_id)
    VALUES (%(org_id)s, %(run_id)s, %(automation_id)s, %(version)s, %(start_key)s,
            %(start_key_kind)s, 'active', %(input)s, '{"vars": {}, "steps": {}}',
            jsonb_build_object(%(step_id)s::text, 1), 1, %(max_steps)s,
            now() + make_interval(secs => %(max_age)s), %(contact_id)s)
    ON CONFLICT (org_id, start_key) DO NOTHING
    RETURNING org_id, run_id
),
step AS (
    INSERT INTO steps (org_id, run_id, seq, step_id, kind, lane, iteration, status)
    SELECT org_id, run_id, 1, %(step_id)s, %(kind)s, %(lane)s, 1, 'ready' FROM run
),
wake AS (
    INSERT INTO outbox (org_id, topic, job_id, lane, payload)
    SELECT org_id, 'step', 'wake:' || run_id || ':1:1', %(lane)s,
           jsonb_build_object('run_id', run_id, 'seq', 1)
    FROM run
),
hist AS (
    INSERT INTO history (org_id, run_id, event, seq, step_id, detail)
    SELECT org_id, run_id, e.event, e.seq, e.step_id, e.detail
    FROM run CROSS JOIN (VALUES
        ('run_started', NULL::int, NULL::text,
         jsonb_build_object('automation_id', %(automation_id)s::text, 'version', %(version)s::int,
                            'start_key', %(start_key)s::text, 'start_key_kind', %(start_key_kind)s::text)),
        ('step_ready', 1, %(step_id)s::text, jsonb_build_object('lane', %(lane)s::text))
    ) AS e(event, seq, step_id, detail)
)
SELECT run_id FROM run;

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
