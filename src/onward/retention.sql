-- Retention: finished runs older than their organisation's bound are deleted with every row of
-- theirs, in bounded batches, one transaction per batch (onward.retention).

-- name: set_days
-- An organisation's retention in days: NULL uses the engine's default, 'Infinity' keeps
-- finished runs forever.
INSERT INTO organisations (org_id, retention_days) VALUES (%(org_id)s, %(days)s)
ON CONFLICT (org_id) DO UPDATE SET retention_days = EXCLUDED.retention_days
RETURNING retention_days;

-- name: overview
-- One organisation's retention: its own setting, the bound in force (its own, else the
-- default; never under one day), the cutoff it gives, and its oldest finished run (the first
-- entry of runs_finished).
WITH o AS (
    SELECT (SELECT retention_days FROM organisations WHERE org_id = (SELECT %(org_id)s::text)) AS own
), e AS (
    SELECT own, coalesce(own, %(default_days)s::float8) AS days FROM o
)
SELECT e.own, e.days,
       CASE WHEN e.days < 'infinity'
            THEN coalesce(%(now)s::timestamptz, now()) - greatest(e.days, 1) * interval '1 day'
       END AS cutoff,
       (SELECT min(finished_at) FROM runs
        WHERE org_id = (SELECT %(org_id)s::text) AND finished_at IS NOT NULL) AS oldest_finished_at,
       coalesce(%(now)s::timestamptz, now()) AS at
FROM e;

-- name: count_due
-- How many finished runs of the organisation are past the cutoff (a range of runs_finished).
SELECT count(*) AS due FROM runs
WHERE org_id = (SELECT %(org_id)s::text) AND finished_at IS NOT NULL AND finished_at < %(cutoff)s;

-- name: due_orgs
-- The next page of organisations (by org_id, after the cursor) with a finished run past their
-- bound, each with its cutoff: one probe of runs_finished per organisation. Organisations kept
-- forever (or with no bound at all) are skipped.
SELECT o.org_id, c.cutoff
FROM organisations o
CROSS JOIN LATERAL (
    SELECT coalesce(%(now)s::timestamptz, now())
           - greatest(coalesce(o.retention_days, %(default_days)s::float8), 1)
             * interval '1 day' AS cutoff
) AS c
WHERE o.org_id > %(after)s
  AND coalesce(o.retention_days, %(default_days)s::float8) < 'infinity'
  AND EXISTS (SELECT 1 FROM runs r
              WHERE r.org_id = o.org_id AND r.finished_at IS NOT NULL
                AND r.finished_at < c.cutoff)
ORDER BY o.org_id
LIMIT %(limit)s;

