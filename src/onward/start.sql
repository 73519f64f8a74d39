-- name: start_run
-- Idempotent start (R1) and the write side of the outbox (R2), in one statement: the version
-- (latest, or the one asked for), the run, its first step, the outbox row that wakes a worker
-- and the first history rows commit together or not at all. A duplicate start key (ON CONFLICT
-- DO NOTHING) whose run this statement can see -- committed before it began, the usual case --
-- answers that run (created false) and records the acknowledged duplicate, in the same
-- statement: one commit. No row returned: a run a concurrent delivery committed while this
-- statement ran, or no such automation/version -- find_duplicate tells which.
WITH v AS (
    SELECT av.version, av.start_step_id, av.start_kind, av.start_lane, av.max_steps,
           av.max_age_s
    FROM automations a
    JOIN automation_versions av
      ON av.org_id = a.org_id AND av.automation_id = a.automation_id
     AND av.version = coalesce(%(version)s::int, a.latest_version)
    WHERE a.org_id = (SELECT %(org_id)s::text) AND a.automation_id = %(automation_id)s
),
org AS (
    INSERT INTO organisations (org_id) VALUES (%(org_id)s) ON CONFLICT (org_id) DO NOTHING
),
run AS (
    INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind, status,
                      input, ctx, visits, current_seq, max_steps, deadline_at, contact_id,
                      traceparent)
    SELECT %(org_id)s, %(run_id)s, %(automation_id)s, v.version, %(start_key)s,
           %(start_key_kind)s, 'active', %(input)s, '{"vars": {}, "steps": {}}',
           jsonb_build_object(v.start_step_id, 1), 1, v.max_steps,
           now() + make_interval(secs => v.max_age_s), %(contact_id)s, %(traceparent)s::text
    FROM v
    ON CONFLICT (org_id, start_key) DO NOTHING
    RETURNING org_id, run_id, version
),
started AS (
    INSERT INTO history_log (org_id, run_id, event, detail)
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
           jsonb_build_object('lane', step.lane) AS detail, NULL::timestamptz AS claimed_at
    FROM step JOIN started ON started.org_id = step.org_id AND started.run_id = step.run_id
),
{{announce_ready}},
earlier AS (
    SELECT r.org_id, r.run_id FROM runs r
    WHERE r.org_id = (SELECT %(org_id)s::text) AND r.start_key = %(start_key)s
      AND NOT EXISTS (SELECT 1 FROM run)
),
duplicate AS (
    INSERT INTO history_log (org_id, run_id, event, detail)
    SELECT org_id, run_id, 'start_duplicate', jsonb_build_object('start_key', %(start_key)s::text)
    FROM earlier
)
SELECT run_id, version, true AS created FROM run
UNION ALL
SELECT run_id, NULL, false FROM earlier;

-- name: find_duplicate
-- The run an earlier delivery started; records that a duplicate delivery was acknowledged.
WITH r AS (
    SELECT org_id, run_id FROM runs
    WHERE org_id = (SELECT %(org_id)s::text) AND start_key = %(start_key)s
),
h AS (
    INSERT INTO history_log (org_id, run_id, event, detail)
    SELECT org_id, run_id, 'start_duplicate', jsonb_build_object('start_key', %(start_key)s::text)
    FROM r
)
SELECT run_id FROM r;

