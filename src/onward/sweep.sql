-- The due sweep (R7): fires due timers whatever happened to their wake jobs, fairly between
-- organisations, at a cost that does not grow with the backlog.

-- name: due_candidates
-- A bounded, rotated set of organisations with due work: who was served longest ago leads.
-- Served by the partial index organisations_due; never a scan of every tenant.
SELECT org_id FROM organisations
WHERE has_due_work
ORDER BY last_timer_served_at NULLS FIRST, org_id
LIMIT %(orgs)s;

-- name: claim_due
-- For each candidate organisation a bounded index scan on timers_due (org_id, due_at), locking
-- with SKIP LOCKED so two sweepers never claim the same timer, then an overall batch limit.
SELECT t.org_id, t.timer_id
FROM unnest(%(org_ids)s::text[]) AS o(org_id)
CROSS JOIN LATERAL (
    SELECT timers.org_id, timers.timer_id, timers.due_at
    FROM timers
    WHERE timers.org_id = o.org_id AND timers.fired_at IS NULL AND timers.due_at <= now()
    ORDER BY timers.due_at
    LIMIT %(per_org)s
    FOR UPDATE SKIP LOCKED
) AS t
ORDER BY t.org_id, t.due_at
LIMIT %(batch)s;

-- name: mark_served
-- Rotate: organisations that contributed work go to the back of the line; every examined
-- organisation keeps has_due_work only while it still has a due, unfired timer. A timer written
-- concurrently may be missed here; rediscover (next) finds it on the following tick.
UPDATE organisations o
SET last_timer_served_at = CASE WHEN o.org_id = ANY(%(served)s::text[]) THEN now()
                                ELSE o.last_timer_served_at END,
    has_due_work = EXISTS (SELECT 1 FROM timers t
                           WHERE t.org_id = o.org_id AND t.fired_at IS NULL AND t.due_at <= now())
WHERE o.org_id = ANY(%(org_ids)s::text[]);

-- name: rediscover
-- Organisations whose future timers have come due (or whose flag lost a race) rejoin the
-- candidate set. One page of organisations per tick, by org_id keyset, each an index probe on
-- timers_due: the cost depends on the page size, never on the number of timers.
WITH page AS (
    SELECT org_id FROM organisations
    WHERE org_id > %(after)s AND NOT has_due_work
    ORDER BY org_id
    LIMIT %(limit)s
),
flagged AS (
    UPDATE organisations o SET has_due_work = true
    FROM page
    WHERE o.org_id = page.org_id
      AND EXISTS (SELECT 1 FROM timers t
                  WHERE t.org_id = o.org_id AND t.fired_at IS NULL AND t.due_at <= now())
    RETURNING o.org_id
)
SELECT (SELECT max(org_id) FROM page) AS last_org, (SELECT count(*) FROM page) AS examined,
       (SELECT count(*) FROM flagged) AS flagged;

-- name: org_page
-- A page of organisations by keyset, for the budget check of waiting runs.
SELECT org_id FROM organisations WHERE org_id > %(after)s ORDER BY org_id LIMIT %(limit)s;

-- name: waiting_over_age
-- Waiting or parked runs past their maximum age (R13): nothing would ever claim them to check.
SELECT r.org_id, r.run_id, r.current_seq AS seq
FROM unnest(%(org_ids)s::text[]) AS o(org_id)
CROSS JOIN LATERAL (
    SELECT runs.org_id, runs.run_id, runs.current_seq FROM runs
    WHERE runs.org_id = o.org_id AND runs.status IN ('waiting', 'parked')
      AND runs.deadline_at < now()
    LIMIT %(limit)s
) AS r;

-- name: expire_waiting_run
-- End a waiting/parked run that outlived its budget: its step is cancelled, its timers dropped.
-- Each fence compares with values the planner does not see (`(SELECT ...)`): literal ones let
-- it read a whole partial index their predicate implies -- runs_waiting_deadline (the
-- organisation's every waiting run), steps_one_unfinished and timers_due (every unfinished
-- step, every pending timer) -- whenever its statistics call that index nearly empty, instead
-- of this one run's rows by their keys (tests/integration/test_batch_plans.py).
WITH run AS (
    UPDATE runs SET status = 'exceeded', status_reason = %(reason)s, finished_at = now(),
                    updated_at = now()
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
      AND status = ANY ((SELECT ARRAY['waiting', 'parked'])::text[])
    RETURNING org_id, run_id
),
st AS (
    UPDATE steps s SET status = 'cancelled', finished_at = now(), updated_at = now()
    FROM run WHERE s.org_id = run.org_id AND s.run_id = run.run_id
      AND s.status = ANY ((SELECT ARRAY['waiting', 'parked', 'ready'])::text[])
),
tm AS (
    UPDATE timers t SET fired_at = now(), fired_by = 'cancelled'
    FROM run WHERE t.org_id = run.org_id AND t.run_id = run.run_id
      AND t.fired_at IS NOT DISTINCT FROM (SELECT NULL::timestamptz)
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, worker, detail)
    SELECT org_id, run_id, 'run_exceeded', %(worker)s, jsonb_build_object('reason', %(reason)s::text)
    FROM run
)
SELECT count(*) AS expired FROM run;
