-- Timers (R6, R7): a timer row stores what was asked (intent) and the computed UTC instant
-- (due_at). It is fired exactly once, by whichever comes first: its delayed wake job (fast
-- path) or the due sweep (backstop). fired_at IS NULL is the claim.

-- name: fire
-- Fire the given timers if still unfired: the waiting step becomes ready (woken by the timer),
-- the run active, and an outbox row wakes a worker of the step's lane. Idempotent: a duplicate
-- wake or a timer already fired by the sweep changes nothing. The timers are locked in one
-- order with SKIP LOCKED, so a wake and the sweep firing at the same moment never wait on each
-- other (one of them fires each timer; the sweep's own locks do not block its own fire).
WITH picked AS (
    SELECT t.org_id, t.timer_id
    FROM timers t
    JOIN unnest(%(org_ids)s::text[], %(timer_ids)s::bigint[]) AS x(org_id, timer_id)
      ON t.org_id = x.org_id AND t.timer_id = x.timer_id
    WHERE t.fired_at IS NULL
    ORDER BY t.org_id, t.timer_id
    FOR UPDATE OF t SKIP LOCKED
),
f AS (
    UPDATE timers t SET fired_at = now(), fired_by = %(by)s
    FROM picked p
    WHERE t.org_id = p.org_id AND t.timer_id = p.timer_id
    RETURNING t.org_id, t.timer_id, t.run_id, t.seq, t.due_at, t.fired_at
),
to_ready AS (
    SELECT f.org_id, f.run_id, f.seq, 'waiting' AS from_status, NULL::int AS attempt,
           now() AS available_at,
           jsonb_build_object('by', 'timer', 'timer_id', f.timer_id, 'due_at', f.due_at) AS wake,
           NULL::jsonb AS error, 'timer_fired' AS event, NULL::text AS worker,
           jsonb_build_object('timer_id', f.timer_id, 'by', %(by)s::text, 'due_at', f.due_at,
                              'lateness_ms',
                              round(extract(epoch FROM f.fired_at - f.due_at) * 1000)::bigint)
               AS detail
    FROM f
),
{{make_ready}},
run AS (
    UPDATE runs r SET status = 'active', updated_at = now()
    FROM ready WHERE r.org_id = ready.org_id AND r.run_id = ready.run_id AND r.status = 'waiting'
)
SELECT f.org_id, f.timer_id, f.run_id,
       extract(epoch FROM f.fired_at - f.due_at)::float8 AS lateness_s,
       ready.lane
FROM f LEFT JOIN ready ON ready.org_id = f.org_id AND ready.run_id = f.run_id
                      AND ready.seq = f.seq;