-- name: start_many
-- start_run for a batch (Engine.start_many, and concurrent Engine.start calls written together
-- by start.StartBatcher), in one statement: items, one jsonb array in request order (idx),
-- each with its run id, start key and input already made (and its own traceparent, or the
-- batch's). Every item
-- names a published version -- or its start key exists already -- or nothing is written and
-- the items that do not are answered `unknown`. The first item of each new start key makes its
-- run, first step, wake and history as start_run does; the others answer a run that existed
-- before this statement or that an earlier item of the batch made, and write start_duplicate
-- (after the run's own first rows) as find_duplicate does. Runs are inserted in start-key
-- order, so two batches with overlapping keys wait on each other's rows in one order and
-- cannot deadlock. An item answered with no run (its key was inserted by a transaction that
-- committed after this statement's snapshot) is found by find_duplicates.
WITH item AS (
    SELECT i.idx, i.run_id, i.automation_id, i.version AS asked, i.start_key, i.start_key_kind,
           i.input, i.contact_id, i.traceparent
    FROM jsonb_to_recordset(%(items)s::jsonb)
         AS i(idx int, run_id text, automation_id text, version int, start_key text,
              start_key_kind text, input jsonb, contact_id text, traceparent text)
),
v AS (
    -- each item with its version (latest, or the one asked for); version NULL: none such
    SELECT item.*, av.version, av.start_step_id, av.start_kind, av.start_lane, av.max_steps,
           av.max_age_s
    FROM item
    LEFT JOIN automations a
      ON a.org_id = (SELECT %(org_id)s::text) AND a.automation_id = item.automation_id
    LEFT JOIN automation_versions av
      ON av.org_id = a.org_id AND av.automation_id = a.automation_id
     AND av.version = coalesce(item.asked, a.latest_version)
),
earlier AS (
    -- the runs of these start keys that this statement's snapshot sees: one probe of
    -- runs_org_id_start_key_key per key (LIMIT keeps the planner from scanning the whole
    -- organisation's runs for a hash join when its statistics are stale). The organisation is
    -- a value the planner does not see, `(SELECT ...)`, as in every statement: as a constant,
    -- an organisation the statistics do not know yet (a new tenant) reads as one row, and any
    -- index that leads with org_id ties with the key's own -- the bench's live run read
    -- runs_pkey and filtered on the key, every run of the organisation for each key
    -- (tests/integration/test_batch_plans.py, tests/contracts/test_code.py)
    SELECT k.start_key, r.run_id
    FROM (SELECT DISTINCT start_key FROM item) k
    CROSS JOIN LATERAL (
        SELECT run_id FROM runs
        WHERE runs.org_id = (SELECT %(org_id)s::text) AND runs.start_key = k.start_key
        LIMIT 1
    ) r
),
unknown AS (
    SELECT v.idx FROM v
    WHERE v.version IS NULL AND NOT EXISTS (SELECT 1 FROM earlier e WHERE e.start_key = v.start_key)
),
whole AS (
    SELECT NOT EXISTS (SELECT 1 FROM unknown) AS ok
),
first AS (
    -- the first item of each start key, if every item is known (a key that has a run already
    -- is left to ON CONFLICT: filtering it here makes the planner expect almost no rows and
    -- join the inserts below by nested loops)
    SELECT DISTINCT ON (v.start_key) v.*
    FROM v
    WHERE v.version IS NOT NULL AND (SELECT ok FROM whole)
    ORDER BY v.start_key, v.idx
),
org AS (
    INSERT INTO organisations (org_id) VALUES (%(org_id)s) ON CONFLICT (org_id) DO NOTHING
),
run AS (
    INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind, status,
                      input, ctx, visits, current_seq, max_steps, deadline_at, contact_id,
                      traceparent)
    SELECT %(org_id)s, f.run_id, f.automation_id, f.version, f.start_key, f.start_key_kind,
           'active', f.input, '{"vars": {}, "steps": {}}', jsonb_build_object(f.start_step_id, 1),
           1, f.max_steps, now() + make_interval(secs => f.max_age_s), f.contact_id,
           coalesce(f.traceparent, %(traceparent)s::text)
    FROM first f
    ORDER BY f.start_key
    ON CONFLICT (org_id, start_key) DO NOTHING
    RETURNING org_id, run_id, automation_id, version, start_key, start_key_kind
),
started AS (
    INSERT INTO history_log (org_id, run_id, event, detail)
    SELECT run.org_id, run.run_id, 'run_started',
           jsonb_build_object('automation_id', run.automation_id, 'version', run.version,
                              'start_key', run.start_key, 'start_key_kind', run.start_key_kind)
    FROM run
    RETURNING org_id, run_id
),
step AS (
    INSERT INTO steps (org_id, run_id, seq, step_id, kind, lane, iteration, status)
    SELECT run.org_id, run.run_id, 1, f.start_step_id, f.start_kind, f.start_lane, 1, 'ready'
    FROM run JOIN first f ON f.run_id = run.run_id
    RETURNING org_id, run_id, seq, step_id, lane, attempt, available_at
),
ready AS (
    -- joined with `started` so each run's first history row is written before its step's
    SELECT step.org_id, step.run_id, step.seq, step.step_id, step.lane, step.attempt,
           step.available_at AS deliver_at, 'step_ready' AS event, NULL::text AS worker,
           jsonb_build_object('lane', step.lane) AS detail, NULL::timestamptz AS claimed_at
    FROM step JOIN started ON started.org_id = step.org_id AND started.run_id = step.run_id
),
{{announce_ready}},
answer AS (
    SELECT v.idx, v.start_key, coalesce(n.run_id, e.run_id) AS run_id,
           coalesce(n.run_id = v.run_id, false) AS created, u.idx IS NOT NULL AS unknown
    FROM v
    LEFT JOIN run n ON n.start_key = v.start_key
    LEFT JOIN earlier e ON e.start_key = v.start_key
    LEFT JOIN unknown u ON u.idx = v.idx
),
duplicate AS (
    -- after the run's own run_started when this batch made it (joined with `started`)
    INSERT INTO history_log (org_id, run_id, event, detail)
    SELECT %(org_id)s, a.run_id, 'start_duplicate', jsonb_build_object('start_key', a.start_key)
    FROM answer a
    LEFT JOIN started s ON s.run_id = a.run_id
    WHERE a.run_id IS NOT NULL AND NOT a.created AND (SELECT ok FROM whole)
    ORDER BY a.idx
)
SELECT idx, run_id, created, unknown FROM answer ORDER BY idx;

-- name: find_duplicates
-- find_duplicate for several start keys at once (one per item: a key may repeat): the runs,
-- and one start_duplicate row per item that found its run.
WITH k AS (
    SELECT unnest(%(start_keys)s::text[]) AS start_key
),
r AS (
    SELECT org_id, run_id, start_key FROM runs
    WHERE org_id = (SELECT %(org_id)s::text) AND start_key = ANY(%(start_keys)s::text[])
),
h AS (
    INSERT INTO history_log (org_id, run_id, event, detail)
    SELECT r.org_id, r.run_id, 'start_duplicate', jsonb_build_object('start_key', r.start_key)
    FROM k JOIN r ON r.start_key = k.start_key
)
SELECT start_key, run_id FROM r;

-- name: fork_run
-- A new run made from a finished one (an operator's retry from a chosen step), in one
-- statement: the run (same input and contact, forked_from the old run, the variables and
-- outputs of the steps before the chosen one in ctx), copies of those done steps (not run
-- again), the chosen step ready at the same seq, a wake, and the history of both runs
-- (run_forked). No row: the fork's start key exists already (find_duplicate), or no such
-- version.
WITH v AS (
    SELECT version, max_steps, max_age_s FROM automation_versions
    WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s AND version = %(version)s
),
old AS (
    SELECT org_id, run_id, input, contact_id FROM runs
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(from_run_id)s
),
run AS (
    INSERT INTO runs (org_id, run_id, automation_id, version, start_key, start_key_kind, status,
                      input, ctx, visits, current_seq, max_steps, deadline_at, contact_id,
                      forked_from)
    SELECT old.org_id, %(run_id)s, %(automation_id)s, v.version, %(start_key)s, 'fork', 'active',
           old.input, %(ctx)s, %(visits)s, %(seq)s, v.max_steps,
           now() + make_interval(secs => v.max_age_s), old.contact_id, old.run_id
    FROM v, old
    ON CONFLICT (org_id, start_key) DO NOTHING
    RETURNING org_id, run_id, version
),
copied AS (
    INSERT INTO steps (org_id, run_id, seq, step_id, kind, lane, iteration, status, attempt,
                       output, vars, created_at, finished_at)
    SELECT s.org_id, run.run_id, s.seq, s.step_id, s.kind, s.lane, s.iteration, s.status,
           s.attempt, s.output, s.vars, s.created_at, s.finished_at
    FROM steps s JOIN run ON run.org_id = s.org_id
    WHERE s.org_id = (SELECT %(org_id)s::text) AND s.run_id = %(from_run_id)s AND s.seq < %(seq)s
      AND s.status IN ('done', 'skipped')
),
started AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, detail)
    SELECT run.org_id, run.run_id, e.event, e.seq, e.step_id, e.detail
    FROM run CROSS JOIN LATERAL (VALUES
        (1, 'run_started', NULL::int, NULL::text,
         jsonb_build_object('automation_id', %(automation_id)s::text, 'version', run.version,
                            'start_key', %(start_key)s::text, 'start_key_kind', 'fork',
                            'forked_from', %(from_run_id)s::text)),
        (2, 'run_forked', %(seq)s::int, %(step_id)s::text,
         jsonb_build_object('forked_from', %(from_run_id)s::text, 'from_step', %(step_id)s::text,
                            'seq', %(seq)s::int, 'version', run.version, 'by', %(by)s::text))
    ) AS e(ord, event, seq, step_id, detail)
    ORDER BY e.ord
    RETURNING org_id, run_id
),
old_history AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, detail)
    SELECT old.org_id, old.run_id, 'run_forked', %(seq)s, %(step_id)s,
           jsonb_build_object('fork', run.run_id, 'from_step', %(step_id)s::text,
                              'seq', %(seq)s::int, 'version', run.version, 'by', %(by)s::text)
    FROM old JOIN run ON run.org_id = old.org_id
),
step AS (
    INSERT INTO steps (org_id, run_id, seq, step_id, kind, lane, iteration, status)
    SELECT run.org_id, run.run_id, %(seq)s, %(step_id)s, %(kind)s, %(lane)s, %(iteration)s, 'ready'
    FROM run
    RETURNING org_id, run_id, seq, step_id, lane, attempt, available_at
),
ready AS (
    -- after `started`, so the fork's first history rows come before its step's
    SELECT step.org_id, step.run_id, step.seq, step.step_id, step.lane, step.attempt,
           step.available_at AS deliver_at, 'step_ready' AS event, NULL::text AS worker,
           jsonb_build_object('lane', step.lane, 'iteration', %(iteration)s::int) AS detail,
           NULL::timestamptz AS claimed_at
    FROM step WHERE EXISTS (SELECT 1 FROM started)
),
{{announce_ready}}
SELECT run_id, version FROM run;