-- name: pick
-- The oldest finished runs past the cutoff, at most %(limit)s, locked for this batch. SKIP
-- LOCKED: a run someone holds (a cancel answering "already finished", a second pruner during a
-- leader handover) is left to the next batch; nobody waits on the pruner for it.
SELECT run_id FROM runs
WHERE org_id = (SELECT %(org_id)s::text) AND finished_at IS NOT NULL AND finished_at < %(cutoff)s
ORDER BY finished_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: delete_runs
-- Every row of these finished runs, in one statement (so in one transaction: no run is ever
-- half deleted), each table by an index that leads with (org_id, run_id) -- effects_by_run,
-- signals_by_run and correlations_by_run come from 0011_erasure -- and the budget rows by the effect
-- keys of the run (its effects' and its steps'). Unsent outbox wakes naming the runs go too
-- (outbox_unsent); sent ones are the relay's to prune. Answers the rows deleted per table.
WITH eff AS (
    DELETE FROM effects WHERE org_id = (SELECT %(org_id)s::text) AND run_id = ANY (%(run_ids)s::text[])
    RETURNING effect_key
), keys AS (
    SELECT effect_key FROM eff
    UNION
    SELECT run_id || '/' || step_id || '/' || iteration FROM steps
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = ANY (%(run_ids)s::text[])
), charges AS (
    DELETE FROM budget_charges
    WHERE org_id = (SELECT %(org_id)s::text) AND effect_key IN (SELECT effect_key FROM keys) RETURNING 1
), reservations AS (
    DELETE FROM budget_reservations
    WHERE org_id = (SELECT %(org_id)s::text) AND effect_key IN (SELECT effect_key FROM keys) RETURNING 1
), hist AS (
    DELETE FROM history_log WHERE org_id = (SELECT %(org_id)s::text) AND run_id = ANY (%(run_ids)s::text[])
    RETURNING 1
), st AS (
    DELETE FROM steps WHERE org_id = (SELECT %(org_id)s::text) AND run_id = ANY (%(run_ids)s::text[])
    RETURNING 1
), tm AS (
    DELETE FROM timers WHERE org_id = (SELECT %(org_id)s::text) AND run_id = ANY (%(run_ids)s::text[])
    RETURNING 1
), ap AS (
    DELETE FROM approvals WHERE org_id = (SELECT %(org_id)s::text) AND run_id = ANY (%(run_ids)s::text[])
    RETURNING 1
), sg AS (
    DELETE FROM signals WHERE org_id = (SELECT %(org_id)s::text) AND run_id = ANY (%(run_ids)s::text[])
    RETURNING 1
), co AS (
    DELETE FROM correlations WHERE org_id = (SELECT %(org_id)s::text) AND run_id = ANY (%(run_ids)s::text[])
    RETURNING 1
), slots AS (
    DELETE FROM limit_slots WHERE org_id = (SELECT %(org_id)s::text) AND run_id = ANY (%(run_ids)s::text[])
    RETURNING 1
), bookings AS (
    DELETE FROM limit_bookings WHERE org_id = (SELECT %(org_id)s::text) AND run_id = ANY (%(run_ids)s::text[])
    RETURNING 1
), wakes AS (
    DELETE FROM outbox
    WHERE sent_at IS NULL AND org_id = (SELECT %(org_id)s::text)
      AND payload ->> 'run_id' = ANY (%(run_ids)s::text[])
    RETURNING 1
), gone AS (
    -- by runs_pkey: "finished" is compared with a value the planner does not see, since a
    -- literal `IS NOT NULL` let its generic plan read the organisation's every finished run
    -- through runs_finished and filter on the batch (tests/integration/test_batch_plans.py)
    DELETE FROM runs
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = ANY (%(run_ids)s::text[])
      AND finished_at IS DISTINCT FROM (SELECT NULL::timestamptz)
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS runs, (SELECT count(*) FROM st) AS steps,
       (SELECT count(*) FROM hist) AS history, (SELECT count(*) FROM tm) AS timers,
       (SELECT count(*) FROM eff) AS effects, (SELECT count(*) FROM ap) AS approvals,
       (SELECT count(*) FROM sg) AS signals, (SELECT count(*) FROM co) AS correlations,
       (SELECT count(*) FROM charges) + (SELECT count(*) FROM reservations) AS budget_rows,
       (SELECT count(*) FROM slots) + (SELECT count(*) FROM bookings) AS limit_rows,
       (SELECT count(*) FROM wakes) AS outbox;

-- name: oldest_by_org
-- For doctor: per organisation with finished runs, the oldest one and the bound in force
-- (the first entry of runs_finished per organisation), oldest first.
SELECT o.org_id, f.oldest,
       extract(epoch FROM now() - f.oldest)::float8 / 86400 AS age_days,
       coalesce(o.retention_days, %(default_days)s::float8) AS days
FROM organisations o
CROSS JOIN LATERAL (
    SELECT min(finished_at) AS oldest FROM runs
    WHERE runs.org_id = o.org_id AND runs.finished_at IS NOT NULL
) AS f
WHERE f.oldest IS NOT NULL
ORDER BY f.oldest
LIMIT %(limit)s;
