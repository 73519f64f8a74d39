-- Timers (R6, R7): a timer row stores what was asked (intent) and the computed UTC instant
-- (due_at). It is fired exactly once, by whichever comes first: its delayed wake job (fast
-- path) or the due sweep (backstop). fired_at IS NULL is the claim.

-- name: fire
-- Fire the given timers if still unfired: the waiting step becomes ready (woken by the timer),
-- the run active, and an outbox row wakes a worker of the step's lane. Idempotent: a duplicate
-- wake or a timer already fired by the sweep changes nothing.
WITH f AS (
    UPDATE timers t SET fired_at = now(), fired_by = %(by)s
    FROM unnest(%(org_ids)s::text[], %(timer_ids)s::bigint[]) AS x(org_id, timer_id)
    WHERE t.org_id = x.org_id AND t.timer_id = x.timer_id AND t.fired_at IS NULL
    RETURNING t.org_id, t.timer_id, t.run_id, t.seq, t.due_at, t.fired_at
),
s AS (
    UPDATE steps st
    SET status = 'ready', wait_kind = NULL, available_at = now(), updated_at = now(),
        wake = jsonb_build_object('by', 'timer', 'timer_id', f.timer_id, 'due_at', f.due_at)
    FROM f
    WHERE st.org_id = f.org_id AND st.run_id = f.run_id AND st.seq = f.seq
      AND st.status = 'waiting'
    RETURNING st.org_id, st.run_id, st.seq, st.step_id, st.lane, st.attempt
),
run AS (
    UPDATE runs r SET status = 'active', updated_at = now()
    FROM s WHERE r.org_id = s.org_id AND r.run_id = s.run_id AND r.status = 'waiting'
),
wake AS (
    INSERT INTO outbox (org_id, topic, job_id, lane, payload)
    SELECT org_id, 'step', 'wake:' || run_id || ':' || seq || ':' || (attempt + 1), lane,
           jsonb_build_object('run_id', run_id, 'seq', seq)
    FROM s
),
hist AS (
    INSERT INTO history (org_id, run_id, event, seq, step_id, detail)
    SELECT f.org_id, f.run_id, 'timer_fired', f.seq, s.step_id,
           jsonb_build_object('timer_id', f.timer_id, 'by', %(by)s::text, 'due_at', f.due_at,
                              'lateness_ms',
                              round(extract(epoch FROM f.fired_at - f.due_at) * 1000)::bigint)
    FROM f LEFT JOIN s ON s.org_id = f.org_id AND s.run_id = f.run_id AND s.seq = f.seq
)
SELECT f.org_id, f.timer_id, f.run_id,
       extract(epoch FROM f.fired_at - f.due_at)::float8 AS lateness_s,
       s.lane
FROM f LEFT JOIN s ON s.org_id = f.org_id AND s.run_id = f.run_id AND s.seq = f.seq;

-- name: lateness
-- Timer lateness (fired_at - due_at) of fired timers, for measurements (R18).
SELECT fired_by, extract(epoch FROM fired_at - due_at)::float8 AS lateness_s
FROM timers
WHERE org_id = ANY(%(org_ids)s) AND fired_at IS NOT NULL AND fired_at >= %(since)s;
