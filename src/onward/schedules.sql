-- Schedules that start runs (issue 10): synced by publish, fired by the elected sweeper,
-- paused, resumed and triggered by people. The runs themselves are started by
-- onward.start.start_run (one statement, idempotent by the firing's start key).

-- name: clock
-- The database clock: every instant a schedule is compared with.
SELECT now() AS now;

-- name: lock_automation_schedules
-- Publish: the automation's schedule rows, locked until the version's transaction ends.
SELECT schedule_id, rule, zone, start_at, end_at, jitter_s, next_instant, next_fire_at,
       buffered_instant, error
FROM schedules
WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s
ORDER BY schedule_id
FOR UPDATE;

-- name: sync
-- Publish: the schedules of the new version, as computed by the caller (new rows inserted,
-- existing ones updated with paused and their firing record kept), and the rows the document
-- no longer has deleted. One statement, in the version's transaction.
WITH incoming AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS x(
        schedule_id text, rule text, zone text, start_at timestamptz, end_at timestamptz,
        jitter_s double precision, overlap text, catch_up text, input jsonb,
        next_instant timestamptz, next_fire_at timestamptz)
),
removed AS (
    DELETE FROM schedules s
    WHERE s.org_id = (SELECT %(org_id)s::text) AND s.automation_id = %(automation_id)s
      AND s.schedule_id NOT IN (SELECT schedule_id FROM incoming)
    RETURNING s.schedule_id
),
written AS (
    INSERT INTO schedules (org_id, automation_id, schedule_id, version, rule, zone, start_at,
                           end_at, jitter_s, overlap, catch_up, input, next_instant,
                           next_fire_at)
    SELECT %(org_id)s, %(automation_id)s, i.schedule_id, %(version)s, i.rule, i.zone,
           i.start_at, i.end_at, i.jitter_s, i.overlap, i.catch_up, coalesce(i.input, '{}'),
           i.next_instant, i.next_fire_at
    FROM incoming i
    ON CONFLICT (org_id, automation_id, schedule_id) DO UPDATE
    SET version = EXCLUDED.version, rule = EXCLUDED.rule, zone = EXCLUDED.zone,
        start_at = EXCLUDED.start_at, end_at = EXCLUDED.end_at, jitter_s = EXCLUDED.jitter_s,
        overlap = EXCLUDED.overlap, catch_up = EXCLUDED.catch_up, input = EXCLUDED.input,
        next_instant = EXCLUDED.next_instant, next_fire_at = EXCLUDED.next_fire_at,
        error = NULL, updated_at = now()
    RETURNING schedule_id
)
SELECT (SELECT count(*) FROM written) AS written, (SELECT count(*) FROM removed) AS removed;

-- name: due_orgs
-- The next page of organisations that have active schedules, after the rotation cursor: a
-- skip scan over schedules_due (one index probe per organisation), so organisations without
-- schedules cost nothing and the cost never depends on how many schedules are due.
WITH RECURSIVE o AS (
    (SELECT org_id FROM schedules
     WHERE org_id > %(after)s AND NOT paused AND next_fire_at IS NOT NULL
     ORDER BY org_id LIMIT 1)
    UNION ALL
    SELECT (SELECT s.org_id FROM schedules s
            WHERE s.org_id > o.org_id AND NOT s.paused AND s.next_fire_at IS NOT NULL
            ORDER BY s.org_id LIMIT 1)
    FROM o WHERE o.org_id IS NOT NULL
)
SELECT org_id FROM o WHERE org_id IS NOT NULL LIMIT %(limit)s;

-- name: claim_due
-- The due schedules of those organisations: a bounded index scan per organisation on
-- schedules_due, locked FOR UPDATE SKIP LOCKED (two sweepers never hold one schedule), then an
-- overall batch limit. With the database clock and whether the schedule's last run is
-- unfinished (the overlap policy's question).
SELECT s.org_id, s.automation_id, s.schedule_id, s.rule, s.zone, s.start_at, s.end_at,
       s.jitter_s, s.overlap, s.catch_up, s.input, s.next_instant, s.next_fire_at,
       s.buffered_instant, s.last_run_id,
       (r.run_id IS NOT NULL AND r.finished_at IS NULL) AS busy, now() AS now
FROM unnest(%(org_ids)s::text[]) AS o(org_id)
CROSS JOIN LATERAL (
    SELECT schedules.* FROM schedules
    WHERE schedules.org_id = o.org_id AND NOT schedules.paused
      AND schedules.next_fire_at <= now()
    ORDER BY schedules.next_fire_at
    LIMIT %(per_org)s
    FOR UPDATE SKIP LOCKED
) AS s
LEFT JOIN runs r ON r.org_id = s.org_id AND r.run_id = s.last_run_id
ORDER BY s.org_id, s.next_fire_at
LIMIT %(batch)s;

-- name: advance
-- After a visit of the sweep: the next instant, the buffer, what the last firing did, the
-- counters. The row is locked by claim_due in the same transaction.
UPDATE schedules
SET next_instant = %(next_instant)s, next_fire_at = %(next_fire_at)s,
    buffered_instant = %(buffered_instant)s,
    last_instant = coalesce(%(last_instant)s, last_instant),
    last_outcome = coalesce(%(last_outcome)s, last_outcome),
    last_fired_at = CASE WHEN %(fired)s > 0 THEN now() ELSE last_fired_at END,
    last_run_id = coalesce(%(last_run_id)s, last_run_id),
    fired_count = fired_count + %(fired)s, skipped_count = skipped_count + %(skipped)s,
    error = %(error)s, updated_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s
  AND schedule_id = %(schedule_id)s;

-- name: lock_one
-- One schedule, locked (waiting for a sweep that holds it), with the database clock and its
-- last run: what pause, resume and trigger decide from.
SELECT s.org_id, s.automation_id, s.schedule_id, s.rule, s.zone, s.start_at, s.end_at,
       s.jitter_s, s.overlap, s.catch_up, s.input, s.paused, s.next_instant, s.next_fire_at,
       s.buffered_instant, s.last_run_id, r.start_key AS last_run_key,
       (r.run_id IS NOT NULL AND r.finished_at IS NULL) AS busy, now() AS now
FROM schedules s
LEFT JOIN runs r ON r.org_id = s.org_id AND r.run_id = s.last_run_id
WHERE s.org_id = (SELECT %(org_id)s::text) AND s.automation_id = %(automation_id)s
  AND s.schedule_id = %(schedule_id)s
FOR UPDATE OF s;

-- name: pause
-- A paused schedule fires nothing (the sweep's claim skips it); pausing twice keeps the first
-- paused_at.
UPDATE schedules SET paused = true, paused_at = coalesce(paused_at, now()), updated_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s
  AND schedule_id = %(schedule_id)s
RETURNING schedule_id;

-- name: resume
-- Resume a paused schedule at the instant the caller chose: the next one after now (the paused
-- period is not replayed), or, with catch-up, the one it stopped at.
UPDATE schedules
SET paused = false, paused_at = NULL, next_instant = %(next_instant)s,
    next_fire_at = %(next_fire_at)s, error = %(error)s, updated_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s
  AND schedule_id = %(schedule_id)s AND paused;

-- name: record_trigger
-- A person fired the schedule now: the run it started (or why it did not start).
UPDATE schedules
SET last_outcome = %(outcome)s, last_run_id = coalesce(%(run_id)s, last_run_id),
    last_fired_at = CASE WHEN %(fired)s > 0 THEN now() ELSE last_fired_at END,
    fired_count = fired_count + %(fired)s, skipped_count = skipped_count + %(skipped)s,
    updated_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s
  AND schedule_id = %(schedule_id)s;

-- name: list
-- The schedules of an organisation (of one automation, or one schedule), with the status of
-- each one's last run.
SELECT s.automation_id, s.schedule_id, s.version, s.rule, s.zone, s.start_at, s.end_at,
       s.jitter_s, s.overlap, s.catch_up, s.input, s.paused, s.paused_at, s.next_instant,
       s.next_fire_at, s.buffered_instant, s.last_instant, s.last_outcome, s.last_fired_at,
       s.last_run_id, r.status AS last_run_status, s.fired_count, s.skipped_count, s.error,
       s.created_at, s.updated_at
FROM schedules s
LEFT JOIN runs r ON r.org_id = s.org_id AND r.run_id = s.last_run_id
WHERE s.org_id = (SELECT %(org_id)s::text)
  AND (%(automation_id)s::text IS NULL OR s.automation_id = %(automation_id)s::text)
  AND (%(schedule_id)s::text IS NULL OR s.schedule_id = %(schedule_id)s::text)
ORDER BY s.automation_id, s.schedule_id
LIMIT %(limit)s;
